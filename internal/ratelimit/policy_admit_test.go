package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The policies decided with a tenant's limits (admit.lua's policy variant
// and the reservation of other slots): all or nothing, on one server and on
// the 3-master cluster.

func fixedWindow(name string, limit int64, scope quota.Scope, how quota.OnRefuse) *quota.Policy {
	p := &quota.Policy{Name: name, Algorithm: quota.AlgFixedWindow, Limit: i64(limit), WindowSeconds: i64(3600),
		Scope: scope, OnRefuse: how}
	if how == quota.RefuseDegrade {
		p.Fallback = &quota.Fallback{Status: 200, ContentType: "text/plain", Body: "cached"}
	}
	p.Defaults()
	if err := p.Validate(); err != nil {
		panic(err)
	}
	return p
}

// concurrencyPolicy is a concurrency policy of limit with leases of 600 s.
func concurrencyPolicy(name string, limit int64, scope quota.Scope) *quota.Policy {
	p := &quota.Policy{Name: name, Algorithm: quota.AlgConcurrency, Limit: i64(limit), LeaseSeconds: i64(600), Scope: scope}
	p.Defaults()
	if err := p.Validate(); err != nil {
		panic(err)
	}
	return p
}

// policyReq is a request of cost 1 at now with the given policies (their
// values: the tenant for tenant scope, "" for global).
func policyReq(tenant string, now time.Time, n int, daily int64, pols ...*quota.Policy) quota.Request {
	req := quota.Request{TenantID: tenant, Meter: "m", Cost: 1, Now: now,
		Limits:    quota.Limits{DailyQuota: i64(daily)},
		RequestID: fmt.Sprintf("req-%d", n)}
	for _, p := range pols {
		v := tenant
		if p.Scope == quota.ScopeGlobal {
			v = ""
		}
		l, _ := p.LimitFor(v)
		req.Policies = append(req.Policies, quota.PolicyCall{Policy: p, Value: v, Limit: l})
	}
	return req
}

func policyRemaining(tb testing.TB, d quota.Decision, name string) int64 {
	tb.Helper()
	for _, st := range d.Policies {
		if st.Policy.Name == name {
			return st.Remaining
		}
	}
	tb.Fatalf("decision has no item for policy %s: %s", name, fmtDecision(d))
	return 0
}

func dailyRemaining(tb testing.TB, d quota.Decision) int64 {
	tb.Helper()
	l, ok := d.Limit(quota.LimitDaily)
	if !ok {
		tb.Fatalf("no daily item: %s", fmtDecision(d))
	}
	return l.Remaining
}

func TestPolicyAndTierAreAllOrNothing(t *testing.T) {
	t.Parallel()
	t.Run("single", func(t *testing.T) { t.Parallel(); runAllOrNothing(t, testenv.Redis(t)) })
	t.Run("cluster", func(t *testing.T) { t.Parallel(); runAllOrNothing(t, testenv.Cluster(t)) })
}

func runAllOrNothing(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	now := at(t, "2026-05-04T10:00:00Z")
	for _, scope := range []quota.Scope{quota.ScopeTenant, quota.ScopeGlobal} {
		t.Run(string(scope), func(t *testing.T) {
			r, _ := mustRunner(t, c)
			// The tier refuses (daily 3): the policy (limit 10) keeps the
			// room of the refused requests.
			tenant := newTenant()
			pol := fixedWindow("pol-"+testenv.RandomHex(3), 10, scope, quota.RefuseReject)
			for i := range 5 {
				d := mustAdmit(t, r, policyReq(tenant, now, i, 3, pol))
				if d.Allowed != (i < 3) {
					t.Fatalf("request %d: allowed %t, want %t", i, d.Allowed, i < 3)
				}
				if got := policyRemaining(t, d, pol.Name); got != 10-int64(min(i+1, 3)) {
					t.Fatalf("request %d: policy remaining %d, want %d (a refused request consumes none of it)", i, got, 10-min(i+1, 3))
				}
			}
			peek, err := r.PeekPolicies(ctx, policyReq(tenant, now, 99, 3, pol))
			if err != nil {
				t.Fatal(err)
			}
			if len(peek) != 1 || peek[0].Remaining != 7 {
				t.Fatalf("peek after the tier's refusals: %+v, want remaining 7", peek)
			}
			// The policy refuses (limit 2): the tier's quota (daily 10)
			// keeps the room of the refused requests.
			tenant = newTenant()
			pol = fixedWindow("pol-"+testenv.RandomHex(3), 2, scope, quota.RefuseReject)
			for i := range 4 {
				d := mustAdmit(t, r, policyReq(tenant, now, i, 10, pol))
				if d.Allowed != (i < 2) {
					t.Fatalf("request %d: allowed %t, want %t", i, d.Allowed, i < 2)
				}
				if got := dailyRemaining(t, d); got != 10-int64(min(i+1, 2)) {
					t.Fatalf("request %d: daily remaining %d, want %d", i, got, 10-min(i+1, 2))
				}
				if !d.Allowed && !slices.Contains(d.Violated, quota.LimitName(pol.Name)) {
					t.Fatalf("request %d: violated %v, want the policy", i, d.Violated)
				}
				if !d.Allowed && (d.RetryAfter <= 0 || d.RetryAfter > time.Hour) {
					t.Fatalf("request %d: retry %v, want the window's end", i, d.RetryAfter)
				}
			}
		})
	}
}

// TestPolicyOutcomes: a shadow policy refuses nothing and counts; a degrade
// policy answers with its fallback and charges nothing.
func TestPolicyOutcomes(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	ctx := context.Background()
	r, _ := mustRunner(t, c)
	now := at(t, "2026-05-04T10:00:00Z")

	tenant := newTenant()
	shadow := fixedWindow("shadow", 1, quota.ScopeTenant, quota.RefuseShadow)
	for i := range 3 {
		d := mustAdmit(t, r, policyReq(tenant, now, i, 10, shadow))
		if !d.Allowed {
			t.Fatalf("shadow request %d refused: %s", i, fmtDecision(d))
		}
		want := quota.PolicyAdmitted
		if i > 0 {
			want = quota.PolicyShadowRefused
		}
		if d.Policies[0].Outcome != want || len(d.Violated) != 0 {
			t.Fatalf("shadow request %d: outcome %v violated %v, want %v and none", i, d.Policies[0].Outcome, d.Violated, want)
		}
	}
	rows, err := r.Pending(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Requests != 3 || rows[0].ShadowRefused != 2 {
		t.Fatalf("pending %+v, want 3 requests and 2 shadow refusals", rows)
	}

	tenant = newTenant()
	degrade := fixedWindow("degrade", 1, quota.ScopeTenant, quota.RefuseDegrade)
	for i := range 3 {
		d := mustAdmit(t, r, policyReq(tenant, now, i, 10, degrade))
		if (i == 0) != d.Allowed || (i > 0) != (d.Fallback != nil) {
			t.Fatalf("degrade request %d: allowed %t fallback %v", i, d.Allowed, d.Fallback)
		}
		if got := dailyRemaining(t, d); got != 9 {
			t.Fatalf("degrade request %d: daily remaining %d, want 9: a degraded request is not charged", i, got)
		}
	}
	rows, err = r.Pending(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Units != 1 || rows[0].Degraded != 2 || rows[0].Rejected != 0 {
		t.Fatalf("pending %+v, want 1 unit and 2 degraded", rows)
	}
}

// TestReservationUndoesOnlyWhatItCommitted: when the tenant's call refuses,
// the rollback of a reservation gives back the policies that admitted, not
// a shadow one that refused (it committed nothing).
func TestReservationUndoesOnlyWhatItCommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, _ := mustRunner(t, testenv.Redis(t))
	now := at(t, "2026-05-04T10:00:00Z")
	tenant := newTenant()
	shadow := fixedWindow("g-shadow-"+testenv.RandomHex(3), 1, quota.ScopeGlobal, quota.RefuseShadow)
	enforced := fixedWindow("g-enforced-"+testenv.RandomHex(3), 10, quota.ScopeGlobal, quota.RefuseReject)
	if d := mustAdmit(t, r, policyReq(tenant, now, 0, 1, shadow, enforced)); !d.Allowed {
		t.Fatalf("first request refused: %s", fmtDecision(d))
	}
	if d := mustAdmit(t, r, policyReq(tenant, now.Add(time.Second), 1, 1, shadow, enforced)); d.Allowed {
		t.Fatalf("second request admitted past the daily quota: %s", fmtDecision(d))
	}
	got, err := r.PeekPolicies(ctx, policyReq(tenant, now.Add(2*time.Second), 2, 1, shadow, enforced))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Remaining != 0 || got[1].Remaining != 9 {
		t.Fatalf("after the rollback: %+v, want the shadow policy still full (0 left) and the enforced one at 9", got)
	}
}

// TestReservedPolicyOutcomesAreCounted: the shadow refusals and degraded
// requests of policies in other slots (global) are counted in the
// tenant's pending usage like those of its own slot.
func TestReservedPolicyOutcomesAreCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, _ := mustRunner(t, testenv.Redis(t))
	now := at(t, "2026-05-04T10:00:00Z")
	for _, how := range []quota.OnRefuse{quota.RefuseShadow, quota.RefuseDegrade} {
		tenant := newTenant()
		pol := fixedWindow("g-"+string(how)+"-"+testenv.RandomHex(3), 1, quota.ScopeGlobal, how)
		for i := range 3 {
			d := mustAdmit(t, r, policyReq(tenant, now, i, 10, pol))
			if want := i == 0 || how == quota.RefuseShadow; d.Allowed != want {
				t.Fatalf("%s request %d: allowed %t, want %t", how, i, d.Allowed, want)
			}
			if how == quota.RefuseDegrade && i > 0 && (d.Fallback == nil || len(d.Violated) != 0) {
				t.Fatalf("degrade request %d: fallback %v violated %v", i, d.Fallback, d.Violated)
			}
		}
		rows, err := r.Pending(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		want := quota.PendingRow{Hour: now.Truncate(time.Hour), Meter: "m", Units: 3, Requests: 3, ShadowRefused: 2}
		if how == quota.RefuseDegrade {
			want = quota.PendingRow{Hour: now.Truncate(time.Hour), Meter: "m", Units: 1, Requests: 1, Degraded: 2}
		}
		if len(rows) != 1 || rows[0] != want {
			t.Fatalf("%s: pending %+v, want %+v", how, rows, want)
		}
	}
}

// TestEveryReservedGroupReports: when one slot's reservation refuses, the
// policies of the other slots still appear in the answer (read, not
// reserved), and the wait suffices for each refusing one.
func TestEveryReservedGroupReports(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, _ := mustRunner(t, testenv.Redis(t))
	now := at(t, "2026-05-04T10:00:00Z")
	tenant := newTenant()
	first := fixedWindow("g-first-"+testenv.RandomHex(3), 1, quota.ScopeGlobal, quota.RefuseReject)
	second := &quota.Policy{Name: "g-second-" + testenv.RandomHex(3), Algorithm: quota.AlgFixedWindow,
		Limit: i64(5), WindowSeconds: i64(86400), Scope: quota.ScopeGlobal}
	second.Defaults()
	if d := mustAdmit(t, r, policyReq(tenant, now, 0, 10, first, second)); !d.Allowed {
		t.Fatalf("first request refused: %s", fmtDecision(d))
	}
	d := mustAdmit(t, r, policyReq(tenant, now, 1, 10, first, second))
	if d.Allowed || len(d.Policies) != 2 {
		t.Fatalf("second request: allowed %t with %d policy items, want refused with both", d.Allowed, len(d.Policies))
	}
	if got := policyRemaining(t, d, second.Name); got != 4 {
		t.Fatalf("the unrefusing policy reports %d left, want 4 (as it is: one admission)", got)
	}
	if d.RetryAfter < 50*time.Minute {
		t.Fatalf("retry %v, want the hour window's end (50 min away)", d.RetryAfter)
	}
	got, err := r.PeekPolicies(ctx, policyReq(tenant, now, 2, 10, first, second))
	if err != nil {
		t.Fatal(err)
	}
	if got[1].Remaining != 4 {
		t.Fatalf("after the refusal the second policy has %d left, want 4: nothing reserved", got[1].Remaining)
	}
}

// TestReplayTakesNoConcurrencyLease: a replay is decided by its policies
// and spends their rate limits (it is load), but takes no concurrency
// lease, in the tenant's slot (admit.lua) or another (a reservation given
// back): with a limit of 1, a request and two replays of it leave the
// slot free and no lease in Redis, on one server and on the cluster.
func TestReplayTakesNoConcurrencyLease(t *testing.T) {
	t.Parallel()
	t.Run("single", func(t *testing.T) { t.Parallel(); runReplayTakesNoLease(t, testenv.Redis(t)) })
	t.Run("cluster", func(t *testing.T) { t.Parallel(); runReplayTakesNoLease(t, testenv.Cluster(t)) })
}

func runReplayTakesNoLease(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	r, prefix := mustRunner(t, c)
	now := at(t, "2026-05-04T10:00:00Z")
	for _, scope := range []quota.Scope{quota.ScopeTenant, quota.ScopeGlobal} {
		t.Run(string(scope), func(t *testing.T) {
			tenant := newTenant()
			one := concurrencyPolicy("one-"+testenv.RandomHex(3), 1, scope)
			rate := fixedWindow("rate-"+testenv.RandomHex(3), 10, scope, quota.RefuseReject)
			idem := func(n int) quota.Request {
				req := policyReq(tenant, now.Add(time.Duration(n)*time.Second), n, 100, one, rate)
				req.IdempotencyKey, req.IdempotencyFingerprint, req.IdempotencyLease = "k", "fp", time.Minute
				req.IdempotencyClaim = "c-k"
				return req
			}
			// (the room of its record, as the Gate claims it before an admission)
			if _, err := r.ClaimAnswer(ctx, idem(0), false); err != nil {
				t.Fatal(err)
			}
			first := mustAdmit(t, r, idem(0))
			if !first.Allowed || first.Replayed() {
				t.Fatalf("first request: %s", fmtDecision(first))
			}
			if _, err := r.StoreAnswer(ctx, idem(0), quota.StoredAnswer{Status: 200, Body: []byte("ok")}); err != nil {
				t.Fatal(err)
			}
			if err := r.ReleasePolicies(ctx, idem(0)); err != nil {
				t.Fatal(err)
			}
			for n := 1; n <= 2; n++ {
				d := mustAdmit(t, r, idem(n))
				if !d.Allowed || !d.Replayed() {
					t.Fatalf("replay %d: %s", n, fmtDecision(d))
				}
				// the lease's room as it is; the rate limit spent
				if got := policyRemaining(t, d, one.Name); got != 1 {
					t.Fatalf("replay %d: %s remaining %d, want 1 (no lease taken)", n, one.Name, got)
				}
				if got := policyRemaining(t, d, rate.Name); got != int64(9-n) {
					t.Fatalf("replay %d: %s remaining %d, want %d (a replay is load)", n, rate.Name, got, 9-n)
				}
			}
			for _, k := range mustKeys(t, c, prefix) {
				// (the policies' keys: the idempotency room's claims are
				// a sorted set too, and hold the stored answer's claim)
				if strings.Contains(k, ":pol:") && c.Type(ctx, k).Val() == "zset" {
					if m := c.ZRange(ctx, k, 0, -1).Val(); len(m) > 0 {
						t.Fatalf("after a request and two replays, %s holds leases %v", k, m)
					}
				}
			}
			next := policyReq(tenant, now.Add(3*time.Second), 3, 100, one, rate)
			if d := mustAdmit(t, r, next); !d.Allowed {
				t.Fatalf("a new request after the replays: %s", fmtDecision(d))
			}
			if err := r.ReleasePolicies(ctx, next); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAbandonedAdmissionLeavesNoLease: a caller whose context ends while
// its admission runs (a queued request whose client hung up) is either
// refused before anything is sent, or told the admission's outcome, so
// that it releases the concurrency lease the tenant's script took: no
// admission is left to take a lease that nobody learns of.
func TestAbandonedAdmissionLeavesNoLease(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	now := at(t, "2026-05-04T10:00:00Z")
	tenant := newTenant()
	pol := concurrencyPolicy("cc-"+testenv.RandomHex(3), 1000, quota.ScopeTenant)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	told := 0
	for n := range 40 {
		req := policyReq(tenant, now, n, 1000, pol)
		d, err := r.Admit(gone, req)
		if err != nil {
			continue // nothing the caller could release: nothing may be held
		}
		told++
		if d.Allowed {
			if err := r.ReleasePolicies(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
	}
	// (an admission its caller stopped waiting for would still run: give
	// it the time to)
	time.Sleep(200 * time.Millisecond)
	pattern := r.Prefix() + ":pol:{t:" + tenant + "}:*"
	keys, err := c.Keys(ctx, pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, k := range keys {
		held = append(held, c.ZRange(ctx, k, 0, -1).Val()...)
	}
	if len(held) > 0 {
		t.Fatalf("%d of 40 admissions told their caller; leases left held under %s: %v", told, pattern, held)
	}
	if told == 0 {
		t.Fatal("no admission of 40 was answered: nothing was tested")
	}
}
