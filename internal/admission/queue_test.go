package admission

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// queuedConcurrency is the README's example: limit 1, lease 30 s, queue up
// to 5 s, of scope.
func queuedConcurrency(name string, scope quota.Scope) *quota.Policy {
	p := &quota.Policy{Name: name, Algorithm: quota.AlgConcurrency, Scope: scope, Limit: quota.Ptr(int64(1)),
		LeaseSeconds: quota.Ptr(int64(30)), OnRefuse: quota.RefuseQueue, MaxWaitMS: quota.Ptr(int64(5000))}
	p.Defaults()
	if err := p.Validate(); err != nil {
		panic(err)
	}
	return p
}

// admitted is the outcome of an Admit run in a goroutine.
type admitted struct {
	d   quota.Decision
	err error
}

func goAdmit(g *Gate, req quota.Request) <-chan admitted {
	c := make(chan admitted, 1)
	go func() {
		d, err := g.Admit(context.Background(), req)
		c <- admitted{d, err}
	}()
	return c
}

// holdAndWait admits holder on a, queues waiter on b, releases the holder
// and checks that the waiter is then admitted: it waited for the release
// (the holder's lease would end in 30 s, past its 5 s).
func holdAndWait(t *testing.T, a, b *Gate, holder, waiter quota.Request) {
	t.Helper()
	ctx := context.Background()
	dh, err := a.Admit(ctx, holder)
	if err != nil || !dh.Allowed {
		t.Fatalf("holder: %v %+v", err, dh)
	}
	w := goAdmit(b, waiter)
	deadline := time.Now().Add(5 * time.Second)
	for b.Waiters() != 1 {
		select {
		case r := <-w:
			t.Fatalf("the waiter was answered while the holder holds the slot: allowed %t, violated %v, retry %v, err %v; want it to wait for the release",
				r.d.Allowed, r.d.Violated, r.d.RetryAfter, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := a.Release(ctx, holder, dh); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-w:
		if r.err != nil || !r.d.Allowed {
			t.Fatalf("the waiter after the release: %v allowed %t violated %v, want admitted", r.err, r.d.Allowed, r.d.Violated)
		}
		if err := b.Release(ctx, waiter, r.d); err != nil {
			t.Fatal(err)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("the waiter was not admitted within 4 s of the release")
	}
	if n := b.Waiters(); n != 0 {
		t.Fatalf("%d waiters left, want 0", n)
	}
}

// TestQueuedNodeConcurrencyWaitsForTheRelease: a node concurrency policy
// that queues: a request that finds the slot taken waits for the holder's
// release on this node.
func TestQueuedNodeConcurrencyWaitsForTheRelease(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	g := New(quotaredis.New(rdb, testenv.Prefix(t, rdb)), time.Now)
	tenant := "tn-" + testenv.RandomHex(6)
	pol := queuedConcurrency("one-here", quota.ScopeNode)
	holdAndWait(t, g, g, withPolicies(tenant, 100, 1, pol), withPolicies(tenant, 100, 2, pol))
}

// TestQueuedConcurrencyWakesOnAnotherNode: two gates on one Redis, as two
// API nodes: a release of a Redis concurrency policy (tenant and global
// scope) on one wakes the request queued on the other.
func TestQueuedConcurrencyWakesOnAnotherNode(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var gates [2]*Gate
	for i := range gates {
		r := quotaredis.New(testenv.Redis(t), prefix)
		gates[i] = New(r, time.Now)
		ready := make(chan struct{})
		go r.ListenReleases(ctx, gates[i].Released, gates[i].ReleasesLost, ready)
		<-ready
	}
	for _, scope := range []quota.Scope{quota.ScopeTenant, quota.ScopeGlobal} {
		tenant := "tn-" + testenv.RandomHex(6)
		pol := queuedConcurrency("one-"+string(scope), scope)
		holder, waiter := withPolicies(tenant, 100, 1, pol), withPolicies(tenant, 100, 2, pol)
		for _, req := range []*quota.Request{&holder, &waiter} {
			req.Policies[0].Value = tenant
		}
		holdAndWait(t, gates[0], gates[1], holder, waiter)
	}
}

// TestWaitQueueBounds: a waiter takes a slot of the node, its tenant and
// each refusing policy; a full one refuses, naming itself; leaving gives
// them back.
func TestWaitQueueBounds(t *testing.T) {
	t.Parallel()
	q := newWaitQueue()
	q.setLimits(QueueLimits{Node: 4, PerTenant: 2, PerPolicy: 3})
	enter := func(tenant string, policies []string, wantFull string) *waiter {
		t.Helper()
		w, full := q.enter(tenant, policies)
		if full != wantFull || (w == nil) != (wantFull != "") {
			t.Fatalf("enter(%s, %v): full %q, want %q", tenant, policies, full, wantFull)
		}
		return w
	}
	a1 := enter("a", []string{"p"}, "")
	enter("a", []string{"p"}, "")
	enter("a", []string{"q"}, QueueFullTenant)
	enter("b", []string{"p", "q"}, "")
	enter("c", []string{"q", "p"}, QueueFullPolicy)
	enter("c", []string{"q"}, "")
	enter("d", []string{"q"}, QueueFullNode)
	q.leave(a1)
	enter("a", []string{"q"}, "")
	if q.len() != 4 {
		t.Fatalf("%d waiters, want 4", q.len())
	}
}

// TestWaitQueuePassesOnAWakeNotTaken: a release wakes the longest waiter
// of its key only; a waiter that leaves without taking its wake passes it
// to the next.
func TestWaitQueuePassesOnAWakeNotTaken(t *testing.T) {
	t.Parallel()
	q := newWaitQueue()
	w1, _ := q.enter("a", nil)
	w2, _ := q.enter("b", nil)
	if !q.watch(w1, []string{"k"}) || !q.watch(w2, []string{"k"}) || q.watch(w2, []string{"k"}) {
		t.Fatal("watch: want a new key reported once")
	}
	q.wake("k")
	woken := func(w *waiter) bool {
		select {
		case <-w.wake:
			return true
		default:
			return false
		}
	}
	if woken(w2) {
		t.Fatal("a release woke the second waiter, want the first only")
	}
	q.leave(w1) // without taking it
	if !woken(w2) {
		t.Fatal("the wake the first waiter left is not passed on")
	}
	q.taken(w2)
	q.wake("other")
	q.leave(w2)
	if len(q.keys) != 0 || len(q.tenants) != 0 || q.len() != 0 {
		t.Fatalf("after every waiter left: keys %v tenants %v total %d, want none", q.keys, q.tenants, q.len())
	}
}

// plainStore hides the runner's LeaseKey: a store whose releases the gate
// cannot hear.
type plainStore struct{ Store }

// TestQueuedConcurrencyUnheardKeepsItsRetry: when the store cannot name a
// concurrency policy's state, its releases are not heard: the refusal's
// retry (the lease's end, past the max wait) stands and the request is
// refused after one decision, not decided again and again.
func TestQueuedConcurrencyUnheardKeepsItsRetry(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	inner := &counting{Store: quotaredis.New(rdb, testenv.Prefix(t, rdb))}
	g := New(plainStore{inner}, time.Now)
	tenant := "tn-" + testenv.RandomHex(6)
	pol := queuedConcurrency("one-unheard", quota.ScopeTenant)
	holder, waiter := withPolicies(tenant, 100, 1, pol), withPolicies(tenant, 100, 2, pol)
	holder.Policies[0].Value, waiter.Policies[0].Value = tenant, tenant
	if d, err := g.Admit(context.Background(), holder); err != nil || !d.Allowed {
		t.Fatalf("holder: %v %+v", err, d)
	}
	d, err := g.Admit(context.Background(), waiter)
	if err != nil || d.Allowed || d.RetryAfter < 29*time.Second {
		t.Fatalf("waiter: %v allowed %t retry %v, want refused with the lease's end", err, d.Allowed, d.RetryAfter)
	}
	if n := inner.calls.Load(); n != 2 {
		t.Fatalf("%d decisions for the holder and the waiter, want 2", n)
	}
}
