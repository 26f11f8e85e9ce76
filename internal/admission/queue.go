package admission

import (
	"context"
	"sync"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Policy queues (on_refuse "queue"). A request refused only by queue
// policies waits on its node and is decided again, within the smallest
// max_wait_ms of them. It takes a waiter slot of the node, of its tenant
// and of each refusing policy, so that no tenant and no policy holds all of
// a node's slots: past any of the three bounds (QueueLimits) the refusal is
// answered at once.
//
// What it waits for depends on what refused it. A window or rate limit
// says exactly when the request would pass (its retry): the waiter sleeps
// that long, and is refused at once when that is past its max wait. A
// concurrency policy's retry is only when the earliest lease runs out (a
// holder that died); a slot usually comes back much sooner, when a holder's
// answer ends. So a request a concurrency policy refused waits for a
// release of that policy's state, signalled, not polled: by this process
// for node policies, by Redis pub/sub for the others (ratelimit.Runner's
// ListenReleases, which calls Released on every node). Each release wakes
// the longest waiter of that state on each node; the lease's end and the
// max wait bound the wait when no signal comes (a lost message, a holder
// that died).

// QueueLimits bound the requests of one node waiting in policy queues at
// once: in all, per tenant, per policy. Zero fields take
// DefaultQueueLimits'.
type QueueLimits struct {
	Node, PerTenant, PerPolicy int
}

// DefaultQueueLimits are the bounds of a gate whose limits are not set.
var DefaultQueueLimits = QueueLimits{Node: 1024, PerTenant: 64, PerPolicy: 512}

// Queue bounds that refused a waiter (Gate.OnQueueFull).
const (
	QueueFullNode   = "node"
	QueueFullTenant = "tenant"
	QueueFullPolicy = "policy"
)

// waiter is a request waiting in a policy queue.
type waiter struct {
	tenant   string
	policies []string // the names whose slots it holds
	keys     []string // the states whose release it waits for
	wake     chan struct{}
	woken    string // the key of a wake not yet taken, under waitQueue.mu
}

// waitQueue counts a node's waiters and routes releases to them.
type waitQueue struct {
	mu       sync.Mutex
	limits   QueueLimits
	total    int
	tenants  map[string]int
	policies map[string]int
	keys     map[string][]*waiter // by release key, longest waiting first
}

func newWaitQueue() *waitQueue {
	return &waitQueue{limits: DefaultQueueLimits, tenants: map[string]int{}, policies: map[string]int{}, keys: map[string][]*waiter{}}
}

// setLimits sets the bounds; zero fields keep the defaults.
func (q *waitQueue) setLimits(l QueueLimits) {
	d := DefaultQueueLimits
	if l.Node > 0 {
		d.Node = l.Node
	}
	if l.PerTenant > 0 {
		d.PerTenant = l.PerTenant
	}
	if l.PerPolicy > 0 {
		d.PerPolicy = l.PerPolicy
	}
	q.mu.Lock()
	q.limits = d
	q.mu.Unlock()
}

// enter takes a slot of the node, of tenant and of each policy, or names
// the bound that is full.
func (q *waitQueue) enter(tenant string, policies []string) (*waiter, string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.total >= q.limits.Node:
		return nil, QueueFullNode
	case q.tenants[tenant] >= q.limits.PerTenant:
		return nil, QueueFullTenant
	}
	for _, p := range policies {
		if q.policies[p] >= q.limits.PerPolicy {
			return nil, QueueFullPolicy
		}
	}
	q.total++
	q.tenants[tenant]++
	for _, p := range policies {
		q.policies[p]++
	}
	return &waiter{tenant: tenant, policies: policies, wake: make(chan struct{}, 1)}, ""
}

// leave gives w's slots back. A wake it did not take goes to the next
// waiter of that key.
func (q *waitQueue) leave(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.total--
	dec(q.tenants, w.tenant)
	for _, p := range w.policies {
		dec(q.policies, p)
	}
	q.unwatch(w, nil)
	if w.woken != "" {
		key := w.woken
		w.woken = ""
		q.wakeLocked(key)
	}
}

func dec(m map[string]int, k string) {
	if m[k] <= 1 {
		delete(m, k)
		return
	}
	m[k]--
}

// watch makes w wait for the releases of keys (and of no others). It
// reports whether a key is new to w: a release of it may have come
// between the refusal and now, unseen, so the caller decides again.
func (q *waitQueue) watch(w *waiter, keys []string) (added bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.unwatch(w, keys)
	for _, k := range keys {
		if contains(w.keys, k) {
			continue
		}
		w.keys = append(w.keys, k)
		q.keys[k] = append(q.keys[k], w)
		added = true
	}
	return added
}

// unwatch stops w waiting for the keys not in keep.
func (q *waitQueue) unwatch(w *waiter, keep []string) {
	kept := w.keys[:0]
	for _, k := range w.keys {
		if contains(keep, k) {
			kept = append(kept, k)
			continue
		}
		list := q.keys[k]
		for i, o := range list {
			if o == w {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(q.keys, k)
		} else {
			q.keys[k] = list
		}
	}
	clear(w.keys[len(kept):])
	w.keys = kept
}

func contains(list []string, s string) bool {
	for _, o := range list {
		if o == s {
			return true
		}
	}
	return false
}

// taken marks w's wake as taken: a release from now on wakes it again.
func (q *waitQueue) taken(w *waiter) {
	q.mu.Lock()
	w.woken = ""
	q.mu.Unlock()
}

// wake wakes the longest waiter of key that no wake is on its way to.
func (q *waitQueue) wake(key string) {
	q.mu.Lock()
	q.wakeLocked(key)
	q.mu.Unlock()
}

func (q *waitQueue) wakeLocked(key string) {
	for _, w := range q.keys[key] {
		if w.woken == "" {
			w.woken = key
			select {
			case w.wake <- struct{}{}: // (room for one: woken was empty)
			default:
			}
			return
		}
	}
}

// wakeAll wakes the longest waiter of every key: releases may have been
// missed.
func (q *waitQueue) wakeAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for k := range q.keys {
		q.wakeLocked(k)
	}
}

func (q *waitQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.total
}

// SetQueueLimits sets the bounds of the node's policy queues (zero fields:
// DefaultQueueLimits'). Call it before the gate serves.
func (g *Gate) SetQueueLimits(l QueueLimits) { g.queue.setLimits(l) }

// Waiters is the number of requests of this node waiting in policy queues.
func (g *Gate) Waiters() int64 { return int64(g.queue.len()) }

// Released wakes a waiter of this node for the state under key, whose
// concurrency lease was just released (ratelimit.Runner.ListenReleases).
func (g *Gate) Released(key string) { g.queue.wake(key) }

// ReleasesLost wakes a waiter of every state this node waits for: releases
// may have gone unheard (the subscription was down).
func (g *Gate) ReleasesLost() { g.queue.wakeAll() }

// leaseKeyer names the Redis state of a concurrency policy's instance, as
// ListenReleases reports its releases; *ratelimit.Runner provides it.
type leaseKeyer interface {
	LeaseKey(req quota.Request, c quota.PolicyCall) string
}

// nodeLeaseKey names a node policy's instance among the release keys (no
// Redis key has a '|' in its prefix).
func nodeLeaseKey(specKey string) string { return "|node|" + specKey }

// wait is Admit's queue: d is a refusal of req that only queue policies
// made, budget the smallest max wait among them.
func (g *Gate) wait(ctx context.Context, req quota.Request, d quota.Decision, budget time.Duration) (quota.Decision, error) {
	deadline := g.now().Add(budget)
	w, full := g.queue.enter(req.TenantID, refusing(d))
	if w == nil {
		g.OnQueueFull(full)
		return d, nil
	}
	defer g.queue.leave(w)
	var err error
	for !d.Allowed {
		if _, ok := queueBudget(d); !ok {
			return d, nil
		}
		left := deadline.Sub(g.now())
		keys, heard := g.leaseKeys(req, d)
		exact, ok := exactWait(d, heard)
		if !ok || exact > left || left <= 0 {
			return d, nil
		}
		wait := exact
		if len(keys) > 0 {
			if g.queue.watch(w, keys) {
				// a release between the refusal and the watch went
				// unseen: decide again now that none can
				if d, err = g.admitOnce(ctx, req); err != nil {
					return d, err
				}
				continue
			}
			// a release, else the earliest lease's end (its holder
			// died), within the max wait
			wait = min(d.RetryAfter, left) // (d.RetryAfter >= exact)
		} else {
			g.queue.watch(w, nil)
		}
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return d, nil
		case <-w.wake:
			t.Stop()
			g.queue.taken(w)
		case <-t.C:
		}
		if d, err = g.admitOnce(ctx, req); err != nil {
			return d, err
		}
	}
	return d, nil
}

// refusing names the policies that refused d.
func refusing(d quota.Decision) []string {
	var names []string
	for _, st := range d.Policies {
		if st.Outcome == quota.PolicyRefused {
			names = append(names, st.Policy.Name)
		}
	}
	return names
}

// exactWait is how long d's refusing policies say it must wait at least
// (their retry), but for the concurrency ones whose releases are heard;
// ok is false when one of them never admits it.
func exactWait(d quota.Decision, heard bool) (time.Duration, bool) {
	var wait time.Duration
	for _, st := range d.Policies {
		if st.Outcome != quota.PolicyRefused {
			continue
		}
		if st.RetryAfter < 0 {
			return 0, false
		}
		if !heard || st.Policy.Algorithm != quota.AlgConcurrency {
			wait = max(wait, st.RetryAfter)
		}
	}
	return wait, true
}

// leaseKeys are the release keys of the concurrency policies that refused
// d; heard is false when the store cannot name one of them (its releases
// are not heard: its retry stands).
func (g *Gate) leaseKeys(req quota.Request, d quota.Decision) (keys []string, heard bool) {
	heard = true
	for _, st := range d.Policies {
		p := st.Policy
		if st.Outcome != quota.PolicyRefused || p.Algorithm != quota.AlgConcurrency {
			continue
		}
		for _, c := range req.Policies {
			if c.Policy != p {
				continue
			}
			if !p.InRedis() {
				keys = append(keys, nodeLeaseKey(nodeSpecKey(c)))
			} else if lk, ok := g.store.(leaseKeyer); ok {
				keys = append(keys, lk.LeaseKey(req, c))
			} else {
				heard = false
			}
			break
		}
	}
	if !heard {
		return nil, false
	}
	return keys, true
}
