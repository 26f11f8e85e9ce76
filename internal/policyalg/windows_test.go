package policyalg

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// winBase is a time like the scripts see (2027-01-15), aligned to 10 s.
const winBase = int64(1_800_000_000_000_000)

// winStep is one call on a model and the Result Check must give (Commit
// follows when it admits).
type winStep struct {
	op   string // "admit" (Check, then Commit when OK), "check", "undo", "release"
	now  int64
	w    int64
	id   string
	want Result
}

func winRun(t *testing.T, m KeyModel, steps []winStep) {
	t.Helper()
	for i, s := range steps {
		switch s.op {
		case "undo":
			m.Undo(s.now, s.w, s.id)
			continue
		case "release":
			m.Release(s.now, s.id)
			continue
		}
		got := m.Check(s.now, s.w)
		if got != s.want {
			t.Fatalf("step %d (%s at +%d us, w=%d): got %+v, want %+v", i, s.op, s.now-winBase, s.w, got, s.want)
		}
		if s.op == "admit" && got.OK {
			m.Commit(s.now, s.w, s.id)
		}
	}
}

func winOK(limit, remaining, reset int64) Result {
	return Result{OK: true, Limit: limit, Remaining: remaining, Reset: reset}
}

func winNo(retry, limit, remaining, reset int64) Result {
	return Result{Retry: retry, Limit: limit, Remaining: remaining, Reset: reset}
}

func TestNewKnowsTheWindowAlgorithms(t *testing.T) {
	t.Parallel()
	for _, alg := range []quota.Algorithm{quota.AlgFixedWindow, quota.AlgSlidingLog, quota.AlgSlidingWindow, quota.AlgConcurrency} {
		m, err := New(alg, Params{1, 1e6, 1})
		if err != nil {
			t.Fatalf("New(%s): %v", alg, err)
		}
		if _, ok := m.(KeyModel); !ok {
			t.Errorf("New(%s) is a %T, not a KeyModel", alg, m)
		}
		if r := m.Check(winBase, 1); !r.OK {
			t.Errorf("%s: a fresh model refuses 1 of 1: %+v", alg, r)
		}
	}
}

func TestFixedWindowScenario(t *testing.T) {
	t.Parallel()
	const w = 10_000_000 // 10 s, winBase is a window's start
	m := NewFixedWindow(Params{3, w})
	winRun(t, m, []winStep{
		{op: "admit", now: winBase + 1e6, w: 2, id: "a", want: winOK(3, 1, winBase+w)},
		{op: "admit", now: winBase + 2e6, w: 2, id: "b", want: winNo(8e6, 3, 1, winBase+w)},
		{op: "admit", now: winBase + 2e6, w: 1, id: "c", want: winOK(3, 0, winBase+w)},
		{op: "check", now: winBase + w - 1, w: 1, want: winNo(1, 3, 0, winBase+w)},
		{op: "check", now: winBase + 5e6, w: 4, want: winNo(-1, 3, 0, winBase+w)},
		// the next window is empty: L more at its start (2L within 1 us)
		{op: "admit", now: winBase + w, w: 3, id: "d", want: winOK(3, 0, winBase+2*w)},
		// undo of an admission of the last window: the key holds this one
		{op: "undo", now: winBase + 1e6, w: 2, id: "a"},
		{op: "check", now: winBase + w + 1, w: 1, want: winNo(w-1, 3, 0, winBase+2*w)},
		{op: "undo", now: winBase + w, w: 1, id: "d"},
		{op: "check", now: winBase + w + 1, w: 2, want: winNo(w-1, 3, 1, winBase+2*w)},
	})
	if got, want := m.KeyState(), fmt.Sprintf("%d,2", (winBase+w)/w); got != want {
		t.Errorf("key %q, want %q", got, want)
	}
	if at, ok := m.KeyExpiry(); !ok || at != winBase+2*w {
		t.Errorf("expiry %d %t, want %d", at, ok, winBase+2*w)
	}
	m.Undo(winBase+w, 2, "d")
	if m.KeyState() != "" {
		t.Errorf("key %q after undoing everything, want none", m.KeyState())
	}
}

func TestSlidingLogScenario(t *testing.T) {
	t.Parallel()
	const w = 10_000_000
	m := NewSlidingLog(Params{5, w})
	winRun(t, m, []winStep{
		{op: "admit", now: winBase, w: 2, id: "a", want: winOK(5, 3, winBase+w)},
		{op: "admit", now: winBase + 3e6, w: 2, id: "b", want: winOK(5, 1, winBase+3e6+w)},
		// 4 + 3 > 5: 2 must leave; a (2 units) leaves at winBase + w
		{op: "check", now: winBase + 4e6, w: 3, want: winNo(6e6, 5, 1, winBase+3e6+w)},
		// 4 + 4 > 5: 3 must leave: a and b
		{op: "check", now: winBase + 4e6, w: 4, want: winNo(9e6, 5, 1, winBase+3e6+w)},
		{op: "check", now: winBase + 4e6, w: 6, want: winNo(-1, 5, 1, winBase+3e6+w)},
		{op: "check", now: winBase + w - 1, w: 3, want: winNo(1, 5, 1, winBase+3e6+w)},
	})
	if got, want := m.KeyState(), fmt.Sprintf("#=-4 2|a=%d 2|b=%d", winBase, winBase+3e6); got != want {
		t.Errorf("key %q, want %q", got, want)
	}
	winRun(t, m, []winStep{
		{op: "admit", now: winBase + w, w: 3, id: "c", want: winOK(5, 0, winBase+2*w)},
		{op: "undo", now: winBase + w, w: 2, id: "b"},
		{op: "undo", now: winBase + w, w: 3, id: "zz"}, // never logged: nothing
		{op: "check", now: winBase + w, w: 2, want: winOK(5, 0, winBase+2*w)},
	})
	if got, want := m.KeyState(), fmt.Sprintf("#=-3 3|c=%d", winBase+w); got != want {
		t.Errorf("key %q, want %q", got, want)
	}
	if at, ok := m.KeyExpiry(); !ok || at != winBase+2*w {
		t.Errorf("expiry %d %t, want %d", at, ok, winBase+2*w)
	}
	// a's entry left (and was dropped): its undo finds nothing; an id logged
	// again with the same weight moves, counted once
	m.Undo(winBase, 2, "a")
	m.Commit(winBase+w+5, 3, "c")
	if got, want := m.KeyState(), fmt.Sprintf("#=-3 3|c=%d", winBase+w+5); got != want {
		t.Errorf("key %q, want %q", got, want)
	}
}

func TestSlidingWindowScenario(t *testing.T) {
	t.Parallel()
	const w, bw = 10_000_000, 2_000_000 // 5 buckets of 2 s; winBase is a bucket's start
	i0 := winBase / bw
	m := NewSlidingWindow(Params{10, w, 5})
	winRun(t, m, []winStep{
		{op: "admit", now: winBase + 5e5, w: 6, id: "a", want: winOK(10, 4, winBase+12e6)},
		// E = 2e6 × 6 <= (10 - 4) × 2e6
		{op: "admit", now: winBase + 1e6, w: 4, id: "b", want: winOK(10, 0, winBase+12e6)},
		// four buckets later bucket i0 still counts in full: E = 10 bw; in
		// bucket i0+5, E = 10 (bw - off) <= 9 bw from offset 2e5
		{op: "check", now: winBase + 8e6 + 1, w: 1, want: winNo(2.2e6-1, 10, 0, winBase+12e6)},
		// in bucket i0+5 at offset 1e6: E = 10 × (2e6 - 1e6) = 1e7, ceil(E/bw) = 5
		// w = 6 needs E <= 4 bw = 8e6: offset >= 2e6 - 8e6/10 = 1.2e6
		{op: "check", now: winBase + 11e6, w: 6, want: winNo(2e5, 10, 5, winBase+12e6)},
		{op: "check", now: winBase + 11.2e6 - 1, w: 6, want: winNo(1, 10, 5, winBase+12e6)},
		{op: "check", now: winBase + 11.2e6, w: 6, want: winOK(10, 0, winBase+22e6)},
		{op: "check", now: winBase + 5e6, w: 11, want: winNo(-1, 10, 0, winBase+12e6)},
		{op: "admit", now: winBase + 11e6, w: 5, id: "c", want: winOK(10, 0, winBase+22e6)},
	})
	if got, want := m.KeyState(), fmt.Sprintf("%d=10 %d=5", i0, i0+5); got != want {
		t.Errorf("key %q, want %q", got, want)
	}
	// a bucket older than i-N goes at the next check
	m.Check(winBase+12e6, 1)
	if got, want := m.KeyState(), fmt.Sprintf("%d=5", i0+5); got != want {
		t.Errorf("key %q, want %q", got, want)
	}
	if at, ok := m.KeyExpiry(); !ok || at != winBase+22e6 {
		t.Errorf("expiry %d %t, want %d", at, ok, winBase+22e6)
	}
	m.Undo(winBase+11e6, 2, "c")
	m.Undo(winBase+1e6, 2, "a") // bucket i0 is gone: nothing
	if got, want := m.KeyState(), fmt.Sprintf("%d=3", i0+5); got != want {
		t.Errorf("key %q after undo, want %q", got, want)
	}
	m.Undo(winBase+11e6, 3, "c")
	if _, ok := m.KeyExpiry(); ok || m.KeyState() != "" {
		t.Errorf("key %q after undoing everything, want none", m.KeyState())
	}
}

// TestSlidingWindowTightBound reaches the bound of an interval of length
// W: L units at the last us of bucket j, then at offset bw-2 of bucket j+N
// L - ceil(2L/bw) more, 2L - ceil(2L/bw) within W us.
func TestSlidingWindowTightBound(t *testing.T) {
	t.Parallel()
	const limit, bw, n int64 = 10, 4, 3
	m := NewSlidingWindow(Params{limit, bw * n, n})
	j := winBase / bw
	first := j*bw + bw - 1
	for range limit {
		if !m.Check(first, 1).OK {
			t.Fatal("the first L units are refused")
		}
		m.Commit(first, 1, "")
	}
	last, more := (j+n)*bw+bw-2, int64(0)
	for m.Check(last, 1).OK {
		m.Commit(last, 1, "")
		more++
	}
	if last-first >= bw*n {
		t.Fatalf("the two times are %d us apart, not within W = %d", last-first, bw*n)
	}
	if want := limit - (2*limit+bw-1)/bw; more != want {
		t.Fatalf("%d more units at offset bw-2 of bucket j+N, want L - ceil(2L/bw) = %d", more, want)
	}
}

func TestConcurrencyScenario(t *testing.T) {
	t.Parallel()
	const lease = 5_000_000
	m := NewConcurrency(Params{2, lease})
	winRun(t, m, []winStep{
		{op: "admit", now: winBase, w: 1, id: "a", want: winOK(2, 1, winBase+lease)},
		{op: "admit", now: winBase + 1e6, w: 1, id: "b", want: winOK(2, 0, winBase+lease)},
		{op: "admit", now: winBase + 2e6, w: 1, id: "c", want: winNo(3e6, 2, 0, winBase+lease)},
		{op: "release", now: winBase + 2e6, id: "a"},
		{op: "admit", now: winBase + 2e6, w: 1, id: "c", want: winOK(2, 0, winBase+1e6+lease)},
		// b's lease ends at +6 s, c's at +7 s: both gone at +7 s
		{op: "check", now: winBase + 7e6 - 1, w: 1, want: winOK(2, 0, winBase+7e6)},
		{op: "admit", now: winBase + 7e6, w: 1, id: "d", want: winOK(2, 1, winBase+7e6+lease)},
	})
	if got, want := m.KeyState(), fmt.Sprintf("d=%d", winBase+7e6+lease); got != want {
		t.Errorf("key %q, want %q", got, want)
	}
	m.Commit(winBase+8e6, 1, "e")
	m.Commit(winBase+8e6, 1, "f") // over the limit (as after a limit change)
	m.Commit(winBase+7e6, 1, "f") // an id admitted again holds one slot, its lease moved
	m.Commit(winBase+8e6, 1, "f")
	m.limit = 1
	// 3 held, 1 allowed: the 3rd earliest (of d, e, f) must end
	if got, want := m.Check(winBase+8e6, 1), winNo(5e6, 1, 0, winBase+13e6); got != want {
		t.Errorf("lowered limit: got %+v, want %+v", got, want)
	}
	m.limit = 0
	if got, want := m.Check(winBase+8e6, 1), winNo(-1, 0, 0, winBase+8e6); got != want {
		t.Errorf("limit 0: got %+v, want %+v", got, want)
	}
	if at, ok := m.KeyExpiry(); !ok || at != winBase+13e6 {
		t.Errorf("expiry %d %t, want %d", at, ok, winBase+13e6)
	}
	for _, id := range []string{"d", "e", "f"} {
		m.Release(winBase+9e6, id)
	}
	if _, ok := m.KeyExpiry(); ok {
		t.Error("the key exists without a lease")
	}
}

// winRand is a generator seeded from POLICYALG_SEED (to replay a failure)
// or at random; the seed is printed when the test fails.
func winRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("POLICYALG_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("POLICYALG_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("rerun with POLICYALG_SEED=%d", seed)
		}
	})
	return rand.New(rand.NewPCG(seed, 0x3117d0))
}

// winParams draws small parameters of alg, so that refusals are common.
func winParams(rng *rand.Rand, alg quota.Algorithm) Params {
	limit := 1 + rng.Int64N(12)
	switch alg {
	case quota.AlgSlidingWindow:
		n := []int64{1, 2, 3, 4, 5, 10}[rng.IntN(6)]
		bw := []int64{1, 2, 3, 7, 1000, 250_000, 1_000_000}[rng.IntN(7)]
		return Params{limit, n * bw, n}
	case quota.AlgConcurrency:
		return Params{1 + rng.Int64N(5), 1 + rng.Int64N(3_000_000)}
	}
	return Params{limit, []int64{1, 5, 1000, 1_000_000, 3_000_000}[rng.IntN(5)]}
}

// winGap mixes bursts, gaps within a window and gaps across several.
func winGap(rng *rand.Rand, window int64) int64 {
	switch x := rng.IntN(10); {
	case x < 3:
		return 0
	case x < 8:
		return rng.Int64N(window/4 + 1)
	default:
		return rng.Int64N(3*window + 1)
	}
}

// winWeight is mostly 1, sometimes up to the limit and beyond.
func winWeight(rng *rand.Rand, alg quota.Algorithm, limit int64) int64 {
	if alg == quota.AlgConcurrency || rng.IntN(2) == 0 {
		return 1
	}
	return 1 + rng.Int64N(limit+2)
}

type winAdmission struct {
	t, w, end int64
	id        string
}

// TestWindowBounds admits random schedules (time never going back) and
// holds each algorithm to the bound it guarantees, in every window.
func TestWindowBounds(t *testing.T) {
	t.Parallel()
	rng := winRand(t)
	for _, alg := range []quota.Algorithm{quota.AlgFixedWindow, quota.AlgSlidingLog, quota.AlgSlidingWindow, quota.AlgConcurrency} {
		for s := range 200 {
			p := winParams(rng, alg)
			m, _ := New(alg, p)
			limit, window := p[0], p[1]
			now := winBase + rng.Int64N(window)
			var adm []winAdmission
			for i := range 300 {
				now += winGap(rng, window)
				if alg == quota.AlgConcurrency && len(adm) > 0 && rng.IntN(4) == 0 {
					// release a random lease that is still held
					if a := &adm[rng.IntN(len(adm))]; a.end > now {
						a.end = now
						m.Release(now, a.id)
					}
				}
				w := winWeight(rng, alg, limit)
				if !m.Check(now, w).OK {
					continue
				}
				id := strconv.Itoa(i)
				m.Commit(now, w, id)
				adm = append(adm, winAdmission{t: now, w: w, end: now + window, id: id})
			}
			if len(adm) == 0 {
				t.Fatalf("%s %v schedule %d: nothing admitted", alg, p, s)
			}
			if msg := winCheckBounds(alg, p, adm); msg != "" {
				t.Fatalf("%s %v schedule %d: %s", alg, p, s, msg)
			}
		}
	}
}

// winCheckBounds returns what exceeds alg's bound in adm ("" when nothing
// does). The most units in an interval of length d is reached by one that
// starts at an admission, so those are the intervals checked.
func winCheckBounds(alg quota.Algorithm, p Params, adm []winAdmission) string {
	limit, window := p[0], p[1]
	// units in [from, to)
	units := func(from, to int64) int64 {
		var u int64
		for _, a := range adm {
			if a.t >= from && a.t < to {
				u += a.w
			}
		}
		return u
	}
	for _, a := range adm {
		switch alg {
		case quota.AlgFixedWindow:
			x := windowFloor(a.t, window) * window
			if u := units(x, x+window); u > limit {
				return fmt.Sprintf("%d units in the aligned window at %d, limit %d", u, x, limit)
			}
			if u := units(a.t, a.t+window); u > 2*limit {
				return fmt.Sprintf("%d units in [%d, +W), over 2L = %d", u, a.t, 2*limit)
			}
		case quota.AlgSlidingLog:
			if u := units(a.t, a.t+window); u > limit {
				return fmt.Sprintf("%d units in [%d, +W), over L = %d", u, a.t, limit)
			}
		case quota.AlgSlidingWindow:
			n := p[2]
			bw := window / n
			if u := units(a.t, a.t+(n-1)*bw+1); u > limit {
				return fmt.Sprintf("%d units within (N-1)bw = %d us of %d, over L = %d", u, (n-1)*bw, a.t, limit)
			}
			bound := max(limit, 2*limit-windowCeil(2*limit, bw))
			if u := units(a.t, a.t+window); u > bound {
				return fmt.Sprintf("%d units in [%d, +W), over max(L, 2L - ceil(2L/bw)) = %d", u, a.t, bound)
			}
		case quota.AlgConcurrency:
			held := int64(0)
			for _, b := range adm {
				if b.t <= a.t && a.t < b.end {
					held++
				}
			}
			if held > limit {
				return fmt.Sprintf("%d leases held at %d, limit %d", held, a.t, limit)
			}
		}
	}
	return ""
}

// winClone returns a deep copy of a window model.
func winClone(m Model) Model {
	switch m := m.(type) {
	case *FixedWindow:
		c := *m
		return &c
	case *SlidingLog:
		c := *m
		c.entries, c.at = slices.Clone(m.entries), maps.Clone(m.at)
		return &c
	case *SlidingWindow:
		c := *m
		c.buckets = maps.Clone(m.buckets)
		return &c
	case *Concurrency:
		c := *m
		c.ends, c.order = maps.Clone(m.ends), slices.Clone(m.order)
		return &c
	}
	panic(fmt.Sprintf("no clone of %T", m))
}

// TestWindowRetryIsExact: after a refusal with retry r >= 0, the same
// request at now + r passes when nothing else happened, and (r > 0) at
// now + r - 1 it does not; a retry of -1 is given only when w exceeds the
// limit, and then the request passes never. Check itself decides nothing:
// twice in a row it answers the same.
func TestWindowRetryIsExact(t *testing.T) {
	t.Parallel()
	rng := winRand(t)
	refusals := map[quota.Algorithm]int{}
	for _, alg := range []quota.Algorithm{quota.AlgFixedWindow, quota.AlgSlidingLog, quota.AlgSlidingWindow, quota.AlgConcurrency} {
		for s := range 200 {
			p := winParams(rng, alg)
			m, _ := New(alg, p)
			now := winBase + rng.Int64N(p[1])
			for i := range 200 {
				now += winGap(rng, p[1])
				w := winWeight(rng, alg, p[0])
				r := m.Check(now, w)
				if again := m.Check(now, w); again != r {
					t.Fatalf("%s %v schedule %d step %d: Check answered %+v, then %+v", alg, p, s, i, r, again)
				}
				if r.OK {
					m.Commit(now, w, fmt.Sprint(i))
					continue
				}
				refusals[alg]++
				if r.Retry < 0 {
					if w <= p[0] {
						t.Fatalf("%s %v schedule %d step %d: retry -1 for w %d <= limit", alg, p, s, i, w)
					}
					if winClone(m).Check(now+1e12, w).OK {
						t.Fatalf("%s %v schedule %d step %d: retry -1, but it passes later", alg, p, s, i)
					}
					continue
				}
				if r.Retry == 0 {
					t.Fatalf("%s %v schedule %d step %d: refused with retry 0", alg, p, s, i)
				}
				if got := winClone(m).Check(now+r.Retry, w); !got.OK {
					t.Fatalf("%s %v schedule %d step %d: refused at %d w=%d with retry %d, refused again then: %+v",
						alg, p, s, i, now, w, r.Retry, got)
				}
				if got := winClone(m).Check(now+r.Retry-1, w); got.OK {
					t.Fatalf("%s %v schedule %d step %d: refused at %d w=%d with retry %d, but it passes a us sooner",
						alg, p, s, i, now, w, r.Retry)
				}
			}
		}
	}
	for alg, n := range refusals {
		if n < 100 {
			t.Errorf("%s: only %d refusals: the schedules no longer test the retry", alg, n)
		}
	}
}

// TestSlidingWindowRetryWalksLongIdle: with many buckets and only the
// oldest full, the retry is found near the far end of the walk.
func TestSlidingWindowRetryWalksLongIdle(t *testing.T) {
	t.Parallel()
	const n, bw = 3600, 1000
	m := NewSlidingWindow(Params{100, n * bw, n})
	start := winBase
	m.Commit(start, 100, "a")
	now := start + (n-1)*bw + 500 // the last bucket in which a counts fully
	r := m.Check(now, 1)
	// in bucket i0+N: E = 100 × (bw - off) <= 99 bw  <=>  off >= 10
	if want := (winBase/bw+n)*bw + 10 - now; r.OK || r.Retry != want {
		t.Fatalf("got %+v, want a retry of %d", r, want)
	}
}
