package ratelimit

import (
	"context"
	"fmt"

	"github.com/tollgate/tollgate/internal/quota"
)

// policyPreludes are the files that define the policies' algorithms for a
// script: the framework, then the algorithms (see lua/policy.lua).
var policyPreludes = []string{"state.lua", "policy.lua", "policy_windows.lua", "policy_rates.lua"}

var policyRunScript = script(append(append([]string{}, policyPreludes...), "policy_run.lua")...)

// Refusal modes as the scripts take them (lua/policy.lua "how").
const (
	HowReject  = 0
	HowQueue   = 1
	HowShadow  = 2
	HowDegrade = 3
)

// HowOf maps a policy's on_refuse to the scripts' code.
func HowOf(o quota.OnRefuse) int64 {
	switch o {
	case quota.RefuseQueue:
		return HowQueue
	case quota.RefuseShadow:
		return HowShadow
	case quota.RefuseDegrade:
		return HowDegrade
	}
	return HowReject
}

// PolicySpec is one policy instance in a script call: its key, its
// algorithm, what a refusal does, the request's weight and the algorithm's
// parameters (policyalg.Params).
type PolicySpec struct {
	Key    string
	Alg    quota.Algorithm
	How    int64
	Weight int64
	Params [4]int64
}

// PolicyItem is a policy's part of a decision (lua/policy.lua's item).
type PolicyItem struct {
	Outcome   int64 // 1 admitted, 0 refused, 2 refused in shadow, 3 refused: degrade
	Limit     int64
	Remaining int64
	Reset     int64 // absolute us
	Retry     int64 // us; 0 when admitted, -1 never
	Delay     int64 // us before the request proceeds (leaky_bucket queue)
	How       int64
}

// PolicyResult is the answer of RunPolicies.
type PolicyResult struct {
	Allowed  bool
	Now      int64 // us, Redis time (or the explicit now)
	Retry    int64 // us, the longest enforced refusal's; -1 never
	Degraded bool
	Items    []PolicyItem
}

// Policy run modes (lua/policy_run.lua).
const (
	PolicyAdmit   = "admit"
	PolicyDry     = "dry"
	PolicyUndo    = "undo"
	PolicyRelease = "release"
)

// PolicyKey names the key of a policy instance: the policy, and the scope's
// tag and value. tag is the hash tag's content ("t:<tenant id>" for the
// scopes kept with the tenant, so that the admission script reaches them).
func (r *Runner) PolicyKey(tag, policy, value string) string {
	return r.prefix + ":pol:{" + tag + "}:" + policy + ":" + value
}

// RunPolicies decides specs on their own, in one script call (all of them
// in one Redis Cluster slot): in mode PolicyAdmit, every one is committed
// when the enforced and degrade ones all admit; PolicyDry writes nothing;
// PolicyUndo rolls back an admission of the same id, weights and
// parameters; PolicyRelease ends the concurrency leases of id. now is in
// us; 0 means Redis time.
func (r *Runner) RunPolicies(ctx context.Context, mode string, now int64, id string, specs []PolicySpec) (PolicyResult, error) {
	keys := make([]string, len(specs))
	args := make([]any, 0, 5+len(specs)*7)
	args = append(args, r.layout, now, mode, id, len(specs))
	for i, s := range specs {
		keys[i] = s.Key
		args = append(args, string(s.Alg), s.How, s.Weight, s.Params[0], s.Params[1], s.Params[2], s.Params[3])
	}
	res, err := policyRunScript.Run(ctx, r.c, keys, args...).Int64Slice()
	if err != nil {
		return PolicyResult{}, fmt.Errorf("ratelimit: policies: %w", err)
	}
	if mode == PolicyUndo || mode == PolicyRelease {
		return PolicyResult{Allowed: true}, nil
	}
	if len(res) != 4+7*len(specs) {
		return PolicyResult{}, fmt.Errorf("ratelimit: policies: script answered %d values, want %d", len(res), 4+7*len(specs))
	}
	out := PolicyResult{Allowed: res[0] == 1, Now: res[1], Retry: res[2], Degraded: res[3] == 1}
	out.Items = decodePolicyItems(res[4:])
	return out, nil
}

// decodePolicyItems turns policy.lua's items into PolicyItems.
func decodePolicyItems(r []int64) []PolicyItem {
	items := make([]PolicyItem, 0, len(r)/7)
	for i := 0; i+7 <= len(r); i += 7 {
		items = append(items, PolicyItem{Outcome: r[i], Limit: r[i+1], Remaining: r[i+2],
			Reset: r[i+3], Retry: r[i+4], Delay: r[i+5], How: r[i+6]})
	}
	return items
}
