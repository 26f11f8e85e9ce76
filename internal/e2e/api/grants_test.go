package api

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// grants returns the tenant's grants as the admin API lists them.
func grants(tb testing.TB, base, tenantID string) []map[string]any {
	tb.Helper()
	r := do(tb, "GET", base+"/admin/v1/tenants/"+tenantID+"/grants", adminToken, "")
	if r.status != 200 {
		tb.Fatalf("list grants: %d %s", r.status, r.body)
	}
	var out []map[string]any
	for _, it := range r.json(tb)["items"].([]any) {
		out = append(out, it.(map[string]any))
	}
	return out
}

// dailyQuota returns the daily limit (quota + grants) a metered call shows.
func dailyQuota(tb testing.TB, base, key string) string {
	tb.Helper()
	r := do(tb, "GET", base+"/api/demo/echo", key, "")
	if r.status != 200 {
		tb.Fatalf("metered call: %d %s", r.status, r.body)
	}
	for _, item := range strings.Split(r.header.Get("RateLimit-Policy"), ", ") {
		if q, ok := strings.CutPrefix(item, `"daily";q=`); ok {
			return strings.SplitN(q, ";", 2)[0]
		}
	}
	tb.Fatalf("no daily policy in %q", r.header.Get("RateLimit-Policy"))
	return ""
}

// TestGrantRetriedWithTheSameIdempotencyKeyGrantsOnce: a grant retried
// under its Idempotency-Key (in sequence or at once) is answered with the
// grant first recorded and adds nothing, in Postgres or in Redis; the same
// key with another body is 422; keys are scoped per tenant.
func TestGrantRetriedWithTheSameIdempotencyKeyGrantsOnce(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(41, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	tenant, key := s.tenant(tier.Slug)
	other, otherKey := s.tenant(tier.Slug)
	grantURL := func(id string) string { return base + "/admin/v1/tenants/" + id + "/grants" }
	post := func(id, idem, body string) reply {
		return do(t, "POST", grantURL(id), adminToken, body, "Idempotency-Key", idem)
	}

	first := post(tenant.ID, "refund-ticket-1", `{"period": "day", "units": 5}`)
	if first.status != 201 || first.json(t)["applied"] != true {
		t.Fatalf("first grant: %d %s, want 201 applied", first.status, first.body)
	}
	id := first.json(t)["id"]
	for i := range 2 {
		r := post(tenant.ID, "refund-ticket-1", `{"units": 5, "period": "day"}`)
		if r.status != 200 || r.json(t)["id"] != id || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry %d: %d %s (replayed %q), want 200 with grant %v marked replayed", i, r.status, r.body, r.header.Get("Idempotent-Replayed"), id)
		}
	}
	if r := post(tenant.ID, "refund-ticket-1", `{"period": "day", "units": 6}`); r.status != 422 || r.json(t)["field"] != "Idempotency-Key" {
		t.Errorf("same key, other units: %d %s, want 422 naming Idempotency-Key", r.status, r.body)
	}
	if r := post(tenant.ID, "refund-ticket-1", `{"period": "month", "units": 5}`); r.status != 422 {
		t.Errorf("same key, other period: %d %s, want 422", r.status, r.body)
	}
	if r := post(tenant.ID, "bad key", `{"period": "day", "units": 5}`); r.status != 400 || r.json(t)["field"] != "Idempotency-Key" {
		t.Errorf("a key with a space: %d %s, want 400 naming Idempotency-Key", r.status, r.body)
	}
	// The same key for another tenant is another grant.
	if r := post(other.ID, "refund-ticket-1", `{"period": "day", "units": 5}`); r.status != 201 || r.json(t)["id"] == id {
		t.Errorf("the key for another tenant: %d %s, want 201 with a grant of its own", r.status, r.body)
	}

	// Retries racing each other: one grant.
	var wg sync.WaitGroup
	ids := make(chan any, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := post(tenant.ID, "refund-ticket-2", `{"period": "day", "units": 7}`)
			if r.status != 201 && r.status != 200 {
				t.Errorf("concurrent retry: %d %s, want 201 or 200", r.status, r.body)
				return
			}
			ids <- r.json(t)["id"]
		}()
	}
	wg.Wait()
	close(ids)
	seen := map[any]bool{}
	for id := range ids {
		seen[id] = true
	}
	if len(seen) != 1 {
		t.Errorf("concurrent retries answered %d grants, want 1", len(seen))
	}

	if gs := grants(t, base, tenant.ID); len(gs) != 2 {
		t.Errorf("Postgres holds %d grants of the tenant, want 2 (5 and 7 units)", len(gs))
	}
	if got := dailyQuota(t, base, key); got != "112" {
		t.Errorf("daily limit in Redis after the retries: %s, want 112 (100 + 5 + 7)", got)
	}
	if got := dailyQuota(t, base, otherKey); got != "105" {
		t.Errorf("the other tenant's daily limit: %s, want 105", got)
	}
}

// TestGrantMadeWhileRedisIsDownIsAppliedByTheWorkerOnce: a grant made while
// Redis is down is recorded and answered 202, not applied; the worker's
// grants step applies it once Redis is back, and running the step again
// adds nothing.
func TestGrantMadeWhileRedisIsDownIsAppliedByTheWorkerOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustStack(t)
	proc := testenv.StartRedis(t)
	s.redis = proc.URL
	base := s.start()
	tier := s.tier(42, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	tenant, key := s.tenant(tier.Slug)
	if got := dailyQuota(t, base, key); got != "100" {
		t.Fatalf("daily limit before the grant: %s, want 100", got)
	}

	proc.Stop()
	r := do(t, "POST", base+"/admin/v1/tenants/"+tenant.ID+"/grants", adminToken, `{"period": "day", "units": 5}`,
		"Idempotency-Key", "outage-1")
	if r.status != 202 {
		t.Fatalf("grant with Redis down: %d %s, want 202", r.status, r.body)
	}
	if g := r.json(t); g["applied"] != false || !strings.Contains(g["detail"].(string), "worker") || g["units"] != 5.0 {
		t.Fatalf("grant with Redis down: %s, want the grant, applied false and a detail naming the worker", r.body)
	}
	proc.Start()

	rdb := redis.NewClient(&redis.Options{Addr: strings.TrimSuffix(strings.TrimPrefix(proc.URL, "redis://"), "/0")})
	t.Cleanup(func() { _ = rdb.Close() })
	missed := catalog.NewGrants(s.store, quotaredis.New(rdb, s.prefix), s.publisher(), time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for i, want := range []int{1, 0} {
		applied, err := missed.ApplyMissed(ctx)
		if err != nil {
			t.Fatalf("grants step %d: %v", i, err)
		}
		if len(applied) != want {
			t.Errorf("grants step %d applied %d grants, want %d", i, len(applied), want)
		}
	}
	if gs := grants(t, base, tenant.ID); len(gs) != 1 || gs[0]["applied"] != true {
		t.Errorf("grants after the step: %v, want one, applied", gs)
	}
	// A retry of the POST now answers the grant, applied, and adds nothing.
	if r := do(t, "POST", base+"/admin/v1/tenants/"+tenant.ID+"/grants", adminToken, `{"period": "day", "units": 5}`,
		"Idempotency-Key", "outage-1"); r.status != 200 || r.json(t)["applied"] != true {
		t.Errorf("retry after the step: %d %s, want 200 applied", r.status, r.body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := do(t, "GET", base+"/api/demo/echo", key, "")
		if r.status == 200 {
			if !strings.Contains(r.header.Get("RateLimit-Policy"), `"daily";q=105;`) {
				t.Errorf("daily policy after the step: %q, want q=105 (the grant once)", r.header.Get("RateLimit-Policy"))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no metered answer 10 s after Redis came back: %d %s", r.status, r.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
