package locallimit

import (
	"fmt"
	"sync"

	"github.com/tollgate/tollgate/internal/policyalg"
	"github.com/tollgate/tollgate/internal/quota"
)

// NodeSpec is one policy instance of a Node call, as ratelimit.PolicySpec
// is one of a script call: Key names the instance (the policy, the scope's
// value), Alg and Params its algorithm (policyalg.ParamsOf a valid
// policy), Weight what the request counts (1, or the route's cost), Shadow
// whether a refusal only counts (on_refuse "shadow") rather than refuse.
type NodeSpec struct {
	Key    string
	Alg    quota.Algorithm
	Params policyalg.Params
	Weight int64
	Shadow bool
}

// Node decides the policies of scope "node": each API node on its own, in
// process (Redisson's RateType.PER_CLIENT), with the pure-Go models of
// internal/policyalg, one Model per instance, made on first use by
// policyalg.New. Its calls mirror lua/policy_run.lua's over the specs of
// one request, all or nothing: Decide (modes admit and dry), Undo and
// Release. Every algorithm but adaptive has a model; adaptive is the
// Adaptive type, not a Node instance.
//
// Memory is bounded: a Node holds at most the maximum NewNode was given of
// instances. Past it, a new instance evicts an idle one: of the 32 least
// recently used, the least recently used whose state has drained, by its
// own account (now is past the Reset of every admission it committed, and
// for concurrency past the end of every lease it gave), so that forgetting
// it loses nothing; when none of them has drained (a spray of keys), the
// least recently used all the same. Evicted, an instance is forgotten: its
// next use starts fresh, with an empty window, a full bucket, no leases
// (warm_up: cold, which admits less), a bounded allowance on this node
// only. An instance whose algorithm or parameters change (an admin edited
// the policy) starts fresh too. The bound counts instances, not what they
// hold: a sliding_log instance holds up to its limit of entries.
//
// A Node is safe for concurrent use: one lock covers a whole call, so that
// the check and the commit of its specs are one step. It returns errors,
// never panics.
type Node struct {
	max int

	mu    sync.Mutex
	byKey map[string]*instance
	lru   instance // the sentinel of a ring: lru.next is the most recent
	call  uint64   // the current call's number, for eviction
}

// instance is a policy instance: its model and what made it.
type instance struct {
	key        string
	alg        quota.Algorithm
	params     policyalg.Params
	model      policyalg.Model
	idle       int64  // us: its state has drained from then on
	call       uint64 // the call that last used it
	prev, next *instance
}

// evictScan is how many of the least recently used instances eviction
// looks through for an idle one.
const evictScan = 32

// NewNode returns a Node that holds at most maxInstances instances (at
// least quota.MaxPoliciesPerRequest, the specs of one call).
func NewNode(maxInstances int) *Node {
	n := &Node{max: max(quota.MaxPoliciesPerRequest, maxInstances), byKey: map[string]*instance{}}
	n.lru.prev, n.lru.next = &n.lru, &n.lru
	return n
}

// Len returns the number of instances held.
func (n *Node) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.byKey)
}

// Decide checks every spec at now (us) for the request id and, when every
// one that is not Shadow admits and commit is true, commits the admissions
// of the ones that admitted (a Shadow refusal neither blocks nor is
// committed; a degrade policy is not Shadow: its refusal blocks). ok
// reports whether the non-Shadow ones all admit, whatever commit; results
// are the specs' decisions, in order. As policy_run.lua reports, an
// admission that was not committed shows its room as it is: its Remaining
// does not count the request.
//
// Bad input is a CodeInvalid *quota.Error and changes nothing: a time out
// of (0, 2^60], an empty id, more than quota.MaxPoliciesPerRequest specs,
// an empty or repeated key, a weight out of [1, quota.MaxQuantity],
// parameters a model cannot run on (negative, past quota.MaxWindowMicros,
// or a zero window, interval or bucket count). An algorithm with no model
// (policyalg.New's error) is an error too, and changes nothing either.
func (n *Node) Decide(now int64, id string, specs []NodeSpec, commit bool) (ok bool, results []policyalg.Result, err error) {
	if err := checkCall(now, id, specs); err != nil {
		return false, nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	insts, err := n.instances(now, specs)
	if err != nil {
		return false, nil, err
	}
	results = make([]policyalg.Result, len(specs))
	ok = true
	for i, s := range specs {
		results[i] = insts[i].model.Check(now, s.Weight)
		if !results[i].OK && !s.Shadow {
			ok = false
		}
	}
	consumed := ok && commit
	for i, s := range specs {
		r := &results[i]
		switch {
		case !r.OK:
		case consumed:
			in := insts[i]
			in.model.Commit(now, s.Weight, id)
			in.idle = max(in.idle, r.Reset)
			if s.Alg == quota.AlgConcurrency {
				in.idle = max(in.idle, now+s.Params[1]) // the lease's end
			}
		default:
			r.Remaining = min(r.Remaining+s.Weight, r.Limit)
		}
	}
	return ok, results, nil
}

// Undo rolls back the admissions a committed Decide made for id: now is
// that Decide's time (the windows find the admission's window from it),
// specs the ones whose admission it committed (results[i].OK), with the
// same weights. An instance no longer held (evicted) or since changed has
// nothing to roll back: Undo skips it. Bad input is a CodeInvalid
// *quota.Error, as Decide's.
func (n *Node) Undo(now int64, id string, specs []NodeSpec) error {
	return n.each(now, id, specs, func(in *instance, s NodeSpec) { in.model.Undo(now, s.Weight, id) })
}

// Release ends the leases of id (concurrency; the other algorithms have
// none), as policy_run.lua's release: after the request's answer. An
// instance no longer held has no lease to end. Bad input is a CodeInvalid
// *quota.Error, as Decide's.
func (n *Node) Release(now int64, id string, specs []NodeSpec) error {
	return n.each(now, id, specs, func(in *instance, _ NodeSpec) { in.model.Release(now, id) })
}

// each runs f on the held instance of every spec whose algorithm and
// parameters are the instance's; it makes none.
func (n *Node) each(now int64, id string, specs []NodeSpec, f func(*instance, NodeSpec)) error {
	if err := checkCall(now, id, specs); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range specs {
		if in := n.byKey[s.Key]; in != nil && in.alg == s.Alg && in.params == s.Params {
			f(in, s)
		}
	}
	return nil
}

// instances returns the instances of specs, making the missing ones; on an
// error it has changed nothing. The instances it returns are the most
// recently used, marked with the call's number so that making another one
// of the same call does not evict them.
func (n *Node) instances(now int64, specs []NodeSpec) ([]*instance, error) {
	insts := make([]*instance, len(specs))
	models := make([]policyalg.Model, len(specs)) // new ones
	for i, s := range specs {
		if in := n.byKey[s.Key]; in != nil && in.alg == s.Alg && in.params == s.Params {
			insts[i] = in
			continue
		}
		m, err := policyalg.New(s.Alg, s.Params)
		if err != nil {
			return nil, fmt.Errorf("locallimit: node policy %q: %w", s.Key, err)
		}
		models[i] = m
	}
	n.call++
	for i, s := range specs { // those held first: making the others must not evict them
		if in := n.byKey[s.Key]; in != nil {
			if insts[i] == nil { // another algorithm or parameters: afresh
				in.alg, in.params, in.model, in.idle = s.Alg, s.Params, models[i], 0
				insts[i] = in
			}
			in.call = n.call
			n.touch(in)
		}
	}
	for i, s := range specs {
		if insts[i] != nil {
			continue
		}
		if len(n.byKey) >= n.max {
			n.evict(now)
		}
		in := &instance{key: s.Key, alg: s.Alg, params: s.Params, model: models[i], call: n.call}
		n.byKey[s.Key] = in
		n.touch(in)
		insts[i] = in
	}
	return insts, nil
}

// touch makes in the most recently used.
func (n *Node) touch(in *instance) {
	if in.next != nil {
		in.prev.next, in.next.prev = in.next, in.prev
	}
	in.prev, in.next = &n.lru, n.lru.next
	n.lru.next.prev = in
	n.lru.next = in
}

// evict forgets one instance that the current call does not use: of the
// evictScan least recently used, the least recently used idle at now, else
// the least recently used.
func (n *Node) evict(now int64) {
	var victim *instance
	scanned := 0
	for in := n.lru.prev; in != &n.lru && scanned < evictScan; in = in.prev {
		if in.call == n.call {
			continue
		}
		if victim == nil {
			victim = in
		}
		if now >= in.idle {
			victim = in
			break
		}
		scanned++
	}
	if victim == nil {
		return // only the call's own instances: cannot happen, max >= MaxPoliciesPerRequest
	}
	victim.prev.next, victim.next.prev = victim.next, victim.prev
	victim.prev, victim.next = nil, nil
	delete(n.byKey, victim.key)
}

// Bounds of a Node call's input.
const (
	maxNodeID  = 256  // bytes of a request id
	maxNodeKey = 1024 // bytes of an instance key
)

// checkCall validates a call's input (see Decide).
func checkCall(now int64, id string, specs []NodeSpec) error {
	if now <= 0 || now > 1<<60 {
		return quota.FieldError("now", "must be after 1970-01-01 and before the year 38000")
	}
	if id == "" || len(id) > maxNodeID {
		return quota.FieldError("id", "must be 1 to %d bytes", maxNodeID)
	}
	if len(specs) > quota.MaxPoliciesPerRequest {
		return quota.FieldError("policies", "at most %d per request", quota.MaxPoliciesPerRequest)
	}
	for i, s := range specs {
		if s.Key == "" || len(s.Key) > maxNodeKey {
			return quota.FieldError("key", "must be 1 to %d bytes", maxNodeKey)
		}
		for _, o := range specs[:i] {
			if o.Key == s.Key {
				return quota.FieldError("key", "%q appears twice", s.Key)
			}
		}
		if s.Weight < 1 || s.Weight > quota.MaxQuantity {
			return quota.FieldError("weight", "must be an integer between 1 and %d", quota.MaxQuantity)
		}
		if err := checkParams(s.Alg, s.Params); err != nil {
			return err
		}
	}
	return nil
}

// checkParams refuses the parameters a model cannot run on: negative ones,
// ones past quota.MaxWindowMicros, and a zero divisor (policyalg.Params
// says which parameter is which). The other bounds of a valid policy are
// quota.Policy.Validate's.
func checkParams(alg quota.Algorithm, p policyalg.Params) error {
	for _, v := range p {
		if v < 0 || v > quota.MaxWindowMicros {
			return quota.FieldError("params", "must be integers between 0 and %d", quota.MaxWindowMicros)
		}
	}
	var positive []int // indexes of the parameters that must be at least 1
	switch alg {
	case quota.AlgFixedWindow, quota.AlgSlidingLog, quota.AlgTokenBucket, quota.AlgGCRA,
		quota.AlgLeakyBucket, quota.AlgConcurrency:
		positive = []int{1} // the window, interval or lease
	case quota.AlgSlidingWindow:
		positive = []int{1, 2}
	case quota.AlgWarmUp:
		positive = []int{0, 1, 2}
	}
	for _, i := range positive {
		if p[i] < 1 {
			return quota.FieldError("params", "%s needs parameter %d at least 1", alg, i+1)
		}
	}
	if alg == quota.AlgSlidingWindow && (p[2] > p[1] || p[1]%p[2] != 0) {
		return quota.FieldError("params", "the buckets must divide the window into whole microseconds")
	}
	return nil
}
