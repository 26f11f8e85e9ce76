package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// eventually retries check until it reports true or 5 s have passed: for
// what crosses nodes or the once-a-second report.
func eventually(tb testing.TB, what string, check func() bool) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !check() {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// countingUpstream answers every request with a body naming its number; a
// path ending in /fail answers 500, one ending in /slow waits for release,
// one ending in /slowfail waits, then answers 500.
type countingUpstream struct {
	hits    atomic.Int64
	release chan struct{}
	srv     *httptest.Server
}

func newCountingUpstream(tb testing.TB) *countingUpstream {
	u := &countingUpstream{release: make(chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.hits.Add(1)
		switch filepath.Base(r.URL.Path) {
		case "slow":
			<-u.release
		case "slowfail":
			<-u.release
			w.WriteHeader(http.StatusInternalServerError)
			return
		case "fail":
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, `{"hit": %d}`, n)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("ETag", fmt.Sprintf(`"h%d"`, n))
		w.Header().Set("Set-Cookie", "s=1")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"hit": %d}`, n)
	}))
	tb.Cleanup(u.srv.Close)
	return u
}

// upstreamStack is a stack whose route /api/up/ (cost 1, refund_on_5xx)
// proxies to a counting upstream, and a tenant's key on a tier of the
// given daily quota. Start its API nodes with s.start().
func upstreamStack(t *testing.T, daily int64) (*countingUpstream, *stack, string) {
	t.Helper()
	up := newCountingUpstream(t)
	s := mustStack(t)
	s.upstreamRoutes(t, up.srv.URL)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(daily)})
	_, key := s.tenant(tier.Slug)
	return up, s, key
}

func (s *stack) upstreamRoutes(tb testing.TB, upstream string) {
	s.routes = filepath.Join(tb.TempDir(), "routes.json")
	table := fmt.Sprintf(`{"routes": [
		{"method": "*", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": %q, "timeout": "5s", "refund_on_5xx": true}
	]}`, upstream+"/v1/")
	if err := os.WriteFile(s.routes, []byte(table), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// Point 11: one Idempotency-Key is no free pass. Ten calls with one key on
// a 3-unit quota reach the upstream once and get the same answer; another
// request under the key is 422; a repeat in flight is 409; a refunded call
// releases its key.
func TestIdempotencyKeyReplaysTheStoredAnswer(t *testing.T) {
	t.Parallel()
	up, s, key := upstreamStack(t, 3)
	base := s.start()

	first := do(t, "POST", base+"/api/up/orders", key, `{"n":1}`, "Idempotency-Key", "order-1")
	if first.status != http.StatusCreated {
		t.Fatalf("first: status %d %s, want 201", first.status, first.body)
	}
	for i := range 9 {
		r := do(t, "POST", base+"/api/up/orders", key, `{"n":1}`, "Idempotency-Key", "order-1")
		if r.status != first.status || !bytes.Equal(r.body, first.body) || r.header.Get("ETag") != first.header.Get("ETag") ||
			r.header.Get("Content-Type") != first.header.Get("Content-Type") {
			t.Fatalf("repeat %d: %d %s %v, want the first answer %d %s", i, r.status, r.body, r.header, first.status, first.body)
		}
		if r.header.Get("Idempotent-Replayed") != "true" || r.header.Get("Set-Cookie") != "" {
			t.Fatalf("repeat %d: headers %v, want Idempotent-Replayed and no Set-Cookie", i, r.header)
		}
	}
	if got := up.hits.Load(); got != 1 {
		t.Fatalf("upstream called %d times, want 1", got)
	}
	if got := remaining(t, do(t, "POST", base+"/api/up/orders", key, `{"n":2}`, "Idempotency-Key", "order-2").header)["daily"]; got != 1 {
		t.Fatalf("daily remaining after 10 calls with one key and one with another: %d, want 1", got)
	}

	for _, other := range []struct{ method, path, body string }{
		{"POST", "/api/up/orders", `{"n":9}`}, {"PUT", "/api/up/orders", `{"n":1}`}, {"POST", "/api/up/other", `{"n":1}`},
	} {
		r := do(t, other.method, base+other.path, key, other.body, "Idempotency-Key", "order-1")
		if r.status != http.StatusUnprocessableEntity || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s %s under a used key: %d %s, want 422 problem", other.method, other.path, other.body, r.status, r.body)
		}
	}

	// In flight: the first of key order-3 waits upstream.
	slow := make(chan reply, 1)
	go func() {
		slow <- do(t, "POST", base+"/api/up/slow", key, "", "Idempotency-Key", "order-3")
	}()
	eventually(t, "the slow request reaches the upstream", func() bool { return up.hits.Load() == 3 })
	if r := do(t, "POST", base+"/api/up/slow", key, "", "Idempotency-Key", "order-3"); r.status != http.StatusConflict {
		t.Errorf("repeat in flight: %d %s, want 409", r.status, r.body)
	}
	close(up.release)
	if r := <-slow; r.status != http.StatusCreated {
		t.Fatalf("slow first: %d %s", r.status, r.body)
	}
	if got := up.hits.Load(); got != 3 {
		t.Fatalf("upstream hits after the 409: %d, want 3", got)
	}
	if r := do(t, "GET", base+"/v1/usage", key, ""); r.status != 200 {
		t.Fatal(r.status)
	}
}

// Point 11: a refunded call gives its key back: a retry runs again.
func TestIdempotencyKeyReleasedByARefund(t *testing.T) {
	t.Parallel()
	up, s, key := upstreamStack(t, 10)
	base := s.start()
	for i := range 2 {
		r := do(t, "POST", base+"/api/up/fail", key, "", "Idempotency-Key", "k")
		if r.status != 500 || r.header.Get("Tollgate-Refunded") != "1" || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("call %d: %d %v, want a refunded 500 that ran", i, r.status, r.header)
		}
	}
	if got := up.hits.Load(); got != 2 {
		t.Fatalf("upstream hits: %d, want 2 (the refund released the key)", got)
	}
}

// Point 11: replays still pass the burst limits.
func TestIdempotentReplaysPassTheBurstLimit(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(1, quota.Limits{BurstRate: quota.Ptr(0.001), Burst: quota.Ptr(int64(2))})
	_, key := s.tenant(tier.Slug)
	base := s.start()
	var statuses []int
	for range 3 {
		statuses = append(statuses, do(t, "GET", base+"/api/demo/echo", key, "", "Idempotency-Key", "same").status)
	}
	if statuses[0] != 200 || statuses[1] != 200 || statuses[2] != 429 {
		t.Fatalf("statuses %v, want [200 200 429]: a replay is still load", statuses)
	}
}

// Point 5: every refusal is counted, the deny cache's too.
func TestDenyCacheRefusalsAreCounted(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1))})
	_, key := s.tenant(tier.Slug)
	base := s.start()
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
		t.Fatal(r.status)
	}
	for i := range 7 {
		if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 429 {
			t.Fatalf("call %d: %d, want 429", i, r.status)
		}
	}
	rejected := func() float64 {
		var u struct {
			Daily []struct{ Rejected float64 } `json:"daily"`
		}
		r := do(t, "GET", base+"/v1/usage", key, "")
		mustDecode(t, r.body, &u)
		var n float64
		for _, d := range u.Daily {
			n += d.Rejected
		}
		return n
	}
	eventually(t, "7 refusals in /v1/usage", func() bool { return rejected() == 7 })
}

// Point 4: an upgrade leaves no burst debt of the old tier.
func TestUpgradeLeavesNoBurstDebt(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	slow := s.tier(1, quota.Limits{BurstRate: quota.Ptr(0.001), Burst: quota.Ptr(int64(1)),
		BucketCapacity: quota.Ptr(int64(1)), BucketRefillPerSec: quota.Ptr(0.001)})
	fast := s.tier(2, quota.Limits{BurstRate: quota.Ptr(100.0), Burst: quota.Ptr(int64(10)),
		BucketCapacity: quota.Ptr(int64(100)), BucketRefillPerSec: quota.Ptr(100.0)})
	tenant, key := s.tenant(slow.Slug)
	base := s.start()
	do(t, "GET", base+"/api/demo/echo", key, "")
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 429 || r.header.Get("Retry-After") != "1000" {
		t.Fatalf("slow tier: %d Retry-After %q, want 429 after 1000 s", r.status, r.header.Get("Retry-After"))
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"tier": "`+fast.Slug+`"}`); r.status != 200 {
		t.Fatalf("tier change: %d %s", r.status, r.body)
	}
	// The new limits' worst case: one interval of 10 ms.
	r := do(t, "GET", base+"/api/demo/echo", key, "")
	if r.status == 429 {
		if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra > 1 {
			t.Fatalf("after the upgrade: Retry-After %d, want at most 1 s", ra)
		}
		time.Sleep(20 * time.Millisecond)
		r = do(t, "GET", base+"/api/demo/echo", key, "")
	}
	if r.status != 200 {
		t.Fatalf("after the upgrade: %d %s, want 200", r.status, r.body)
	}
}

// Point 6: the deny cache does not outlive its reason: a tier edit that
// raises the quota frees every node's refused tenants.
func TestTierEditClearsDenyCacheOnEveryNode(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1))})
	_, key := s.tenant(tier.Slug)
	a, b := s.start(), s.start()
	do(t, "GET", a+"/api/demo/echo", key, "")
	for _, base := range []string{a, b} {
		for range 2 {
			if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 429 {
				t.Fatalf("%s: %d, want 429", base, r.status)
			}
		}
	}
	if r := admin(t, "PATCH", a+"/admin/v1/tiers/"+tier.Slug, `{"daily_quota": 100}`); r.status != 200 {
		t.Fatalf("tier edit: %d %s", r.status, r.body)
	}
	eventually(t, "node b admits after the tier edit", func() bool {
		return do(t, "GET", b+"/api/demo/echo", key, "").status == 200
	})
	if r := do(t, "GET", a+"/api/demo/echo", key, ""); r.status != 200 {
		t.Fatalf("node a after the tier edit: %d, want 200", r.status)
	}
}

// Point 6: a refund that frees room frees the refused tenant on every node.
func TestRefundClearsDenyCacheOnEveryNode(t *testing.T) {
	t.Parallel()
	up, s, key := upstreamStack(t, 1)
	a, b := s.start(), s.start()
	// The slow call holds the day's one unit, then fails and is refunded.
	slow := make(chan reply, 1)
	go func() { slow <- do(t, "GET", a+"/api/up/x/slowfail", key, "") }()
	eventually(t, "the slow call reaches the upstream", func() bool { return up.hits.Load() == 1 })
	for _, base := range []string{a, b} {
		for range 2 { // the second answer comes from the deny cache
			if r := do(t, "GET", base+"/api/up/ok", key, ""); r.status != 429 {
				t.Fatalf("%s while the unit is held: %d, want 429", base, r.status)
			}
		}
	}
	close(up.release)
	if r := <-slow; r.status != 500 || r.header.Get("Tollgate-Refunded") != "1" {
		t.Fatalf("slow call: %d %v, want a refunded 500", r.status, r.header)
	}
	eventually(t, "node b admits after the refund on node a", func() bool {
		return do(t, "GET", b+"/api/up/ok", key, "").status == http.StatusCreated
	})
}

// Point 9: every answer rounds a reset the same way (up).
func TestResetTimesAgree(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	// 3 per second: resets fall between whole seconds.
	tier := s.tier(1, quota.Limits{BurstRate: quota.Ptr(3.0), Burst: quota.Ptr(int64(1))})
	_, key := s.tenant(tier.Slug)
	base := s.start()
	do(t, "GET", base+"/api/demo/echo", key, "")
	r := do(t, "GET", base+"/api/demo/echo", key, "")
	if r.status != 429 {
		t.Fatalf("second call: %d, want 429", r.status)
	}
	var problem struct{ Reset string }
	mustDecode(t, r.body, &problem)
	var usage struct {
		Limits []struct{ Name, Reset string } `json:"limits"`
	}
	mustDecode(t, do(t, "GET", base+"/v1/usage", key, "").body, &usage)
	header := r.header.Get("X-RateLimit-Reset")
	body, err := time.Parse(time.RFC3339, problem.Reset)
	if err != nil {
		t.Fatal(err)
	}
	if strconv.FormatInt(body.Unix(), 10) != header {
		t.Errorf("problem reset %s, X-RateLimit-Reset %s: want the same second", problem.Reset, header)
	}
	for _, l := range usage.Limits {
		if l.Name == "burst" && l.Reset != problem.Reset {
			t.Errorf("/v1/usage burst reset %s, problem reset %s: want the same", l.Reset, problem.Reset)
		}
	}
}

func mustDecode(tb testing.TB, body []byte, v any) {
	tb.Helper()
	if err := json.Unmarshal(body, v); err != nil {
		tb.Fatalf("body %q: %v", body, err)
	}
}
