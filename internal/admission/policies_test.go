package admission

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

func nodePolicy(name string, alg quota.Algorithm, limit int64) *quota.Policy {
	p := &quota.Policy{Name: name, Algorithm: alg, Scope: quota.ScopeNode}
	switch alg {
	case quota.AlgAdaptive:
		p.MaxConcurrency, p.TargetLatencyMS = quota.Ptr(limit), quota.Ptr(int64(1000))
	case quota.AlgConcurrency:
		p.Limit, p.LeaseSeconds = quota.Ptr(limit), quota.Ptr(int64(600))
	default:
		p.Limit, p.WindowSeconds = quota.Ptr(limit), quota.Ptr(int64(3600))
	}
	p.Defaults()
	if err := p.Validate(); err != nil {
		panic(err)
	}
	return p
}

func withPolicies(tenant string, daily int64, n int, pols ...*quota.Policy) quota.Request {
	req := quota.Request{TenantID: tenant, Meter: "m", Cost: 1, Limits: quota.Limits{DailyQuota: quota.Ptr(daily)},
		RequestID: fmt.Sprintf("r%d", n)}
	for _, p := range pols {
		l, _ := p.LimitFor("")
		req.Policies = append(req.Policies, quota.PolicyCall{Policy: p, Limit: l})
	}
	return req
}

// TestNodePoliciesAreAllOrNothingWithRedis: a node policy refuses without
// asking Redis; a Redis refusal rolls the node policy's admission back.
func TestNodePoliciesAreAllOrNothingWithRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, store, _ := mustLiveGate(t)
	tenant := "tn-" + testenv.RandomHex(6)
	pol := nodePolicy("per-node", quota.AlgFixedWindow, 2)
	for i := range 3 {
		before := store.calls.Load()
		d, err := g.Admit(ctx, withPolicies(tenant, 10, i, pol))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i < 2) {
			t.Fatalf("request %d: allowed %t", i, d.Allowed)
		}
		asked := store.calls.Load() - before
		if i == 2 && (asked != 0 || len(d.Violated) != 1 || d.Violated[0] != "per-node" || d.RetryAfter <= 0) {
			t.Fatalf("node refusal: Redis asked %d times, violated %v, retry %v: want 0, [per-node], > 0", asked, d.Violated, d.RetryAfter)
		}
	}

	tenant = "tn-" + testenv.RandomHex(6)
	pol = nodePolicy("per-node-2", quota.AlgFixedWindow, 5)
	for i := range 3 {
		d, err := g.Admit(ctx, withPolicies(tenant, 1, i, pol))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i == 0) {
			t.Fatalf("request %d: allowed %t", i, d.Allowed)
		}
		var st quota.PolicyState
		for _, s := range d.Policies {
			if s.Policy == pol {
				st = s
			}
		}
		if st.Remaining != 4 {
			t.Fatalf("request %d: node policy remaining %d, want 4: a request Redis refused consumes none of it", i, st.Remaining)
		}
	}
}

// TestAdaptivePolicyShedsPastItsFlight: an adaptive policy admits at most
// max_concurrency in flight on the node; a release (the answer's end)
// frees the place, and a request refused elsewhere leaves no place taken.
func TestAdaptivePolicyShedsPastItsFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, _, _ := mustLiveGate(t)
	tenant := "tn-" + testenv.RandomHex(6)
	pol := nodePolicy("shed", quota.AlgAdaptive, 1)
	first := withPolicies(tenant, 100, 0, pol)
	d1, err := g.Admit(ctx, first)
	if err != nil || !d1.Allowed {
		t.Fatalf("first: %v %+v", err, d1)
	}
	d2, err := g.Admit(ctx, withPolicies(tenant, 100, 1, pol))
	if err != nil || d2.Allowed || len(d2.Violated) != 1 || d2.Violated[0] != "shed" {
		t.Fatalf("second while the first is in flight: %v allowed %t violated %v", err, d2.Allowed, d2.Violated)
	}
	if err := g.Release(ctx, first, d1); err != nil {
		t.Fatal(err)
	}
	d3, err := g.Admit(ctx, withPolicies(tenant, 100, 2, pol))
	if err != nil || !d3.Allowed {
		t.Fatalf("after the release: %v allowed %t", err, d3.Allowed)
	}
	if err := g.Release(ctx, withPolicies(tenant, 100, 2, pol), d3); err != nil {
		t.Fatal(err)
	}
	// Redis refuses (daily quota 0 left): the adaptive place is given back
	spent := "tn-" + testenv.RandomHex(6)
	if d, err := g.Admit(ctx, withPolicies(spent, 1, 3, pol)); err != nil || !d.Allowed {
		t.Fatalf("spending the daily quota: %v %+v", err, d)
	} else if err := g.Release(ctx, withPolicies(spent, 1, 3, pol), d); err != nil {
		t.Fatal(err)
	}
	if d, err := g.Admit(ctx, withPolicies(spent, 1, 4, pol)); err != nil || d.Allowed {
		t.Fatalf("past the daily quota: %v allowed %t", err, d.Allowed)
	}
	if d, err := g.Admit(ctx, withPolicies(tenant, 100, 5, pol)); err != nil || !d.Allowed {
		t.Fatalf("the refused request kept its place: %v allowed %t violated %v", err, d.Allowed, d.Violated)
	}
}

// TestReplayHoldsNothingOnTheNode: a replay of an idempotent request is
// decided by the node's policies but gives back its adaptive place and its
// node concurrency lease before it is answered (it runs nothing), reports
// their room as it is, and a Release of it frees no other request's place.
func TestReplayHoldsNothingOnTheNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, _, _ := mustLiveGate(t)
	tenant := "tn-" + testenv.RandomHex(6)
	shed := nodePolicy("shed", quota.AlgAdaptive, 1)
	lease := nodePolicy("one", quota.AlgConcurrency, 1)
	keyed := func(n int) quota.Request {
		req := withPolicies(tenant, 100, n, shed, lease)
		req.IdempotencyKey, req.IdempotencyFingerprint, req.IdempotencyLease = "k", "fp", time.Minute
		// (its claim on the tenant's room, named by the caller as the
		// HTTP layer names it, so that its answer can be stored)
		req.IdempotencyClaim = "claim-" + strconv.Itoa(n)
		return req
	}
	first := keyed(0)
	d, err := g.Admit(ctx, first)
	if err != nil || !d.Allowed || d.Replayed() {
		t.Fatalf("first: %v %+v", err, d)
	}
	if err := g.StoreAnswer(ctx, first, quota.StoredAnswer{Status: 200, Body: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	if err := g.Release(ctx, first, d); err != nil {
		t.Fatal(err)
	}
	var replays []quota.Decision
	for n := 1; n <= 2; n++ {
		d, err := g.Admit(ctx, keyed(n))
		if err != nil || !d.Allowed || !d.Replayed() {
			t.Fatalf("replay %d: %v allowed %t replayed %t violated %v", n, err, d.Allowed, d.Replayed(), d.Violated)
		}
		for _, st := range d.Policies {
			if st.Remaining != 1 {
				t.Fatalf("replay %d: %s remaining %d, want 1 (nothing held)", n, st.Policy.Name, st.Remaining)
			}
		}
		replays = append(replays, d)
	}
	other := withPolicies(tenant, 100, 3, shed, lease)
	if d, err := g.Admit(ctx, other); err != nil || !d.Allowed {
		t.Fatalf("a request after the replays: %v allowed %t violated %v", err, d.Allowed, d.Violated)
	}
	// the replays' Release ends nothing: the other request keeps its place
	for i, d := range replays {
		if err := g.Release(ctx, keyed(i+1), d); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := g.Admit(ctx, withPolicies(tenant, 100, 4, shed, lease)); err != nil || d.Allowed {
		t.Fatalf("while another request is in flight: %v allowed %t, want refused", err, d.Allowed)
	}
}
