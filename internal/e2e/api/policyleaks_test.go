package api

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// Slots that a request takes until its answer (concurrency leases, an
// adaptive policy's place in flight) are held by nothing that has no
// answer to wait for: a replay of an idempotent request, a /v1/check.

// heldLeases lists the stack's policy keys in Redis that still hold a
// concurrency lease, with the number each holds.
func heldLeases(tb testing.TB, s *stack) map[string]int64 {
	tb.Helper()
	ctx := context.Background()
	rdb := testenv.Redis(tb)
	held := map[string]int64{}
	iter := rdb.Scan(ctx, 0, s.prefix+":pol:*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if rdb.Type(ctx, k).Val() != "zset" {
			continue
		}
		if n := rdb.ZCard(ctx, k).Val(); n > 0 {
			held[k] = n
		}
	}
	if err := iter.Err(); err != nil {
		tb.Fatal(err)
	}
	return held
}

// rawIdempotent sends a metered request with an Idempotency-Key, framed by
// hand as a client repeating it would.
func rawIdempotent(tb testing.TB, base, method, path, key, idem, body string) reply {
	tb.Helper()
	lines := []string{method + " " + path + " HTTP/1.1", "Authorization: Bearer " + key, "Idempotency-Key: " + idem}
	if body != "" {
		lines = append(lines, "Content-Type: application/json", "", body)
	}
	return raw(tb, base, lines...)
}

// twoTenants makes two tenants on one roomy tier of s: the one that
// misbehaves, and one whose service must not suffer from it.
func twoTenants(s *stack) (a quota.Tenant, keyA, keyB string) {
	s.tb.Helper()
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	a, keyA = s.tenant(tier.Slug)
	_, keyB = s.tenant(tier.Slug)
	return a, keyA, keyB
}

// mustServe checks that each key's request, in turn, is answered want.
func mustServe(tb testing.TB, base, method, path, body string, want int, keys ...string) {
	tb.Helper()
	for i, key := range keys {
		if r := do(tb, method, base+path, key, body); r.status != want {
			tb.Fatalf("request %d (%s %s) after the others: %d %s, want %d", i, method, path, r.status, r.body, want)
		}
	}
}

// TestReplayHoldsNoConcurrencyLease: the repeats of an idempotent request
// are answered from the stored answer and hold no lease of a concurrency
// policy, whatever its scope (in the tenant's slot, another slot, the
// node): with a limit of 2 and a lease of 600 s, three requests with one
// key leave both slots free for every tenant, and no lease in Redis.
func TestReplayHoldsNoConcurrencyLease(t *testing.T) {
	t.Parallel()
	for _, scope := range []string{"global", "tenant", "node"} {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			up := newCountingUpstream(t)
			s := mustStack(t)
			s.upstreamRoutes(t, up.srv.URL)
			base := s.start()
			_, keyA, keyB := twoTenants(s)
			mustPolicy(t, base, fmt.Sprintf(`{"name": "two-up", "algorithm": "concurrency", "limit": 2, "lease_seconds": 600,
				"scope": %q, "match": {"meters": ["up"]}}`, scope))
			time.Sleep(1100 * time.Millisecond) // (every node applies a change within 1 s)

			var first reply
			for i := range 3 {
				r := rawIdempotent(t, base, "POST", "/api/up/orders", keyA, "order-1", `{"n":1}`)
				if r.status != 201 || (i > 0 && (r.header.Get("Idempotent-Replayed") != "true" || string(r.body) != string(first.body))) {
					t.Fatalf("request %d with one key: %d %v %s, want 201 (a replay of the first after it)", i, r.status, r.header, r.body)
				}
				if i == 0 {
					first = r
				}
			}
			if held := heldLeases(t, s); len(held) != 0 {
				t.Fatalf("after one request and two replays, leases held in Redis: %v", held)
			}
			// both slots are free, for the tenant that replayed and for
			// every other one
			mustServe(t, base, "POST", "/api/up/orders", `{"n":2}`, 201, keyB, keyA, keyB, keyA)
			if got := up.hits.Load(); got != 5 {
				t.Fatalf("upstream called %d times, want 5 (the replays never reach it)", got)
			}
			if held := heldLeases(t, s); len(held) != 0 {
				t.Fatalf("after every answer, leases held in Redis: %v", held)
			}
		})
	}
}

// TestReplayHoldsNoAdaptiveSlot: the repeats of an idempotent request take
// no place in an adaptive policy's flight: with a max_concurrency of 3, a
// request and three replays of it leave the node serving every tenant.
func TestReplayHoldsNoAdaptiveSlot(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	_, keyA, keyB := twoTenants(s)
	mustPolicy(t, base, `{"name": "shed", "algorithm": "adaptive", "max_concurrency": 3, "target_latency_ms": 60000,
		"scope": "node", "match": {"meters": ["demo"]}}`)
	time.Sleep(1100 * time.Millisecond)

	for i := range 4 {
		r := rawIdempotent(t, base, "GET", "/api/demo/echo", keyA, "echo-1", "")
		if r.status != 200 || (i > 0 && r.header.Get("Idempotent-Replayed") != "true") {
			t.Fatalf("request %d with one key: %d %v %s, want 200 (a replay after the first)", i, r.status, r.header, r.body)
		}
	}
	mustServe(t, base, "GET", "/api/demo/echo", "", 200, keyB, keyA, keyB, keyA, keyB)
}

// TestCheckHoldsNoSlot: /v1/check has no answer to release a slot at, so
// it takes none: counted checks, dry runs and a replayed check leave an
// adaptive policy of max_concurrency 4 and a concurrency policy of limit 1
// on their meter free for every tenant's metered requests, and no lease in
// Redis.
func TestCheckHoldsNoSlot(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tenantA, keyA, keyB := twoTenants(s)
	mustPolicy(t, base, `{"name": "shed", "algorithm": "adaptive", "max_concurrency": 4, "target_latency_ms": 60000,
		"scope": "node", "match": {"meters": ["demo"]}}`)
	mustPolicy(t, base, `{"name": "one-demo", "algorithm": "concurrency", "limit": 1, "lease_seconds": 600,
		"scope": "global", "match": {"meters": ["demo"]}}`)
	time.Sleep(1100 * time.Millisecond)

	checks := []string{
		`{"tenant_id": %q, "meter": "demo"}`,
		`{"tenant_id": %q, "meter": "demo", "cost": 2}`,
		`{"tenant_id": %q, "meter": "demo", "dry_run": true}`,
		`{"tenant_id": %q, "meter": "demo", "idempotency_key": "c-1"}`,
		`{"tenant_id": %q, "meter": "demo", "idempotency_key": "c-1"}`, // replayed
		`{"tenant_id": %q, "meter": "demo"}`,
	}
	var named []string // each check's RateLimit-Policy
	for i, body := range checks {
		body = fmt.Sprintf(body, tenantA.ID)
		r := raw(t, base, "POST /v1/check HTTP/1.1", "Authorization: Bearer "+serviceToken, "Content-Type: application/json", "", body)
		if r.status != 200 || r.json(t)["allowed"] != true {
			t.Fatalf("check %d %s: %d %s, want allowed", i, body, r.status, r.body)
		}
		named = append(named, r.header.Get("RateLimit-Policy"))
	}
	if held := heldLeases(t, s); len(held) != 0 {
		t.Fatalf("after the checks, leases held in Redis: %v", held)
	}
	mustServe(t, base, "GET", "/api/demo/echo", "", 200, keyB, keyA, keyB, keyA, keyB)
	if held := heldLeases(t, s); len(held) != 0 {
		t.Fatalf("after every answer, leases held in Redis: %v", held)
	}
	for i, h := range named {
		if strings.Contains(h, `"one-demo"`) || strings.Contains(h, `"shed"`) {
			t.Fatalf("check %d: RateLimit-Policy %q names a policy that does not apply to checks", i, h)
		}
	}
}

// TestHungUpRequestGivesItsKeyBack: a request with an Idempotency-Key whose
// client hangs up while it waits for its leaky_bucket slot runs nothing and
// has no answer to store: its key is given back at once (a retry runs),
// not held as in flight until the key's lease ends.
func TestHungUpRequestGivesItsKeyBack(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	tenant, key := s.tenant(tier.Slug)
	// the second request of a burst waits 5 s for its slot
	mustPolicy(t, base, `{"name": "shape", "algorithm": "leaky_bucket", "rate": 0.2, "burst": 1, "on_refuse": "queue",
		"max_wait_ms": 60000, "match": {"meters": ["demo"]}}`)
	time.Sleep(1100 * time.Millisecond)
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	ctx := context.Background()
	rdb := testenv.Redis(t)
	records := func() []string {
		keys, err := rdb.Keys(ctx, s.prefix+":v1:{t:"+tenant.ID+"}:idem2:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "GET /api/demo/echo HTTP/1.1\r\nHost: tollgate.test\r\nAuthorization: Bearer "+key+
		"\r\nIdempotency-Key: shaped-1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(4 * time.Second) // (before its slot comes)
	for len(records()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the second request never took its key")
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn.Close() // the client hangs up while its request waits
	for len(records()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the key of a request whose client hung up before it ran is still held: %v", records())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
