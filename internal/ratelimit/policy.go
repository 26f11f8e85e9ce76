package ratelimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/tollgate/tollgate/internal/policyalg"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

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
	return r.Prefix() + ":pol:{" + tag + "}:" + policy + ":" + value
}

// RunPolicies decides specs on their own, in one script call (all of them
// in one Redis Cluster slot): in mode PolicyAdmit, every one is committed
// when the enforced and degrade ones all admit; PolicyDry writes nothing;
// PolicyUndo rolls back an admission of the same id, weights and
// parameters; PolicyRelease ends the concurrency leases of id. A release
// or undo that frees a slot of a full queue policy announces it to every
// node (ListenReleases). now is in us; 0 means Redis time.
func (r *Runner) RunPolicies(ctx context.Context, mode string, now int64, id string, specs []PolicySpec) (PolicyResult, error) {
	keys := make([]string, len(specs))
	args := make([]any, 0, 5+len(specs)*7)
	args = append(args, now, mode, id, len(specs))
	for i, s := range specs {
		keys[i] = s.Key
	}
	args = appendPolicyArgs(args, specs)
	if mode == PolicyRelease || mode == PolicyUndo {
		args = append(args, r.releaseArg) // where a freed slot is announced (releases.go)
	}
	res, err := r.Call(ctx, redisfn.FnPolicyRun, keys, args...).Int64Slice()
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

// appendPolicyArgs appends the POLICY_ARGS groups of specs (lua/policy.lua).
func appendPolicyArgs(args []any, specs []PolicySpec) []any {
	for _, s := range specs {
		args = append(args, string(s.Alg), s.How, s.Weight, s.Params[0], s.Params[1], s.Params[2], s.Params[3])
	}
	return args
}

// inSlot are the policies decided in the tenant's own admission call.
type inSlot struct {
	id    string
	specs []PolicySpec
	calls []int // index in the request's Policies of each spec
	// outside is what the reservations made of the request (admit.lua's
	// ARGV[17]): 'x' refused, 'd' degraded, 's' refused in shadow
	outside string
	leases  bool // a concurrency policy among specs: an admission takes a lease
}

// crossGroup are policies of one other hash slot, decided by a reservation.
type crossGroup struct {
	specs []PolicySpec
	calls []int
	at    int64 // a reservation's time (us): what its undo is given
}

// Key scopes (API.md "Policies"): where a policy instance's key lives.
// tenant, key and param instances carry the tenant's hash tag, so the
// admission script decides them in the same call; global instances share
// one slot per policy, ip instances one per policy and address, decided by
// a reservation (admitWithPolicies). A policy's key holds a digest of its
// algorithm and parameters: an edited policy starts from fresh state (its
// old state expires), so that state written under other parameters is
// never read under new ones.
func (r *Runner) policySpec(req quota.Request, c quota.PolicyCall) (spec PolicySpec, tag string) {
	p := c.Policy
	params := policyalg.ParamsOf(p, c.Limit)
	sum := sha256.Sum256([]byte(string(p.Algorithm) + ":" + strconv.FormatInt(params[0], 10) + ":" +
		strconv.FormatInt(params[1], 10) + ":" + strconv.FormatInt(params[2], 10) + ":" + strconv.FormatInt(params[3], 10)))
	name := p.Name + "." + hex.EncodeToString(sum[:4])
	var value string
	switch p.Scope {
	case quota.ScopeKey:
		tag, value = "t:"+req.TenantID, "k:"+c.Value
	case quota.ScopeParam:
		v := sha256.Sum256([]byte(c.Value)) // bounded length, any bytes
		tag, value = "t:"+req.TenantID, "p:"+hex.EncodeToString(v[:12])
	case quota.ScopeGlobal:
		tag, value = "g:"+p.Name, "g"
	case quota.ScopeIP:
		tag, value = "i:"+p.Name+":"+c.Value, "i"
	default:
		tag, value = "t:"+req.TenantID, "t"
	}
	w := int64(1)
	if p.Cost == quota.CostUnits {
		w = req.Cost
	}
	return PolicySpec{Key: r.PolicyKey(tag, name, value), Alg: p.Algorithm, How: HowOf(p.OnRefuse), Weight: w, Params: params}, tag
}

// splitPolicies sorts the request's Redis policies into those of the
// tenant's slot and groups of other slots (one group per hash tag).
// Node-scoped and adaptive policies are the Gate's, not Redis's.
func (r *Runner) splitPolicies(req quota.Request) (*inSlot, []crossGroup, error) {
	if req.RequestID == "" || len(req.RequestID) > 128 {
		return nil, nil, quota.FieldError("request_id", "policies need a request id of 1 to 128 bytes")
	}
	if len(req.Policies) > quota.MaxPoliciesPerRequest {
		return nil, nil, quota.FieldError("policies", "at most %d policies per request", quota.MaxPoliciesPerRequest)
	}
	in := &inSlot{id: req.RequestID}
	var cross []crossGroup
	byTag := map[string]int{}
	for i, c := range req.Policies {
		if c.Policy == nil || !c.Policy.InRedis() {
			continue
		}
		spec, tag := r.policySpec(req, c)
		if c.Policy.InTenantSlot() {
			in.specs = append(in.specs, spec)
			in.calls = append(in.calls, i)
			in.leases = in.leases || spec.Alg == quota.AlgConcurrency
			continue
		}
		g, ok := byTag[tag]
		if !ok {
			g = len(cross)
			byTag[tag] = g
			cross = append(cross, crossGroup{})
		}
		cross[g].specs = append(cross[g].specs, spec)
		cross[g].calls = append(cross[g].calls, i)
	}
	if len(in.specs) == 0 && len(cross) == 0 {
		in = nil
	}
	return in, cross, nil
}

// admitWithPolicies decides a request that matched policies. Those under
// the tenant's hash tag are decided in its admission call, all or nothing
// with the tier's limits. Those of other slots (global, ip) cannot join a
// script call in Redis Cluster: each slot's group is reserved first (its
// admission written), then the tenant's call decides; when that refuses,
// or a later group refuses, the reservations made are rolled back (undo),
// so that a refused request consumes none of them in the end. Between the
// reservation and its rollback another request may see the reserved room
// as taken: a refusal that, at worst, a retry after Retry-After corrects.
// The tenant's call is told what the reservations made of the request
// (admit.lua's ARGV[18]): it refuses or degrades the request accordingly,
// consuming nothing, and counts it with the rest of its usage.
func (r *Runner) admitWithPolicies(ctx context.Context, req quota.Request, p params, mode, idem string) (quota.Decision, error) {
	in, cross, err := r.splitPolicies(req)
	if err != nil {
		return quota.Decision{}, err
	}
	now := redisfn.Micros(req.Now)
	states := make([]*quota.PolicyState, len(req.Policies))
	var reserved []crossGroup
	undo := func() {
		// (a detached context: the request's may be ending; the rollback
		// must still run)
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, g := range reserved {
			_, _ = r.RunPolicies(uctx, PolicyUndo, g.at, req.RequestID, g.specs)
		}
		reserved = nil
	}
	crossOK, crossDegraded, crossShadow, crossRetry := true, false, false, int64(0)
	pmode := PolicyAdmit
	if mode != "admit" {
		pmode = PolicyDry
	}
	for _, g := range cross {
		if !crossOK || crossDegraded {
			// refused already: the later groups are only read (a dry
			// run), so that the answer carries their items too
			// (policy_run.lua's dry run reports the room as it is)
			if res, err := r.RunPolicies(ctx, PolicyDry, now, req.RequestID, g.specs); err == nil {
				for j, it := range res.Items {
					states[g.calls[j]] = policyState(req.Policies[g.calls[j]].Policy, it)
				}
				if enforcedRefusal(res.Items) {
					// the wait must suffice for every refusing limit
					crossOK = false
					if crossRetry != -1 && (res.Retry < 0 || res.Retry > crossRetry) {
						crossRetry = res.Retry
					}
				}
			}
			continue
		}
		res, err := r.RunPolicies(ctx, pmode, now, req.RequestID, g.specs)
		if err != nil {
			undo()
			return quota.Decision{}, fmt.Errorf("ratelimit: admit: reservation: %w", err)
		}
		for j, it := range res.Items {
			states[g.calls[j]] = policyState(req.Policies[g.calls[j]].Policy, it)
			if it.Outcome == int64(quota.PolicyShadowRefused) {
				crossShadow = true
			}
		}
		if !res.Allowed {
			if enforcedRefusal(res.Items) {
				crossOK = false
				if crossRetry != -1 && (res.Retry < 0 || res.Retry > crossRetry) {
					crossRetry = res.Retry
				}
			} else {
				crossDegraded = true
			}
			continue
		}
		if pmode == PolicyAdmit {
			// undo what was committed, at the reservation's own time (the
			// windowed algorithms find the window or bucket from it); a
			// shadow refusal committed nothing
			var done crossGroup
			for j, it := range res.Items {
				if it.Outcome == int64(quota.PolicyAdmitted) {
					done.specs = append(done.specs, g.specs[j])
					done.calls = append(done.calls, g.calls[j])
				}
			}
			done.at = res.Now
			if len(done.specs) > 0 {
				reserved = append(reserved, done)
			}
		}
	}
	if in != nil {
		// the tenant's call decides with what the reservations found, and
		// counts it (a refusal, a degraded request, a shadow refusal)
		if !crossOK {
			in.outside += "x"
		} else if crossDegraded {
			in.outside += "d"
		}
		if crossShadow {
			in.outside += "s"
		}
	}
	res, b, err := r.run(ctx, req.TenantID, idem, now, mode, req.Cost, req.Meter, overageMode(req.Overage), p,
		req.IdempotencyFingerprint, req.IdempotencyLease.Microseconds(), in, req.Calendar)
	if err != nil {
		undo()
		return quota.Decision{}, fmt.Errorf("ratelimit: admit: %w", err)
	}
	if mode == "admit" {
		r.MarkActive(req.TenantID)
	}
	d := decode(res, p, req.Calendar, b)
	if at := itemsAt(p); len(res) > at && in != nil {
		for j, it := range decodePolicyItems(res[at:]) {
			states[in.calls[j]] = policyState(req.Policies[in.calls[j]].Policy, it)
		}
	}
	if d.Idem == quota.IdemInFlight || d.Idem == quota.IdemMismatch {
		undo()
		return d, nil
	}
	if !crossOK {
		// (a dry run is not told: it decides with what it finds, and the
		// reservation's refusal decides it here)
		d.Allowed = false
		if d.RetryAfter >= 0 {
			cr := time.Duration(crossRetry) * time.Microsecond
			if crossRetry < 0 || cr > d.RetryAfter {
				d.RetryAfter = cr
			}
		}
	}
	if !d.Allowed {
		// the reserved policies report their room as it is again
		for _, g := range reserved {
			for j, i := range g.calls {
				if st := states[i]; st != nil && st.Outcome == quota.PolicyAdmitted {
					st.Remaining = min(st.Limit, st.Remaining+g.specs[j].Weight)
				}
			}
		}
		undo()
	}
	if d.Replayed() && len(reserved) > 0 {
		r.releaseReplay(ctx, req.RequestID, reserved, states)
	}
	finishPolicies(&d, states, crossDegraded && crossOK && (res[1] == 0 || res[1] == 32))
	return d, nil
}

// releaseReplay gives back the concurrency leases that the reservations of
// a replay took (admit.lua "Idempotency": a replay is answered at once and
// holds no lease; the reservations were made before the tenant's call
// found the request to be one): one more call per slot of them, made by
// replays under a global or ip concurrency policy only. Their states report
// the room as it is. A failed call is not the replay's failure: the lease
// then ends with its lease_seconds, as a dead node's.
func (r *Runner) releaseReplay(ctx context.Context, id string, reserved []crossGroup, states []*quota.PolicyState) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, g := range reserved {
		var leases []PolicySpec
		for j, sp := range g.specs {
			if sp.Alg != quota.AlgConcurrency {
				continue
			}
			leases = append(leases, sp)
			if st := states[g.calls[j]]; st != nil {
				st.Remaining = min(st.Limit, st.Remaining+sp.Weight)
			}
		}
		if len(leases) > 0 {
			_, _ = r.RunPolicies(rctx, PolicyRelease, 0, id, leases)
		}
	}
}

// enforcedRefusal reports whether a reject or queue policy refused.
func enforcedRefusal(items []PolicyItem) bool {
	for _, it := range items {
		if it.Outcome == int64(quota.PolicyRefused) {
			return true
		}
	}
	return false
}

// finishPolicies adds the policies' states to d: the refusing ones to
// Violated, the degrade one that answers to Fallback, the longest queue
// delay to Delay. crossDegraded says a reservation's degrade policy
// refused while nothing else did.
func finishPolicies(d *quota.Decision, states []*quota.PolicyState, crossDegraded bool) {
	onlyDegrade := crossDegraded
	for _, st := range states {
		if st == nil {
			continue
		}
		d.Policies = append(d.Policies, *st)
	}
	for i := range d.Policies {
		st := &d.Policies[i]
		switch st.Outcome {
		case quota.PolicyRefused:
			d.Violated = append(d.Violated, quota.LimitName(st.Policy.Name))
		case quota.PolicyDegraded:
			if d.Fallback == nil && (onlyDegrade || degradedOnly(d)) {
				d.Fallback = st
			}
		case quota.PolicyAdmitted:
			if st.Delay > d.Delay && d.Allowed {
				d.Delay = st.Delay
			}
		}
	}
	if d.Fallback != nil {
		d.Allowed, d.RetryAfter = false, 0
	}
}

// degradedOnly reports whether d was refused by a degrade policy alone
// (the script's mask 32: no tier limit and no enforced policy refused).
func degradedOnly(d *quota.Decision) bool {
	if d.Allowed || len(d.Violated) > 0 {
		return false
	}
	for _, st := range d.Policies {
		if st.Outcome == quota.PolicyRefused {
			return false
		}
	}
	return true
}

// policyState turns a script item into the policy's state in a decision.
func policyState(p *quota.Policy, it PolicyItem) *quota.PolicyState {
	st := &quota.PolicyState{Policy: p, Outcome: quota.PolicyOutcomeOf(it.Outcome), Limit: it.Limit,
		Remaining: it.Remaining, Reset: time.UnixMicro(it.Reset).UTC(),
		Window: time.Duration(p.WindowSecondsOf()) * time.Second,
		Delay:  time.Duration(it.Delay) * time.Microsecond}
	if st.Remaining < 0 {
		st.Remaining = 0
	}
	if it.Outcome != 1 {
		st.RetryAfter = time.Duration(it.Retry) * time.Microsecond
		if it.Retry < 0 {
			st.RetryAfter = -1
		}
	}
	return st
}

// PeekPolicies reports the state of the tenant's Redis policies as they
// stand (a dry run of one request of weight 1 each, consuming nothing): for
// /v1/usage and the dashboards. req gives the tenant, the policies (with
// their scope values) and the request id; Cost 1 is assumed.
func (r *Runner) PeekPolicies(ctx context.Context, req quota.Request) ([]quota.PolicyState, error) {
	if err := redisfn.CheckTenant(req.TenantID); err != nil {
		return nil, err
	}
	if req.RequestID == "" {
		req.RequestID = "peek"
	}
	req.Cost = 1
	in, cross, err := r.splitPolicies(req)
	if err != nil {
		return nil, err
	}
	groups := cross
	if in != nil {
		groups = append(groups, crossGroup{specs: in.specs, calls: in.calls})
	}
	states := make([]*quota.PolicyState, len(req.Policies))
	for _, g := range groups {
		res, err := r.RunPolicies(ctx, PolicyDry, redisfn.Micros(req.Now), req.RequestID, g.specs)
		if err != nil {
			return nil, err
		}
		for j, it := range res.Items {
			states[g.calls[j]] = policyState(req.Policies[g.calls[j]].Policy, it)
		}
	}
	out := make([]quota.PolicyState, 0, len(states))
	for _, st := range states {
		if st != nil {
			out = append(out, *st)
		}
	}
	return out, nil
}

// ReleasePolicies ends the leases req's concurrency policies hold (when its
// response ended): one script call per hash slot of them, the documented
// round trip a concurrency policy adds after the answer. Other algorithms
// hold nothing to release.
func (r *Runner) ReleasePolicies(ctx context.Context, req quota.Request) error {
	held := req
	held.Policies = nil
	for _, c := range req.Policies {
		if c.Policy != nil && c.Policy.Algorithm == quota.AlgConcurrency && c.Policy.InRedis() {
			held.Policies = append(held.Policies, c)
		}
	}
	if len(held.Policies) == 0 {
		return nil
	}
	in, cross, err := r.splitPolicies(held)
	if err != nil {
		return err
	}
	if in != nil {
		cross = append(cross, crossGroup{specs: in.specs, calls: in.calls})
	}
	for _, g := range cross {
		if _, err := r.RunPolicies(ctx, PolicyRelease, 0, req.RequestID, g.specs); err != nil {
			return err
		}
	}
	return nil
}
