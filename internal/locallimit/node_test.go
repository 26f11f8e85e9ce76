package locallimit

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/internal/policyalg"
	"github.com/tollgate/tollgate/internal/quota"
)

const sec = int64(1e6) // us

// fw is a fixed_window spec of limit a window of w us.
func fw(key string, limit, w int64) NodeSpec {
	return NodeSpec{Key: key, Alg: quota.AlgFixedWindow, Params: policyalg.Params{limit, w}, Weight: 1}
}

func mustDecide(t *testing.T, n *Node, now int64, id string, specs []NodeSpec, commit bool) (bool, []policyalg.Result) {
	t.Helper()
	ok, res, err := n.Decide(now, id, specs, commit)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(specs) {
		t.Fatalf("%d results for %d specs", len(res), len(specs))
	}
	return ok, res
}

// remaining returns what a dry run of spec alone reports as remaining (the
// room as it is: the dry request added back).
func remaining(t *testing.T, n *Node, now int64, s NodeSpec) int64 {
	t.Helper()
	_, res := mustDecide(t, n, now, "peek", []NodeSpec{s}, false)
	return res[0].Remaining
}

// TestNodeAllOrNothing: when one enforced spec refuses, no spec is
// committed, and an admitting spec reports its room as it is.
func TestNodeAllOrNothing(t *testing.T) {
	t.Parallel()
	n := NewNode(100)
	now := us0
	a, b := fw("a", 5, sec), fw("b", 1, sec)
	if ok, res := mustDecide(t, n, now, "r1", []NodeSpec{a, b}, true); !ok || !res[0].OK || !res[1].OK ||
		res[0].Remaining != 4 || res[1].Remaining != 0 {
		t.Fatalf("first: %t %+v; want both admitted, remaining 4 and 0", ok, res)
	}
	ok, res := mustDecide(t, n, now, "r2", []NodeSpec{a, b}, true)
	if ok || !res[0].OK || res[1].OK {
		t.Fatalf("second: %t %+v; want a admitting, b refusing, not ok", ok, res)
	}
	if res[0].Remaining != 4 { // 5 - 1 committed; this one not counted
		t.Errorf("a's remaining on a refused request: %d, want 4 (as it is)", res[0].Remaining)
	}
	if res[1].Retry != sec-(now%sec) || res[1].Limit != 1 {
		t.Errorf("b's refusal: %+v; want retry to the window's end and limit 1", res[1])
	}
	if got := remaining(t, n, now, a); got != 4 {
		t.Errorf("a after the refused request: %d remaining, want 4 (nothing committed)", got)
	}
	// b alone in the next window: admitted again.
	if ok, _ := mustDecide(t, n, now+sec, "r3", []NodeSpec{b}, true); !ok {
		t.Error("b refused in the next window")
	}
}

// TestNodeShadow: a shadow refusal does not block the others, and its own
// model commits nothing.
func TestNodeShadow(t *testing.T) {
	t.Parallel()
	n := NewNode(100)
	now := us0
	s := fw("s", 1, sec)
	s.Shadow = true
	a := fw("a", 3, sec)
	for i, want := range []bool{true, false, false} { // s's own decision
		ok, res := mustDecide(t, n, now, fmt.Sprint("r", i), []NodeSpec{s, a}, true)
		if !ok || res[0].OK != want || !res[1].OK {
			t.Fatalf("request %d: %t %+v; want ok, s admitting %t, a admitting", i, ok, res, want)
		}
	}
	if got := remaining(t, n, now, a); got != 0 {
		t.Errorf("a: %d remaining, want 0 (three committed past s's shadow refusals)", got)
	}
	s.Shadow = false
	if ok, res := mustDecide(t, n, now, "r3", []NodeSpec{s}, false); ok || res[0].Remaining != 0 {
		t.Errorf("s enforced: %t %+v; want refused with 0 remaining (1 committed, not 3)", ok, res)
	}
	// A shadow spec's refusal does not make ok false even alone.
	s.Shadow = true
	if ok, _ := mustDecide(t, n, now, "r4", []NodeSpec{s}, true); !ok {
		t.Error("a lone shadow refusal blocked")
	}
}

// TestNodeDryRun: commit false decides and consumes nothing.
func TestNodeDryRun(t *testing.T) {
	t.Parallel()
	n := NewNode(100)
	a := fw("a", 2, sec)
	for range 5 {
		ok, res := mustDecide(t, n, us0, "dry", []NodeSpec{a}, false)
		if !ok || res[0].Remaining != 2 {
			t.Fatalf("dry run: %t %+v; want admitted, 2 remaining (nothing counted)", ok, res)
		}
	}
	for i, want := range []bool{true, true, false} {
		if ok, _ := mustDecide(t, n, us0, fmt.Sprint("r", i), []NodeSpec{a}, true); ok != want {
			t.Fatalf("request %d after the dry runs: %t, want %t", i, ok, want)
		}
	}
}

// TestNodeUndo: Undo gives back what a committed Decide took; on an
// instance it does not hold it does nothing and makes none.
func TestNodeUndo(t *testing.T) {
	t.Parallel()
	n := NewNode(100)
	a := fw("a", 2, sec)
	a.Weight = 2
	if ok, _ := mustDecide(t, n, us0, "r1", []NodeSpec{a}, true); !ok {
		t.Fatal("refused")
	}
	if ok, _ := mustDecide(t, n, us0, "r2", []NodeSpec{a}, false); ok {
		t.Fatal("a full window admitted")
	}
	if err := n.Undo(us0, "r1", []NodeSpec{a}); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, n, us0, fw("a", 2, sec)); got != 2 {
		t.Fatalf("after Undo: %d remaining, want 2", got)
	}
	if err := n.Undo(us0, "r1", []NodeSpec{fw("nobody", 2, sec)}); err != nil || n.Len() != 1 {
		t.Fatalf("Undo of an unknown instance: %v, %d held; want nil, 1", err, n.Len())
	}
}

// TestNodeRelease: a concurrency instance's leases end with Release.
func TestNodeRelease(t *testing.T) {
	t.Parallel()
	n := NewNode(100)
	c := NodeSpec{Key: "c", Alg: quota.AlgConcurrency, Params: policyalg.Params{2, 60 * sec}, Weight: 1}
	for i, want := range []bool{true, true, false} {
		if ok, _ := mustDecide(t, n, us0, fmt.Sprint("r", i), []NodeSpec{c}, true); ok != want {
			t.Fatalf("request %d: %t, want %t", i, ok, want)
		}
	}
	if err := n.Release(us0+1, "r0", []NodeSpec{c}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := mustDecide(t, n, us0+2, "r3", []NodeSpec{c}, true); !ok {
		t.Fatal("refused after a Release")
	}
	if ok, _ := mustDecide(t, n, us0+3, "r4", []NodeSpec{c}, true); ok {
		t.Fatal("admitted a third lease")
	}
	// Leases end by themselves at their lease's end.
	if ok, _ := mustDecide(t, n, us0+60*sec, "r5", []NodeSpec{c}, true); !ok {
		t.Fatal("refused after the leases ended")
	}
}

// TestNodeEveryAlgorithm: each algorithm with a model runs in a Node and
// refuses once its room is used, with the model's own answer.
func TestNodeEveryAlgorithm(t *testing.T) {
	t.Parallel()
	for _, s := range []NodeSpec{
		{Alg: quota.AlgFixedWindow, Params: policyalg.Params{3, sec}},
		{Alg: quota.AlgSlidingLog, Params: policyalg.Params{3, sec}},
		{Alg: quota.AlgSlidingWindow, Params: policyalg.Params{3, sec, 10}},
		{Alg: quota.AlgTokenBucket, Params: policyalg.Params{3, sec}},
		{Alg: quota.AlgGCRA, Params: policyalg.Params{3, sec}},
		{Alg: quota.AlgLeakyBucket, Params: policyalg.Params{3, sec, 0}},
		{Alg: quota.AlgConcurrency, Params: policyalg.Params{3, sec}},
		{Alg: quota.AlgWarmUp, Params: policyalg.Params{sec, 10 * sec, 3}},
	} {
		t.Run(string(s.Alg), func(t *testing.T) {
			t.Parallel()
			s.Key, s.Weight = "k", 1
			n := NewNode(100)
			m, err := policyalg.New(s.Alg, s.Params)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 10 {
				id := fmt.Sprint("r", i)
				want := m.Check(us0, 1)
				if want.OK {
					m.Commit(us0, 1, id)
				}
				ok, res := mustDecide(t, n, us0, id, []NodeSpec{s}, true)
				if ok != want.OK || res[0] != want {
					t.Fatalf("request %d: %t %+v; want the model's %+v", i, ok, res[0], want)
				}
			}
			if ok, _ := mustDecide(t, n, us0, "last", []NodeSpec{s}, true); ok {
				t.Error("never refused")
			}
		})
	}
}

// TestNodeRefusesWhatItCannotDecide: bad input is a CodeInvalid error,
// never a panic, and makes no instance; an algorithm with no model is an
// error too, all or nothing.
func TestNodeRefusesWhatItCannotDecide(t *testing.T) {
	t.Parallel()
	good := fw("a", 1, sec)
	for _, tc := range []struct {
		name  string
		field string
		now   int64
		id    string
		specs []NodeSpec
	}{
		{"time 0", "now", 0, "r", []NodeSpec{good}},
		{"negative time", "now", -1, "r", []NodeSpec{good}},
		{"time past 2^60", "now", 1<<60 + 1, "r", []NodeSpec{good}},
		{"empty id", "id", us0, "", []NodeSpec{good}},
		{"too many specs", "policies", us0, "r", func() []NodeSpec {
			var s []NodeSpec
			for i := range quota.MaxPoliciesPerRequest + 1 {
				s = append(s, fw(fmt.Sprint("k", i), 1, sec))
			}
			return s
		}()},
		{"empty key", "key", us0, "r", []NodeSpec{fw("", 1, sec)}},
		{"repeated key", "key", us0, "r", []NodeSpec{good, fw("a", 2, sec)}},
		{"weight 0", "weight", us0, "r", []NodeSpec{{Key: "a", Alg: quota.AlgFixedWindow, Params: policyalg.Params{1, sec}}}},
		{"weight past MaxQuantity", "weight", us0, "r", []NodeSpec{{Key: "a", Alg: quota.AlgFixedWindow, Params: policyalg.Params{1, sec}, Weight: quota.MaxQuantity + 1}}},
		{"negative limit", "params", us0, "r", []NodeSpec{fw("a", -1, sec)}},
		{"window 0", "params", us0, "r", []NodeSpec{good, fw("b", 1, 0)}},
		{"huge parameter", "params", us0, "r", []NodeSpec{fw("a", quota.MaxWindowMicros+1, sec)}},
		{"interval 0", "params", us0, "r", []NodeSpec{{Key: "a", Alg: quota.AlgGCRA, Params: policyalg.Params{1, 0}, Weight: 1}}},
		{"buckets 0", "params", us0, "r", []NodeSpec{{Key: "a", Alg: quota.AlgSlidingWindow, Params: policyalg.Params{1, sec, 0}, Weight: 1}}},
		{"buckets past the window", "params", us0, "r", []NodeSpec{{Key: "a", Alg: quota.AlgSlidingWindow, Params: policyalg.Params{1, 3, 7}, Weight: 1}}},
		{"buckets not dividing", "params", us0, "r", []NodeSpec{{Key: "a", Alg: quota.AlgSlidingWindow, Params: policyalg.Params{1, sec, 7}, Weight: 1}}},
		{"warm_up without a rate", "params", us0, "r", []NodeSpec{{Key: "a", Alg: quota.AlgWarmUp, Params: policyalg.Params{0, sec, 3}, Weight: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := NewNode(100)
			for name, call := range map[string]func() error{
				"Decide":  func() error { _, _, err := n.Decide(tc.now, tc.id, tc.specs, true); return err },
				"Undo":    func() error { return n.Undo(tc.now, tc.id, tc.specs) },
				"Release": func() error { return n.Release(tc.now, tc.id, tc.specs) },
			} {
				var err error
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Fatalf("%s panicked: %v", name, r)
						}
					}()
					err = call()
				}()
				var e *quota.Error
				if !errors.As(err, &e) || e.Code != quota.CodeInvalid || e.Field != tc.field {
					t.Errorf("%s: %v; want a CodeInvalid error on %s", name, err, tc.field)
				}
			}
			if got := n.Len(); got != 0 {
				t.Errorf("%d instances after an error, want 0", got)
			}
		})
	}

	// No model (adaptive is not a Node algorithm; "nope" is nothing): an
	// error that is not the caller's fault, and the valid spec beside it
	// is neither made nor consumed.
	for _, alg := range []quota.Algorithm{quota.AlgAdaptive, "nope"} {
		n := NewNode(100)
		bad := NodeSpec{Key: "x", Alg: alg, Params: policyalg.Params{1, sec}, Weight: 1}
		ok, res, err := n.Decide(us0, "r", []NodeSpec{good, bad}, true)
		if err == nil || quota.ErrorCode(err) != quota.CodeInternal || ok || res != nil {
			t.Errorf("%s: %t, %v, %v; want an internal error", alg, ok, res, err)
		}
		if got := n.Len(); got != 0 {
			t.Errorf("%s: %d instances after the error, want 0", alg, got)
		}
	}
}

// TestNodeParamsChange: an instance whose parameters or algorithm change
// starts fresh.
func TestNodeParamsChange(t *testing.T) {
	t.Parallel()
	n := NewNode(100)
	if ok, _ := mustDecide(t, n, us0, "r1", []NodeSpec{fw("a", 1, sec)}, true); !ok {
		t.Fatal("refused")
	}
	if ok, _ := mustDecide(t, n, us0, "r2", []NodeSpec{fw("a", 1, sec)}, true); ok {
		t.Fatal("admitted past the limit")
	}
	if ok, res := mustDecide(t, n, us0, "r3", []NodeSpec{fw("a", 2, sec)}, true); !ok || res[0].Remaining != 1 {
		t.Fatalf("limit raised to 2: %t %+v; want a fresh window, 1 remaining", ok, res)
	}
	gcra := NodeSpec{Key: "a", Alg: quota.AlgGCRA, Params: policyalg.Params{1, sec}, Weight: 1}
	if ok, _ := mustDecide(t, n, us0, "r4", []NodeSpec{gcra}, true); !ok {
		t.Fatal("another algorithm under the same key did not start fresh")
	}
	if n.Len() != 1 {
		t.Errorf("%d instances, want 1", n.Len())
	}
	// Undo with the old parameters finds nothing to undo.
	if err := n.Undo(us0, "r3", []NodeSpec{fw("a", 2, sec)}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := mustDecide(t, n, us0, "r5", []NodeSpec{gcra}, false); ok {
		t.Error("an Undo of the replaced instance gave room back")
	}
}

// held reports whether n holds key, and checks that its map and its LRU
// ring agree.
func held(t *testing.T, n *Node, key string) bool {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	count := 0
	for in := n.lru.next; in != &n.lru; in = in.next {
		if n.byKey[in.key] != in {
			t.Fatalf("ring holds %q, the map does not", in.key)
		}
		if in.next.prev != in {
			t.Fatal("ring broken")
		}
		count++
	}
	if count != len(n.byKey) {
		t.Fatalf("ring of %d, map of %d", count, len(n.byKey))
	}
	_, ok := n.byKey[key]
	return ok
}

// TestNodeEvictsIdleFirst: past the bound a new instance evicts the least
// recently used idle one; a busy one is kept while an idle one is near.
func TestNodeEvictsIdleFirst(t *testing.T) {
	t.Parallel()
	const bound = quota.MaxPoliciesPerRequest
	n := NewNode(1) // raised to the bound
	// k0..k3: hour windows (busy until the hour's end, at +60 s: t0 is
	// 23:59); k4..: 1 ms windows.
	for i := range bound {
		s := fw(fmt.Sprint("k", i), 5, 1000)
		if i < 4 {
			s = fw(fmt.Sprint("k", i), 5, 3600*sec)
		}
		mustDecide(t, n, us0, "r", []NodeSpec{s}, true)
	}
	later := us0 + sec
	mustDecide(t, n, later, "r", []NodeSpec{fw("new", 5, sec)}, true)
	if n.Len() != bound {
		t.Fatalf("%d held, want the bound %d", n.Len(), bound)
	}
	if held(t, n, "k4") || !held(t, n, "k0") || !held(t, n, "new") {
		t.Fatal("want k4 (the least recently used idle one) evicted, k0 (busy) and the new one held")
	}
	if got := remaining(t, n, later, fw("k0", 5, 3600*sec)); got != 4 {
		t.Errorf("k0 kept its window: %d remaining, want 4", got)
	}

	// A spray of keys with every instance busy: the least recently used
	// goes all the same, and the bound holds.
	n = NewNode(bound)
	for i := range 50 * bound {
		mustDecide(t, n, us0, "r", []NodeSpec{fw(fmt.Sprint("s", i), 5, 3600*sec)}, true)
		if n.Len() > bound {
			t.Fatalf("after %d keys: %d held, more than %d", i+1, n.Len(), bound)
		}
	}
	if held(t, n, fmt.Sprint("s", 50*bound-bound-1)) || !held(t, n, fmt.Sprint("s", 50*bound-bound)) {
		t.Error("want exactly the last bound keys held")
	}
	// An evicted instance starts fresh.
	if got := remaining(t, n, us0, fw("s0", 5, 3600*sec)); got != 5 {
		t.Errorf("evicted s0: %d remaining, want a fresh 5", got)
	}
}

// TestNodeKeepsLeases: a concurrency instance is busy until its last
// lease ends (its Reset is when the first one does), so that eviction
// prefers an idle instance to it and its leases are not forgotten.
func TestNodeKeepsLeases(t *testing.T) {
	t.Parallel()
	const bound = quota.MaxPoliciesPerRequest
	n := NewNode(bound)
	base := us0 + 60*sec // midnight: the hour windows end an hour later
	for i := range bound - 2 {
		mustDecide(t, n, base, "r", []NodeSpec{fw(fmt.Sprint("busy", i), 5, 3600*sec)}, true)
	}
	c := NodeSpec{Key: "c", Alg: quota.AlgConcurrency, Params: policyalg.Params{2, 60 * sec}, Weight: 1}
	mustDecide(t, n, base, "lease1", []NodeSpec{c}, true)                     // ends at +60 s
	mustDecide(t, n, base+10*sec, "lease2", []NodeSpec{c}, true)              // ends at +70 s
	mustDecide(t, n, base+20*sec, "r", []NodeSpec{fw("idle", 5, 1000)}, true) // idle at +20.001 s
	mustDecide(t, n, base+65*sec, "r", []NodeSpec{fw("new", 5, sec)}, true)
	if !held(t, n, "c") || held(t, n, "idle") {
		t.Fatal("want the idle instance evicted, the one holding a lease until +70 s kept")
	}
	if ok, _ := mustDecide(t, n, base+65*sec, "lease3", []NodeSpec{c}, true); !ok {
		t.Fatal("refused with one live lease of 2")
	}
	if ok, _ := mustDecide(t, n, base+65*sec, "lease4", []NodeSpec{c}, true); ok {
		t.Fatal("lease2 was forgotten: a third lease admitted")
	}
}

// TestNodeKeepsTheCallsInstances: a call that makes as many instances as
// the bound evicts none of its own, and commits them all, even when every
// other instance is busy and its own new ones are idle.
func TestNodeKeepsTheCallsInstances(t *testing.T) {
	t.Parallel()
	const bound = quota.MaxPoliciesPerRequest
	n := NewNode(bound)
	var old, specs []NodeSpec
	for i := range bound {
		old = append(old, fw(fmt.Sprint("old", i), 5, 3600*sec)) // busy for the hour
		specs = append(specs, fw(fmt.Sprint("k", i), 5, 1000))
	}
	mustDecide(t, n, us0, "r0", old, true)
	// Half of the call's specs are held (touched first), half new.
	mixed := append(append([]NodeSpec{}, old[:bound/2]...), specs[:bound/2]...)
	if ok, _ := mustDecide(t, n, us0+sec, "r1", mixed, true); !ok {
		t.Fatal("refused")
	}
	for _, s := range mixed {
		if !held(t, n, s.Key) {
			t.Fatalf("%s, used by the call, was evicted", s.Key)
		}
	}
	// Every spec of the call new, the bound all taken.
	if ok, _ := mustDecide(t, n, us0+2*sec, "r2", specs, true); !ok {
		t.Fatal("refused")
	}
	for _, s := range specs {
		if got := remaining(t, n, us0+2*sec, s); got != 4 {
			t.Fatalf("%s: %d remaining, want 4 (committed, kept)", s.Key, got)
		}
	}
}

// TestNodeIsSafeForConcurrentUse: 64 goroutines on one fixed_window
// instance at one time admit exactly its limit (run with -race), while
// others spray keys past the bound and release leases.
func TestNodeIsSafeForConcurrentUse(t *testing.T) {
	t.Parallel()
	const workers, each, limit = 64, 50, 100
	n := NewNode(64)
	shared := fw("shared", limit, 60*sec)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range each {
				id := fmt.Sprint(w, "-", i)
				specs := []NodeSpec{shared}
				if r.IntN(2) == 0 { // another instance beside it: churns the bound
					specs = append(specs, fw(fmt.Sprint("other-", r.IntN(500)), 3, sec))
				}
				ok, res, err := n.Decide(us0, id, specs, true)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
				} else if len(specs) == 1 && res[0].OK {
					t.Error("refused with the shared window admitting")
				}
				if r.IntN(10) == 0 {
					if err := n.Release(us0, id, specs); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	// Every refusal of the shared window or of another; the shared one
	// admitted exactly its limit, whatever refused beside it.
	if got := remaining(t, n, us0, shared); got != 0 {
		t.Errorf("shared: %d remaining, want 0", got)
	}
	if n.Len() > 64 {
		t.Errorf("%d held, more than the bound", n.Len())
	}

	// And alone: exactly the limit admitted.
	n = NewNode(100)
	admitted.Store(0)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				ok, _, err := n.Decide(us0, fmt.Sprint(w, "-", i), []NodeSpec{shared}, true)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != limit {
		t.Fatalf("admitted %d of %d, want exactly the limit %d", got, workers*each, limit)
	}
}
