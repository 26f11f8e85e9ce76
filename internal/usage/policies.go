package usage

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/quota"
)

// Policy is one of a tenant's policies as /v1/usage lists it. Remaining and
// Reset are null for a policy whose state is not the tenant's alone to show
// (see Reader.Policies).
type Policy struct {
	Name      string          `json:"name"`
	Algorithm quota.Algorithm `json:"algorithm"`
	Limit     int64           `json:"limit"`
	Remaining *int64          `json:"remaining"`
	Reset     *string         `json:"reset"`
}

// TierPolicies returns the policies of list that apply to tenants of tier:
// those whose match.tiers is empty or names it. A policy's other match
// fields (meters, path, methods) select requests, not tenants: it is
// listed whatever they say. The result shares list's policies; neither is
// modified.
func TierPolicies(list []quota.Policy, tier string) []quota.Policy {
	var out []quota.Policy
	for _, p := range list {
		if len(p.Match.Tiers) == 0 || slices.Contains(p.Match.Tiers, tier) {
			out = append(out, p)
		}
	}
	return out
}

// Policies returns the state of policies, the policies that apply to p's
// tenant (TierPolicies), in their order, read at admission without
// consuming anything.
//
// Only a policy with one instance for the whole tenant has a state to
// show: scope tenant (the tenant's instance) and global (the one instance
// all tenants share, so its room is theirs together). A policy whose
// instance depends on the request (scope key, ip or param: one per API
// key, client address or value) or on the API node (scope node, and every
// adaptive policy, which lives in each node's memory) is listed with its
// configured limit and a null remaining and reset: no single state is the
// tenant's.
func (r *Reader) Policies(ctx context.Context, p catalog.Principal, policies []quota.Policy) ([]Policy, error) {
	out := make([]Policy, len(policies))
	var calls []quota.PolicyCall
	var at []int // the index in out of each call
	for i := range policies {
		pol := &policies[i]
		out[i] = Policy{Name: pol.Name, Algorithm: pol.Algorithm, Limit: configuredLimit(pol)}
		if !pol.InRedis() {
			continue
		}
		var value string
		switch pol.Scope {
		case quota.ScopeTenant:
			value = p.Tenant.ID
		case quota.ScopeGlobal:
		default: // key, ip, param: one instance per request's value
			continue
		}
		limit, _ := pol.LimitFor(value)
		calls = append(calls, quota.PolicyCall{Policy: pol, Value: value, Limit: limit})
		at = append(at, i)
	}
	// A request carries at most quota.MaxPoliciesPerRequest policies; a
	// tenant may have more (each request matches only some of them).
	for start := 0; start < len(calls); start += quota.MaxPoliciesPerRequest {
		end := min(start+quota.MaxPoliciesPerRequest, len(calls))
		states, err := r.counters.PeekPolicies(ctx, quota.Request{TenantID: p.Tenant.ID, RequestID: "usage",
			Policies: calls[start:end]})
		if err != nil {
			return nil, err
		}
		if len(states) != end-start {
			return nil, fmt.Errorf("usage: %d policy states for %d policies", len(states), end-start)
		}
		for j, st := range states {
			o := &out[at[start+j]]
			remaining, reset := st.Remaining, quota.ResetTime(st.Reset).Format(time.RFC3339)
			o.Limit, o.Remaining, o.Reset = st.Limit, &remaining, &reset
		}
	}
	return out, nil
}

// configuredLimit is a policy's limit as configured, for the policies
// listed without a state: its limit, capacity or burst (LimitFor), the
// steady rate per second of a warm_up (as lua/policy_rates.lua reports
// it), the max_concurrency of an adaptive one.
func configuredLimit(p *quota.Policy) int64 {
	if l, _ := p.LimitFor(""); l > 0 {
		return l
	}
	switch {
	case p.Algorithm == quota.AlgWarmUp && p.Rate != nil:
		return max(1, int64(time.Second/time.Microsecond)/quota.IntervalMicros(*p.Rate))
	case p.Algorithm == quota.AlgAdaptive && p.MaxConcurrency != nil:
		return *p.MaxConcurrency
	}
	return 0
}
