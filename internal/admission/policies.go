package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/tollgate/tollgate/internal/locallimit"
	"github.com/tollgate/tollgate/internal/policyalg"
	"github.com/tollgate/tollgate/internal/quota"
)

// The node's own policies. A policy of scope node keeps its state in this
// process (Redisson's PER_CLIENT: each API node allows the limit on its
// own), in the same algorithms' Go models that the Redis scripts are held
// to (locallimit.Node); an adaptive policy sheds this node's load
// (locallimit.Adaptive). They are decided before Redis, as a reservation:
// committed first, rolled back (Undo, Cancel) when Redis or another policy
// refuses, so that a refused request consumes none of them. A request they
// refuse never reaches Redis: its answer carries the policies' items but
// not the tier's (shedding load must not cost a round trip). During a
// Redis outage they keep deciding. Of several adaptive policies matching
// one request, the first decides (one flight per request).

// adaptiveEntry is an adaptive policy's shedder, made again when the
// policy's parameters change.
type adaptiveEntry struct {
	maxConc, targetMS int64
	a                 *locallimit.Adaptive
}

// localPolicies are a request's policies decided on this node.
type localPolicies struct {
	specs     []locallimit.NodeSpec
	calls     []int // index in req.Policies of each spec
	adaptive  *locallimit.Adaptive
	adaptAt   int                   // index in req.Policies of the adaptive policy
	committed []locallimit.NodeSpec // the specs a commit wrote: what an undo gives back
}

func (g *Gate) localOf(req quota.Request) (*localPolicies, error) {
	var lp *localPolicies
	for i, c := range req.Policies {
		p := c.Policy
		if p == nil || p.InRedis() {
			continue
		}
		if lp == nil {
			lp = &localPolicies{adaptAt: -1}
		}
		if p.Algorithm == quota.AlgAdaptive {
			if lp.adaptive == nil {
				a, err := g.adaptiveOf(p)
				if err != nil {
					return nil, err
				}
				lp.adaptive, lp.adaptAt = a, i
			}
			continue
		}
		w := int64(1)
		if p.Cost == quota.CostUnits {
			w = req.Cost
		}
		params := policyalg.ParamsOf(p, c.Limit)
		lp.specs = append(lp.specs, locallimit.NodeSpec{
			Key: nodeSpecKey(c), Alg: p.Algorithm, Params: params, Weight: w,
			Shadow: p.OnRefuse == quota.RefuseShadow})
		lp.calls = append(lp.calls, i)
	}
	return lp, nil
}

// nodeSpecKey names a node policy's instance: the policy and its scope's
// value.
func nodeSpecKey(c quota.PolicyCall) string { return c.Policy.Name + "|" + c.Value }

func (g *Gate) adaptiveOf(p *quota.Policy) (*locallimit.Adaptive, error) {
	g.adaptMu.Lock()
	defer g.adaptMu.Unlock()
	e, ok := g.adaptive[p.Name]
	if ok && e.maxConc == *p.MaxConcurrency && e.targetMS == *p.TargetLatencyMS {
		return e.a, nil
	}
	a, err := locallimit.NewAdaptive(*p.MaxConcurrency, time.Duration(*p.TargetLatencyMS)*time.Millisecond)
	if err != nil {
		return nil, fmt.Errorf("admission: adaptive policy %s: %w", p.Name, err)
	}
	if len(g.adaptive) >= maxLocal {
		g.adaptive = map[string]adaptiveEntry{}
	}
	g.adaptive[p.Name] = adaptiveEntry{maxConc: *p.MaxConcurrency, targetMS: *p.TargetLatencyMS, a: a}
	return a, nil
}

// admitWithLocal decides req's node and adaptive policies, then the shared
// state, all or nothing (see above).
func (g *Gate) admitWithLocal(ctx context.Context, req quota.Request) (quota.Decision, error) {
	lp, err := g.localOf(req)
	if err != nil {
		return quota.Decision{}, err
	}
	if lp == nil {
		return g.admitShared(ctx, req)
	}
	nowT := g.now()
	now := nowT.UnixMicro()
	var states []quota.PolicyState
	refused := quota.Decision{Now: nowT}
	var retry time.Duration
	blocked := false
	refuse := func(st *quota.PolicyState, wait time.Duration) {
		switch st.Policy.OnRefuse {
		case quota.RefuseShadow:
			st.Outcome = quota.PolicyShadowRefused
			return
		case quota.RefuseDegrade:
			st.Outcome = quota.PolicyDegraded
		default:
			st.Outcome, st.RetryAfter = quota.PolicyRefused, wait
			if retry >= 0 && (wait < 0 || wait > retry) {
				retry = wait
			}
		}
		blocked = true
	}
	// adaptive first: shedding must spend nothing else
	acquired := false
	if lp.adaptive != nil {
		p := req.Policies[lp.adaptAt].Policy
		st := quota.PolicyState{Policy: p, Outcome: quota.PolicyAdmitted, Reset: nowT, Started: nowT}
		ok, wait := true, time.Duration(0)
		if !req.DryRun {
			ok, wait = lp.adaptive.Acquire(now)
			acquired = ok
		}
		inflight, limit := lp.adaptive.State()
		st.Limit, st.Remaining = limit, max(0, limit-inflight)
		if !ok {
			refuse(&st, wait)
		}
		states = append(states, st)
	}
	commit := !req.DryRun
	if len(lp.specs) > 0 && !blocked {
		ok, results, err := g.node.Decide(now, req.RequestID, lp.specs, commit)
		if err != nil {
			g.cancelAdaptive(lp, acquired)
			return quota.Decision{}, err
		}
		for j, r := range results {
			p := req.Policies[lp.calls[j]].Policy
			st := quota.PolicyState{Policy: p, Outcome: quota.PolicyAdmitted, Limit: r.Limit,
				Remaining: max(0, r.Remaining), Reset: time.UnixMicro(r.Reset).UTC(),
				Window: time.Duration(p.WindowSecondsOf()) * time.Second, Delay: time.Duration(r.Delay) * time.Microsecond}
			if !r.OK {
				wait := time.Duration(r.Retry) * time.Microsecond
				if r.Retry < 0 {
					wait = -1
				}
				refuse(&st, wait)
			}
			states = append(states, st)
		}
		commit = commit && ok
		for j, r := range results {
			if r.OK {
				lp.committed = append(lp.committed, lp.specs[j])
			}
		}
	}
	if blocked {
		// refused here: nothing was committed on this node, and Redis
		// is not asked
		g.cancelAdaptive(lp, acquired)
		refused.Policies = states
		for i := range states {
			switch states[i].Outcome {
			case quota.PolicyRefused:
				refused.Violated = append(refused.Violated, quota.LimitName(states[i].Policy.Name))
			case quota.PolicyDegraded:
				if refused.Fallback == nil {
					refused.Fallback = &states[i]
				}
			}
		}
		if len(refused.Violated) > 0 {
			refused.Fallback = nil
			refused.RetryAfter = retry
		}
		return refused, nil
	}
	d, err := g.admitShared(ctx, req)
	if err != nil || !d.Allowed {
		if commit {
			// (a shadow refusal committed nothing: only the admitted go back)
			_ = g.node.Undo(now, req.RequestID, lp.committed)
			g.wakeNode(req, lp, lp.committed)
		}
		g.cancelAdaptive(lp, acquired)
		if err != nil {
			return d, err
		}
		// they report their room as it is again
		for i := range states {
			if states[i].Outcome == quota.PolicyAdmitted && states[i].Policy.Algorithm != quota.AlgAdaptive {
				states[i].Remaining = min(states[i].Limit, states[i].Remaining+lp.specs[i-adaptiveOffset(lp)].Weight)
			}
		}
	}
	if d.Replayed() {
		g.giveBackReplay(lp, now, req.RequestID, states, acquired)
	}
	d.Policies = append(d.Policies, states...)
	if d.Allowed {
		for _, st := range states {
			d.Delay = max(d.Delay, st.Delay)
		}
	}
	return d, nil
}

// giveBackReplay ends what an admitted replay took on this node (see
// Gate.Release: it holds nothing until an answer): its place in the
// adaptive policy's flight, left without a latency (the replay ran
// nothing), and its node concurrency leases. They were taken before Redis
// found the request to be a replay; the rate limits it spent stay spent (it
// is load). Their states report the room as it is.
func (g *Gate) giveBackReplay(lp *localPolicies, now int64, id string, states []quota.PolicyState, acquired bool) {
	off := adaptiveOffset(lp)
	if acquired {
		g.cancelAdaptive(lp, true)
		st := &states[0]
		st.Remaining, st.Started = min(st.Limit, st.Remaining+1), time.Time{}
	}
	var leases []locallimit.NodeSpec
	for j, sp := range lp.specs {
		if sp.Alg != quota.AlgConcurrency || states[off+j].Outcome != quota.PolicyAdmitted {
			continue
		}
		leases = append(leases, sp)
		st := &states[off+j]
		st.Remaining = min(st.Limit, st.Remaining+sp.Weight)
	}
	if len(leases) > 0 {
		_ = g.node.Release(now, id, leases)
	}
}

// adaptiveOffset is where lp's node specs start among the local states.
func adaptiveOffset(lp *localPolicies) int {
	if lp.adaptive != nil {
		return 1
	}
	return 0
}

func (g *Gate) cancelAdaptive(lp *localPolicies, acquired bool) {
	if acquired {
		_ = lp.adaptive.Cancel()
	}
}

// releaseLocal ends an admitted request's place in its adaptive policy's
// flight (its latency counts) and its node concurrency leases.
func (g *Gate) releaseLocal(req quota.Request, d quota.Decision) {
	lp, err := g.localOf(req)
	if err != nil || lp == nil {
		return
	}
	now := g.now()
	if lp.adaptive != nil {
		for _, st := range d.Policies {
			if st.Policy.Algorithm == quota.AlgAdaptive && st.Outcome == quota.PolicyAdmitted && !st.Started.IsZero() {
				_ = lp.adaptive.Done(now.UnixMicro(), st.Started.UnixMicro())
				break
			}
		}
	}
	var leases []locallimit.NodeSpec
	for _, sp := range lp.specs {
		if sp.Alg == quota.AlgConcurrency {
			leases = append(leases, sp)
		}
	}
	if len(leases) > 0 {
		_ = g.node.Release(now.UnixMicro(), req.RequestID, leases)
		g.wakeNode(req, lp, leases)
	}
}

// wakeNode wakes a waiter of each queue concurrency policy among specs,
// whose lease of req on this node just ended (queue.go).
func (g *Gate) wakeNode(req quota.Request, lp *localPolicies, specs []locallimit.NodeSpec) {
	for _, sp := range specs {
		if sp.Alg != quota.AlgConcurrency {
			continue
		}
		for j := range lp.specs {
			if lp.specs[j].Key == sp.Key && req.Policies[lp.calls[j]].Policy.OnRefuse == quota.RefuseQueue {
				g.queue.wake(nodeLeaseKey(sp.Key))
				break
			}
		}
	}
}
