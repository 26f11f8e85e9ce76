package locallimit

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// us0 is the simulated clock's start in us since the epoch (t0, a whole
// second: bucket ids are multiples of 10 there).
var us0 = t0.UnixMicro()

const (
	ms = int64(time.Millisecond / time.Microsecond)
	bk = adaptiveBucket // 100 ms
)

func mustAdaptive(t *testing.T, maxConcurrency int64, target time.Duration) *Adaptive {
	t.Helper()
	a, err := NewAdaptive(maxConcurrency, target)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// complete runs n requests of latency lat that finish at now, one after
// the other, each admitted (none other is in flight when it asks).
func complete(t *testing.T, a *Adaptive, now, lat int64, n int) {
	t.Helper()
	for range n {
		if ok, _ := a.Acquire(now); !ok {
			t.Fatalf("a lone request at +%d ms was refused", (now-us0)/ms)
		}
		if err := a.Done(now, now-lat); err != nil {
			t.Fatal(err)
		}
	}
}

// limitAt returns the limit in force at now (in flight counts the requests
// it admits on the way: a limit is seen through an Acquire).
func limitAt(a *Adaptive, now int64) int64 {
	a.Acquire(now)
	_, lim := a.State()
	return lim
}

func TestNewAdaptiveRefusesBadBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		max    int64
		target time.Duration
		field  string
	}{
		{0, time.Second, "max_concurrency"},
		{-1, time.Second, "max_concurrency"},
		{quota.MaxConcurrencyLimit + 1, time.Second, "max_concurrency"},
		{10, 0, "target_latency_ms"},
		{10, -time.Second, "target_latency_ms"},
		{10, time.Duration(quota.MaxTargetLatencyMS+1) * time.Millisecond, "target_latency_ms"},
	} {
		a, err := NewAdaptive(tc.max, tc.target)
		var e *quota.Error
		if !errors.As(err, &e) || e.Code != quota.CodeInvalid || e.Field != tc.field || a != nil {
			t.Errorf("NewAdaptive(%d, %s) = %v, %v; want a CodeInvalid error on %s", tc.max, tc.target, a, err, tc.field)
		}
	}
	if _, err := NewAdaptive(quota.MaxConcurrencyLimit, quota.MaxTargetLatencyMS*time.Millisecond); err != nil {
		t.Errorf("the largest bounds: %v", err)
	}
}

// TestAdaptiveEstimate: while the latency is above the target, Acquire
// admits while in flight <= maxPass × minRT (and 2 at least), over the
// completed buckets of the last second.
func TestAdaptiveEstimate(t *testing.T) {
	t.Parallel()
	a := mustAdaptive(t, 1000, 20*time.Millisecond)
	// Three buckets: 10 completions of 40 ms, 25 of 60 ms, 5 of 25 ms.
	// maxPass = 25 a bucket = 250/s, minRT = 25 ms: the pipe is 6.25.
	complete(t, a, us0+bk/2, 40*ms, 10)
	complete(t, a, us0+bk+bk/2, 60*ms, 25)
	complete(t, a, us0+2*bk+bk/2, 25*ms, 5)
	now := us0 + 3*bk // the three are complete; recent latency 25 ms > 20 ms
	for i := range 7 {
		if ok, _ := a.Acquire(now); !ok {
			t.Fatalf("request %d refused with %d in flight, not more than 6.25", i+1, i)
		}
	}
	if in, lim := a.State(); in != 7 || lim != 7 {
		t.Fatalf("State() = %d, %d; want 7 in flight, limit 7 (⌊250/s × 25 ms⌋ + 1)", in, lim)
	}
	ok, retry := a.Acquire(now)
	if ok {
		t.Fatal("the 8th request was admitted with 7 in flight, past 6.25")
	}
	if retry != 100*time.Millisecond { // the recent latency, 25 ms, raised to a bucket
		t.Errorf("retry = %s, want 100ms", retry)
	}
	if in, _ := a.State(); in != 7 {
		t.Errorf("a refusal changed in flight to %d", in)
	}
}

// TestAdaptiveOneBucket pins the formula on one bucket: 30 completions of
// 50 ms in 100 ms are 300/s; × 50 ms = 15 in the pipe, so that the 16th
// request (15 in flight, not more than 15) passes and the 17th does not.
func TestAdaptiveOneBucket(t *testing.T) {
	t.Parallel()
	a := mustAdaptive(t, 1000, 10*time.Millisecond)
	complete(t, a, us0+10*ms, 50*ms, 30)
	if _, lim := a.State(); lim != 1000 {
		t.Fatalf("limit %d with no completed bucket, want MaxConcurrency 1000", lim)
	}
	now := us0 + bk // the bucket completed; recent latency 50 ms > 10 ms
	n := 0
	for ok := true; ok && n <= 1000; n++ {
		ok, _ = a.Acquire(now)
	}
	if n-1 != 16 {
		t.Fatalf("admitted %d, want ⌊300/s × 50 ms⌋ + 1 = 16", n-1)
	}
}

// TestAdaptiveBelowTargetAdmitsUpToMax (a): below the target latency the
// estimate is not enforced, however small; MaxConcurrency always is.
func TestAdaptiveBelowTargetAdmitsUpToMax(t *testing.T) {
	t.Parallel()
	history := func(a *Adaptive) { // a second of 2 completions a bucket at 10 ms: the pipe is 0.2
		for i := range int64(10) {
			complete(t, a, us0+i*bk+bk/2, 10*ms, 2)
		}
	}
	now := us0 + time.Second.Microseconds()

	a := mustAdaptive(t, 100, 50*time.Millisecond)
	history(a)
	for i := range 100 {
		if ok, _ := a.Acquire(now); !ok {
			t.Fatalf("request %d of 100 refused below the target latency", i+1)
		}
	}
	if in, lim := a.State(); in != 100 || lim != 100 {
		t.Fatalf("State() = %d, %d; want 100, 100", in, lim)
	}
	if ok, retry := a.Acquire(now); ok || retry != 100*time.Millisecond {
		t.Fatalf("the 101st: got %t, %s; want refused by MaxConcurrency, retry 100ms", ok, retry)
	}
	if err := a.Done(now+ms, now); err != nil {
		t.Fatal(err)
	}
	if ok, _ := a.Acquire(now + ms); !ok {
		t.Fatal("refused after a Done freed a slot")
	}

	// The same history above the target enforces the estimate: 2 in flight
	// (Sentinel's "in flight > 1").
	hot := mustAdaptive(t, 100, 5*time.Millisecond)
	history(hot)
	for i := range 2 {
		if ok, _ := hot.Acquire(now); !ok {
			t.Fatalf("request %d refused: the first two always pass", i+1)
		}
	}
	if ok, _ := hot.Acquire(now); ok {
		t.Fatal("above the target, a third request passed an estimate of 0.2")
	}
}

// TestAdaptiveGainsAndRecovery: the gain cycle of an armed check, then, a
// second after the latency was last above the target, the limit doubling
// back to MaxConcurrency.
func TestAdaptiveGainsAndRecovery(t *testing.T) {
	t.Parallel()
	a := mustAdaptive(t, 1000, 20*time.Millisecond)
	// Buckets 0..2 as in TestAdaptiveEstimate (pipe 6.25, limit 7, minRT
	// 25 ms); the window's mean latency, 50.6 ms, is one bucket long: one
	// draining bucket a second.
	complete(t, a, us0+bk/2, 40*ms, 10)
	complete(t, a, us0+bk+bk/2, 60*ms, 25)
	complete(t, a, us0+2*bk+bk/2, 25*ms, 5)
	for _, c := range []struct {
		at   int64 // us after us0
		want int64
	}{
		{3 * bk, 7},      // armed at +300 ms: the recent latency (buckets 2 and 3) is 25 ms
		{4 * bk, 7},      // the recent latency has no completion: armed since +300 ms
		{5 * bk, 8},      // probing: ⌊1.25 × 6.25⌋ + 1
		{6 * bk, 7},      //
		{10 * bk, 5},     // draining: ⌊0.75 × 6.25⌋ + 1; bucket 0 still in the window
		{11 * bk, 7},     // bucket 0 left the window; 1 and 2 still give 6.25
		{12 * bk, 2},     // bucket 2 alone: 5 × 10/s × 25 ms = 1.25
		{13*bk - 1, 2},   // a window after +300 ms, less 1 µs: still armed
		{13 * bk, 4},     // recovering: twice the held 2 ...
		{14*bk - 1, 4},   // ... for a step of max(100 ms, 2 × 25 ms)
		{14 * bk, 8},     //
		{18 * bk, 128},   //
		{20 * bk, 512},   // 2 << 8
		{21 * bk, 1000},  // 2 << 9 passes MaxConcurrency: recovered
		{100 * bk, 1000}, //
	} {
		if got := limitAt(a, us0+c.at); got != c.want {
			t.Errorf("+%.1f ms: limit %d, want %d", float64(c.at)/float64(ms), got, c.want)
		}
	}
	// Latency above the target arms it again, from the new window: 30
	// completions of 30 ms in bucket 100 are a pipe of 9.
	now := us0 + 100*bk
	for range 30 {
		if ok, _ := a.Acquire(now); !ok {
			t.Fatal("refused below MaxConcurrency while recovered")
		}
		if err := a.Done(now, now-30*ms); err != nil {
			t.Fatal(err)
		}
	}
	if got := limitAt(a, now+bk); got != 10 {
		t.Errorf("re-armed: limit %d, want ⌊9⌋ + 1 = 10", got)
	}
}

// TestAdaptiveRecoveryStep: the recovery doubles every 2 × minRT when that
// is longer than a bucket: a node whose requests take 80 ms is judged on
// latencies at most a few round trips old.
func TestAdaptiveRecoveryStep(t *testing.T) {
	t.Parallel()
	a := mustAdaptive(t, 1000, 50*time.Millisecond)
	complete(t, a, us0+bk/2, 80*ms, 20) // 200/s × 80 ms = 16: limit 17
	for _, c := range []struct{ at, want int64 }{
		{bk, 17},                 // armed, and hot at +100 ms (bucket 0 is the previous one)
		{11 * bk, 34},            // a window later: recovering, twice 17 ...
		{11*bk + 160*ms - 1, 34}, // ... for 2 × 80 ms
		{11*bk + 160*ms, 68},     //
	} {
		if got := limitAt(a, us0+c.at); got != c.want {
			t.Errorf("+%d ms: limit %d, want %d", c.at/ms, got, c.want)
		}
	}
}

// simRequest is a request in the simulated service: when it started (us)
// and the service's virtual time at which its work is done.
type simRequest struct {
	started int64
	done    float64
}

type simQueue []simRequest

func (q simQueue) Len() int           { return len(q) }
func (q simQueue) Less(i, j int) bool { return q[i].done < q[j].done }
func (q simQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)        { *q = append(*q, x.(simRequest)) }
func (q *simQueue) Pop() any {
	old := *q
	r := old[len(old)-1]
	*q = old[:len(old)-1]
	return r
}

// simPhase is a stretch of a simulation: rate arrivals per second for
// seconds.
type simPhase struct {
	seconds int
	rate    float64
}

// simSecond is what one simulated second saw.
type simSecond struct {
	inflight  float64 // mean, sampled every ms
	limit     float64 // mean of State's limit, sampled every ms
	completed int64
	meanLat   float64 // ms, of the requests completed in it
	maxLat    int64   // ms
	refused   int64
}

func (s simSecond) String() string {
	return fmt.Sprintf("in flight %7.1f (limit %6.1f), completed %4d, latency mean %7.1f ms max %5d ms, refused %5d",
		s.inflight, s.limit, s.completed, s.meanLat, s.maxLat, s.refused)
}

// simulate runs a service of `cores` processors that share their time
// among the requests in flight (processor sharing: a request's service
// time is its work × max(1, in flight / cores)), each request needing
// work us ±50 % (a seeded uniform draw) at full speed, behind a, with
// evenly spaced arrivals at the phases' rates, in steps of 1 ms of a
// simulated clock.
func simulate(a *Adaptive, cores float64, work int64, phases []simPhase) []simSecond {
	r := rand.New(rand.NewPCG(1, 2))
	var q simQueue
	var virtual, arrivals float64
	now := us0
	var out []simSecond
	for _, ph := range phases {
		for range ph.seconds {
			var s simSecond
			var latSum int64
			for range 1000 {
				now += ms
				virtual += float64(ms) * min(1, cores/float64(max(1, len(q))))
				for len(q) > 0 && q[0].done <= virtual {
					req := heap.Pop(&q).(simRequest)
					if err := a.Done(now, req.started); err != nil {
						panic(err) // the simulation's own bug
					}
					lat := (now - req.started) / ms
					s.completed++
					latSum += lat
					s.maxLat = max(s.maxLat, lat)
				}
				for arrivals += ph.rate / 1000; arrivals >= 1; arrivals-- {
					if ok, _ := a.Acquire(now); ok {
						heap.Push(&q, simRequest{started: now, done: virtual + float64(work)*(0.5+r.Float64())})
					} else {
						s.refused++
					}
				}
				_, lim := a.State()
				s.inflight += float64(len(q)) / 1000
				s.limit += float64(lim) / 1000
			}
			if s.completed > 0 {
				s.meanLat = float64(latSum) / float64(s.completed)
			}
			out = append(out, s)
		}
	}
	return out
}

// TestAdaptiveShedsOverload (b): 8 processors and 10 ms of work a request
// serve 800 requests a second with 8 in flight (the pipe). Two seconds at
// 400/s, then twenty at 1600/s. Without shedding, in flight and the
// latency grow without bound (800 more requests a second); with it, in
// flight settles near the estimate and the pipe, the node still completes
// about all it can, and the latency of the admitted requests stays below
// the target, its maximum within 3 × the target.
func TestAdaptiveShedsOverload(t *testing.T) {
	t.Parallel()
	const cores, work, target = 8, 10 * ms, 25 * time.Millisecond
	phases := []simPhase{{2, 400}, {20, 1600}}
	shed := simulate(mustAdaptive(t, 1000, target), cores, work, phases)
	// An unreachable target never arms the check: no shedding.
	none := simulate(mustAdaptive(t, quota.MaxConcurrencyLimit, quota.MaxTargetLatencyMS*time.Millisecond), cores, work, phases)
	for i := range shed {
		t.Logf("second %2d: shedding: %s | none: in flight %7.1f, latency mean %7.1f ms", i, shed[i], none[i].inflight, none[i].meanLat)
	}

	for i, s := range shed[:2] {
		if s.refused != 0 || s.maxLat > 2*work/ms {
			t.Errorf("second %d, below capacity: %s; want none refused, latency at most %d ms", i, s, 2*work/ms)
		}
	}
	for i := 5; i < len(shed); i++ { // a few seconds to settle
		s := shed[i]
		if s.inflight < cores || s.inflight > 2.5*cores || s.inflight > s.limit+1 {
			t.Errorf("second %d: %s; want in flight near the pipe of %d (%d to %d) and at most the limit", i, s, cores, cores, 5*cores/2)
		}
		if s.completed < 720 {
			t.Errorf("second %d: %s; want at least 90%% of the 800 the node can complete", i, s)
		}
		if s.meanLat > float64(target/time.Millisecond) || s.maxLat > 3*int64(target/time.Millisecond) {
			t.Errorf("second %d: %s; want the latency below the target %s, its max within 3 ×", i, s, target)
		}
		if s.refused < 700 {
			t.Errorf("second %d: %s; want about the 800 a second the node cannot serve refused", i, s)
		}
	}

	// Without shedding: nothing refused, and in flight and the latency
	// keep growing.
	for i, s := range none {
		if s.refused != 0 {
			t.Fatalf("second %d: %d refused with the check never armed", i, s.refused)
		}
	}
	for i := 4; i < len(none); i++ {
		if none[i].meanLat < none[i-2].meanLat+1000 || none[i].inflight < none[i-1].inflight+700 {
			t.Errorf("second %d without shedding: %s; want in flight and the latency growing (700 a second, 1 s in 2 s)", i, none[i])
		}
	}
	if last := none[len(none)-1]; last.meanLat < 100*shed[len(shed)-1].meanLat {
		t.Errorf("last second: latency %.1f ms without shedding, %.1f ms with; want 100 × more", last.meanLat, shed[len(shed)-1].meanLat)
	}
}

// TestAdaptiveSettles: overloads of other shapes, 25 seconds each, the
// last 15 judged. The gain cycle keeps the estimate at the pipe whether
// the overload is mild or strong, and whether the target is above the
// node's unloaded latency or below it (the check then never disarms):
// without it the limit drifted up without end at 5 × (and the latency with
// it), or collapsed to 2 with the target below the unloaded latency.
func TestAdaptiveSettles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		cores       float64
		work        int64
		target      time.Duration
		rate        float64
		minThr      float64 // of the node's capacity
		maxMeanLat  float64 // × the target
		maxInFlight float64 // × the pipe
	}{
		{"5 × overload", 8, 10 * ms, 25 * time.Millisecond, 4000, 0.9, 1, 2.5},
		{"target below the unloaded latency", 8, 10 * ms, 5 * time.Millisecond, 1600, 0.85, 3, 1.5},
		{"wide pipe", 100, 20 * ms, 30 * time.Millisecond, 15000, 0.9, 1, 1.5},
		{"slow service", 4, 100 * ms, 150 * time.Millisecond, 80, 0.7, 1.5, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			capacity := tc.cores * 1e6 / float64(tc.work)
			s := simulate(mustAdaptive(t, quota.MaxConcurrencyLimit, tc.target), tc.cores, tc.work,
				[]simPhase{{2, tc.rate / 4}, {25, tc.rate}})
			var inflight, lat, done float64
			var maxLat int64
			for _, x := range s[12:] {
				inflight += x.inflight / 15
				lat += x.meanLat / 15
				done += float64(x.completed) / 15
				maxLat = max(maxLat, x.maxLat)
			}
			t.Logf("last 15 s: in flight %.1f (pipe %.0f), latency mean %.1f ms max %d ms, completed %.0f/s of %.0f",
				inflight, tc.cores, lat, maxLat, done, capacity)
			if done < tc.minThr*capacity {
				t.Errorf("completed %.0f/s, want at least %.0f%% of %.0f", done, 100*tc.minThr, capacity)
			}
			if want := tc.maxMeanLat * float64(tc.target/time.Millisecond); lat > want {
				t.Errorf("mean latency %.1f ms, want at most %.1f", lat, want)
			}
			if inflight > tc.maxInFlight*tc.cores {
				t.Errorf("%.1f in flight, want at most %.1f × the pipe %.0f", inflight, tc.maxInFlight, tc.cores)
			}
		})
	}
}

// TestAdaptiveDoneWithoutAcquire: a Done with nothing in flight is
// refused and records nothing; odd times do not panic.
func TestAdaptiveDoneWithoutAcquire(t *testing.T) {
	t.Parallel()
	a := mustAdaptive(t, 3, time.Millisecond)
	if err := a.Done(us0, us0); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("Done without Acquire: %v, want ErrNotInFlight", err)
	}
	if in, lim := a.State(); in != 0 || lim != 3 {
		t.Fatalf("State() = %d, %d; want 0, 3", in, lim)
	}
	for _, tm := range [][2]int64{{us0, us0 + 5*ms}, {-5, 1 << 62}, {1 << 62, -1 << 62}, {0, 0}, {-1 << 63, 1<<63 - 1}, {1<<63 - 1, -1 << 63}} {
		if ok, _ := a.Acquire(tm[0]); !ok {
			t.Fatalf("Acquire(%d) refused a lone request", tm[0])
		}
		if err := a.Done(tm[0], tm[1]); err != nil {
			t.Fatalf("Done(%d, %d): %v", tm[0], tm[1], err)
		}
	}
	if err := a.Done(us0, us0); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("a second Done: %v, want ErrNotInFlight", err)
	}
	if in, _ := a.State(); in != 0 {
		t.Fatalf("in flight %d, want 0", in)
	}
}

// TestAdaptiveIsSafeForConcurrentUse (c): 64 goroutines on a shared
// simulated clock (run with -race). First each acquires one request and
// holds it until all have asked: exactly MaxConcurrency are admitted. Then
// they acquire and finish at random: in flight never goes below 0 or past
// MaxConcurrency, admissions equal completions, and it returns to 0.
func TestAdaptiveIsSafeForConcurrentUse(t *testing.T) {
	t.Parallel()
	const workers, each, maxC = 64, 300, 20
	a := mustAdaptive(t, maxC, 2*time.Millisecond)
	var clock atomic.Int64
	clock.Store(us0)
	var held, admitted, refused, done atomic.Int64
	var asked, wg sync.WaitGroup
	asked.Add(workers)
	for w := range workers {
		wg.Go(func() {
			start := clock.Load()
			ok, _ := a.Acquire(start)
			if ok {
				held.Add(1)
			}
			asked.Done()
			asked.Wait()
			if ok {
				if err := a.Done(start, start); err != nil {
					t.Error(err)
				}
			}

			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range each {
				start := clock.Add(r.Int64N(200))
				ok, retry := a.Acquire(start)
				if !ok {
					refused.Add(1)
					if retry <= 0 {
						t.Errorf("refused with retry %s", retry)
					}
					continue
				}
				admitted.Add(1)
				if in, lim := a.State(); in < 1 || in > maxC || lim < 1 || lim > maxC {
					t.Errorf("State() = %d, %d while holding a request; want 1..%d", in, lim, maxC)
				}
				end := clock.Add(r.Int64N(5 * ms))
				if err := a.Done(end, start); err != nil {
					t.Error(err)
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if got := held.Load(); got != maxC {
		t.Errorf("%d of %d held at once, want MaxConcurrency %d", got, workers, maxC)
	}
	if in, _ := a.State(); in != 0 {
		t.Errorf("in flight %d after every Done, want 0", in)
	}
	if admitted.Load() != done.Load() || admitted.Load()+refused.Load() != workers*each || admitted.Load() == 0 {
		t.Errorf("admitted %d, done %d, refused %d of %d", admitted.Load(), done.Load(), refused.Load(), workers*each)
	}
	if err := a.Done(clock.Load(), clock.Load()); !errors.Is(err, ErrNotInFlight) {
		t.Errorf("one more Done: %v, want ErrNotInFlight", err)
	}
}

// TestAdaptiveCancelLeavesNoTrace: a cancelled request frees its place and
// counts neither a completion nor a latency.
func TestAdaptiveCancelLeavesNoTrace(t *testing.T) {
	a, err := NewAdaptive(2, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if ok, _ := a.Acquire(1_000_000); !ok {
			t.Fatal("refused below max_concurrency")
		}
	}
	if ok, _ := a.Acquire(1_000_000); ok {
		t.Fatal("admitted past max_concurrency")
	}
	if err := a.Cancel(); err != nil {
		t.Fatal(err)
	}
	if inflight, _ := a.State(); inflight != 1 {
		t.Fatalf("in flight %d after a cancel, want 1", inflight)
	}
	if ok, _ := a.Acquire(1_000_001); !ok {
		t.Fatal("the cancelled place was not freed")
	}
	for range 2 {
		if err := a.Cancel(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Cancel(); err != ErrNotInFlight {
		t.Fatalf("cancel with nothing in flight: %v, want ErrNotInFlight", err)
	}
	for _, b := range a.buckets {
		if b.pass != 0 || b.rtSum != 0 {
			t.Fatalf("a cancel counted in the window: %+v", b)
		}
	}
}
