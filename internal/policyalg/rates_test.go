package policyalg

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

const rateT0 = int64(1_800_000_000_000_000) // us: 2027-01-15, a time like the scripts see

// rateStep is one decision of a scenario: at now (us after rateT0), weight w, what
// Check must answer, and whether to commit it.
type rateStep struct {
	at, w int64
	want  Result
}

// runRateSteps checks and commits each step on m (a refusal commits nothing).
func runRateSteps(t *testing.T, m Model, steps []rateStep) {
	t.Helper()
	for i, s := range steps {
		got := m.Check(rateT0+s.at, s.w)
		want := s.want
		if want.Reset != 0 {
			want.Reset += rateT0
		}
		if got != want {
			t.Fatalf("step %d (at +%dus, w %d): got %+v, want %+v", i, s.at, s.w, got, want)
		}
		if got.OK {
			m.Commit(rateT0+s.at, s.w, "")
		}
	}
}

func rateOK(limit, remaining, reset int64) Result {
	return Result{OK: true, Limit: limit, Remaining: remaining, Reset: reset}
}

func rateRefused(retry, limit, remaining, reset int64) Result {
	return Result{Retry: retry, Limit: limit, Remaining: remaining, Reset: reset}
}

func TestNewKnowsTheRateAlgorithms(t *testing.T) {
	t.Parallel()
	for _, alg := range []quota.Algorithm{quota.AlgTokenBucket, quota.AlgGCRA, quota.AlgLeakyBucket, quota.AlgWarmUp} {
		m, err := New(alg, Params{3, 1000, 3})
		if err != nil {
			t.Fatalf("New(%s): %v", alg, err)
		}
		if r := m.Check(rateT0, 1); !r.OK {
			t.Errorf("%s: a fresh model refuses its first request: %+v", alg, r)
		}
	}
}

func TestTokenBucketScenario(t *testing.T) {
	t.Parallel()
	// capacity 3, one unit per ms
	m := NewTokenBucket(Params{3, 1000})
	runRateSteps(t, m, []rateStep{
		{0, 1, rateOK(3, 2, 1000)},
		{0, 2, rateOK(3, 0, 3000)},
		{0, 1, rateRefused(1000, 3, 0, 3000)},
		{0, 4, rateRefused(-1, 3, 0, 3000)},     // more than the capacity: never
		{500, 1, rateRefused(500, 3, 0, 3000)},  // half a token back
		{1000, 1, rateOK(3, 0, 4000)},           // one token back, taken
		{2500, 2, rateRefused(500, 3, 1, 4000)}, // 1.5 tokens there
		{3000, 2, rateOK(3, 0, 6000)},
		{9000, 3, rateOK(3, 0, 12000)}, // full again (never more than the capacity)
	})
	m.Undo(rateT0+9000, 2, "")
	if r := m.Check(rateT0+9000, 2); r != rateOK(3, 0, rateT0+12000) {
		t.Fatalf("after an undo of 2: %+v", r)
	}
	// The clamp: a FULL written (at +0) under a slower refill is read as
	// the most indebted state the current limits allowed then: one unit's
	// wait, not 3 s, and the retry is true.
	c := NewTokenBucket(Params{3, 1_000_000})
	c.Commit(rateT0, 3, "")
	c.Reparam(Params{3, 1000})
	runRateSteps(t, c, []rateStep{
		{0, 1, rateRefused(1000, 3, 0, 3000)},
		{999, 1, rateRefused(1, 3, 0, 3000)},
		{1000, 1, rateOK(3, 0, 4000)}, // written now: the new limits' state
		{1000, 1, rateRefused(1000, 3, 0, 4000)},
	})
	// Back to the slow refill: the state written under the fast one is
	// below its bound; nothing changes.
	c.Reparam(Params{3, 1_000_000})
	runRateSteps(t, c, []rateStep{
		{1000, 1, rateOK(3, 1, 1_004_000)},
	})
}

// TestRateZeroLimit: a param exception may set a capacity or burst of 0:
// nothing passes (a leaky bucket of burst 0 still passes one at a time).
func TestRateZeroLimit(t *testing.T) {
	t.Parallel()
	for _, m := range []Model{NewTokenBucket(Params{0, 1000}), NewGCRA(Params{0, 1000})} {
		if r := m.Check(rateT0, 1); r != rateRefused(-1, 0, 0, rateT0) {
			t.Errorf("%T of 0: %+v", m, r)
		}
	}
	m := NewLeakyBucket(Params{0, 1000, 0})
	runRateSteps(t, m, []rateStep{
		{0, 1, rateOK(1, 0, 1000)},
		{0, 1, rateRefused(1000, 1, 0, 1000)},
		{1000, 1, rateOK(1, 0, 2000)},
	})
}

func TestGCRAScenario(t *testing.T) {
	t.Parallel()
	// burst 2, one request per 500 us
	m := NewGCRA(Params{2, 500})
	runRateSteps(t, m, []rateStep{
		{0, 1, rateOK(2, 1, 500)},
		{0, 1, rateOK(2, 0, 1000)},
		{0, 1, rateRefused(500, 2, 0, 1000)},
		{499, 1, rateRefused(1, 2, 0, 1000)},
		{500, 1, rateOK(2, 0, 1500)},
		{500, 3, rateRefused(-1, 2, 0, 1500)},
		{10_000, 2, rateOK(2, 0, 11_000)}, // a weight of 2 is 2 requests' worth
	})
	m.Undo(rateT0+10_000, 1, "")
	if tat, wr := m.TAT(); tat != rateT0+10_500 || wr != rateT0+10_000 {
		t.Fatalf("TAT after an undo of 1: +%d written at +%d, want +10500 written at +10000", tat-rateT0, wr-rateT0)
	}
}

func TestLeakyBucketScenario(t *testing.T) {
	t.Parallel()
	t.Run("nodelay", func(t *testing.T) {
		t.Parallel()
		// burst 2, one request per ms, nodelay: burst+1 at once, then one
		// per ms
		m := NewLeakyBucket(Params{2, 1000, 0})
		runRateSteps(t, m, []rateStep{
			{0, 1, rateOK(3, 2, 1000)},
			{0, 1, rateOK(3, 1, 2000)},
			{0, 1, rateOK(3, 0, 3000)},
			{0, 1, rateRefused(1000, 3, 0, 3000)},
			{999, 1, rateRefused(1, 3, 0, 3000)},
			{1000, 1, rateOK(3, 0, 4000)},
			{1000, 3, rateRefused(1000, 3, 0, 4000)},
			{2000, 3, rateOK(3, 0, 7000)}, // admitted on the queue ahead; takes 3 slots
			{2000, 1, rateRefused(3000, 3, 0, 7000)},
		})
	})
	t.Run("shaping", func(t *testing.T) {
		t.Parallel()
		// burst 5, one request per ms, waiting at most 2.5 ms
		m := NewLeakyBucket(Params{5, 1000, 2500})
		d := func(r Result, delay int64) Result { r.Delay = delay; return r }
		runRateSteps(t, m, []rateStep{
			{0, 1, d(rateOK(6, 2, 1000), 0)},
			{0, 1, d(rateOK(6, 1, 2000), 1000)},
			{0, 1, d(rateOK(6, 0, 3000), 2000)},
			{0, 1, rateRefused(500, 6, 0, 3000)}, // would wait 3 ms
			{500, 1, d(rateOK(6, 0, 4000), 2500)},
		})
	})
	t.Run("never", func(t *testing.T) {
		t.Parallel()
		m := NewLeakyBucket(Params{1, 1_000_000, 0})
		if r := m.Check(rateT0, rateMaxDebt/1_000_000+1); r != rateRefused(-1, 2, 2, rateT0) {
			t.Fatalf("a weight of more than 2^50 us: %+v", r)
		}
	})
}

// nginxLimitReq is ngx_http_limit_req_module's decision, transcribed: the
// excess in milli-requests, rate in milli-requests per second, times in ms.
type nginxLimitReq struct {
	rate, burst int64 // rate: requests/s * 1000; burst: requests * 1000
	excess      int64
	last        int64 // ms
	seen        bool
}

// decide returns whether the request passes and its delay in ms (without
// nodelay).
func (n *nginxLimitReq) decide(now int64) (bool, int64) {
	excess := int64(0)
	if n.seen {
		ms := now - n.last
		excess = max(0, n.excess-n.rate*ms/1000+1000)
	}
	if excess > n.burst {
		return false, 0
	}
	n.excess, n.last, n.seen = excess, now, true
	return true, excess * 1000 / n.rate
}

// TestLeakyBucketIsNginx holds leaky_bucket to nginx's limit_req on random
// schedules in whole ms at rates that divide a second: the same requests
// pass, with the same delay (without nodelay).
func TestLeakyBucketIsNginx(t *testing.T) {
	t.Parallel()
	rng := rateRand(t)
	for range 200 {
		rate := []int64{1, 2, 4, 5, 10, 40, 125, 1000}[rng.IntN(8)]
		burst := rng.Int64N(6)
		T := 1_000_000 / rate
		ngx := nginxLimitReq{rate: rate * 1000, burst: burst * 1000}
		shaping := NewLeakyBucket(Params{burst, T, (burst + 1) * T})
		nodelay := NewLeakyBucket(Params{burst, T, 0})
		now := int64(0)
		for i := range 300 {
			now += rng.Int64N(3 * T / 1000)
			pass, delay := ngx.decide(now)
			for _, m := range []*LeakyBucket{shaping, nodelay} {
				r := m.Check(rateT0+now*1000, 1)
				wantDelay := delay * 1000
				if m.MaxWait == 0 {
					wantDelay = 0
				}
				if r.OK != pass || r.Delay != wantDelay {
					t.Fatalf("rate %d burst %d max wait %d step %d at %d ms: got ok=%t delay=%d, nginx ok=%t delay=%d",
						rate, burst, m.MaxWait, i, now, r.OK, r.Delay, pass, wantDelay)
				}
				if r.OK {
					m.Commit(rateT0+now*1000, 1, "")
				}
			}
		}
	}
}

// TestWarmUpGuavaTrace is Guava's RateLimiterTest.testWarmUp: 2 permits per
// second, 4 s of warm-up, cold factor 3. Each request arrives as soon as it
// is admitted, so the gap before it is the wait Guava's acquire() sleeps:
// 0 for the first, then ~ F*S shrinking to S over the warm-up.
func TestWarmUpGuavaTrace(t *testing.T) {
	t.Parallel()
	m := NewWarmUp(Params{500_000, 4_000_000, 3})
	if m.Threshold != 4 || m.MaxPermits != 8 || m.Slope != 250_000 || m.CoolDown != 500_000 {
		t.Fatalf("derived: threshold %g, max %g, slope %g, cool-down %g; want 4, 8, 250000, 500000",
			m.Threshold, m.MaxPermits, m.Slope, m.CoolDown)
	}
	now := rateT0
	acquire := func() int64 {
		t.Helper()
		r := m.Check(now, 1)
		if !r.OK {
			// the request comes back when it is admitted: that is its wait
			if r.Retry <= 0 {
				t.Fatalf("refused with retry %d", r.Retry)
			}
			slept := r.Retry
			now += slept
			if r = m.Check(now, 1); !r.OK {
				t.Fatalf("refused after its retry: %+v", r)
			}
			m.Commit(now, 1, "")
			return slept
		}
		m.Commit(now, 1, "")
		return 0
	}
	trace := func(want []int64) {
		t.Helper()
		for i, w := range want {
			if got := acquire(); got != w {
				t.Fatalf("acquire %d waited %d us, want %d", i, got, w)
			}
		}
	}
	cold := []int64{0, 1_375_000, 1_125_000, 875_000, 625_000, 500_000, 500_000, 500_000}
	trace(cold)
	now += 500_000 + 4_000_000 // repay the last, then cold again
	trace(cold)
	now += 500_000 + 2_000_000 // half cooled down: at the threshold
	trace([]int64{0, 500_000, 500_000, 500_000, 500_000, 500_000, 500_000, 500_000})
}

func TestWarmUpScenario(t *testing.T) {
	t.Parallel()
	// 10 per second, 2 s of warm-up, cold factor 3: threshold 10 permits,
	// max 20, slope 20000 us per permit, cool-down 100000 us per permit
	m := NewWarmUp(Params{100_000, 2_000_000, 3})
	runRateSteps(t, m, []rateStep{
		{0, 1, rateOK(10, 0, 290_000)},                                      // cold: the top of the ramp, (300000+280000)/2
		{0, 1, rateRefused(290_000, 10, 0, 290_000)},                        // the wait is the next one's
		{290_000, 2, rateOK(10, 0, 290_000+270_000+250_000)},                // 19 -> 17 stored: (280000+240000)/2*2
		{900_000, rateMaxDebt/300_000 + 1, rateRefused(-1, 10, 1, 900_000)}, // a debt of more than 2^50 us
	})
	m2 := NewWarmUp(Params{100_000, 2_000_000, 3})
	if r := m2.Check(rateT0, rateMaxDebt/300_000+1); r.Retry != -1 || r.OK {
		t.Fatalf("a weight of more than 2^50 us: %+v", r)
	}
	// Undo gives the permits back at the stable rate and restocks them.
	m.Undo(rateT0+900_000, 2, "")
	if m.NextFree != rateT0+810_000-200_000 || m.Stored != 19 {
		t.Fatalf("after an undo of 2: next free +%d, stored %g; want +610000, 19", m.NextFree-rateT0, m.Stored)
	}
	if m.Need() != m.NextFree+100_000+1 {
		t.Fatalf("Need %d, want next free + one cool-down + 1", m.Need()-rateT0)
	}
}

// rateRand reads POLICYALG_SEED (to replay a failure), else picks a seed; the
// seed is logged when the test fails.
func rateRand(t *testing.T) *rand.Rand {
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
	return rand.New(rand.NewPCG(seed, 0x9a7e))
}

// rateAdmission is an admitted request of a schedule.
type rateAdmission struct {
	at, w, leave int64 // leave: at + Delay
	res          Result
}

// rateSchedule runs n random requests on m, gaps up to maxGap us (a quarter of
// them at the same time as the last), weights up to maxW, committing the
// admitted ones; it returns them.
func rateSchedule(rng *rand.Rand, m Model, n int, maxGap, maxW int64) []rateAdmission {
	var out []rateAdmission
	now := rateT0
	for range n {
		if rng.IntN(4) > 0 {
			now += rng.Int64N(maxGap + 1)
		}
		w := 1 + rng.Int64N(maxW)
		r := m.Check(now, w)
		if r.OK {
			m.Commit(now, w, "")
			out = append(out, rateAdmission{now, w, now + r.Delay, r})
		}
	}
	return out
}

// TestRateWindowBounds checks each algorithm's guarantee on random
// schedules, over every window between two admissions.
func TestRateWindowBounds(t *testing.T) {
	t.Parallel()
	rng := rateRand(t)
	for i := range 60 {
		capacity := 1 + rng.Int64N(8)
		u := []int64{1, 3, 1000, 250_000}[rng.IntN(4)]
		for _, m := range []Model{NewTokenBucket(Params{capacity, u}), NewGCRA(Params{capacity, u})} {
			got := rateSchedule(rng, m, 400, 2*u, 1+capacity/2)
			if len(got) < 20 {
				t.Fatalf("only %d admissions: the schedule tests nothing", len(got))
			}
			// at most capacity + t/U units in any window of t us
			for a := range got {
				sum := int64(0)
				for b := a; b < len(got); b++ {
					sum += got[b].w
					if sum*u > capacity*u+got[b].at-got[a].at {
						t.Fatalf("%d %T capacity %d U %d: %d units in [%d, %d] us", i, m, capacity, u,
							sum, got[a].at-rateT0, got[b].at-rateT0)
					}
				}
			}
		}
		burst := rng.Int64N(6)
		for _, maxWait := range []int64{0, 1 + rng.Int64N((burst+1)*u)} {
			m := NewLeakyBucket(Params{burst, u, maxWait})
			got := rateSchedule(rng, m, 400, 2*u, []int64{1, 3}[rng.IntN(2)])
			// departures in order, at most burst + w_last + t/T units (with
			// a queue: at most w_last + t/T, the queue shapes them)
			for a := range got {
				sum := int64(0)
				for b := a; b < len(got); b++ {
					if got[b].leave < got[a].leave {
						t.Fatalf("departures out of order: %+v before %+v", got[a], got[b])
					}
					sum += got[b].w
					bound := burst*u + got[b].leave - got[a].leave
					if maxWait > 0 {
						bound -= burst * u
					}
					if (sum-got[b].w)*u > bound {
						t.Fatalf("%d leaky burst %d T %d max wait %d: %d units leave in [%d, %d] us", i, burst, u, maxWait,
							sum, got[a].leave-rateT0, got[b].leave-rateT0)
					}
				}
			}
		}
	}
}

// TestWarmUpNeverFasterThanStable: consecutive admissions are at least
// their price apart, the price at least w*S (Guava truncates each of up to
// three parts to a whole us: w*S - 3) and at most w*F*S; a cold limiter (idle for
// its warm-up) charges more than the stable price; windows of admissions
// never beat the stable rate.
func TestWarmUpNeverFasterThanStable(t *testing.T) {
	t.Parallel()
	rng := rateRand(t)
	for i := range 60 {
		s := []int64{1000, 20_000, 100_000, 333_333}[rng.IntN(4)]
		f := 2 + rng.Int64N(4)
		// warm-ups of 2 to 50 stable intervals: a slope of at least
		// (F²-1)*S/100 us per permit, so that the cold price shows above
		// the truncation
		w := s * (2 + rng.Int64N(49))
		m := NewWarmUp(Params{s, w, f})
		now := rateT0
		var prev *rateAdmission
		var sumW, count, first int64
		for range 400 {
			switch rng.IntN(10) {
			case 0:
				now += w + rng.Int64N(w) // idle: cold again
			case 1, 2, 3:
			default:
				now += rng.Int64N(3 * s)
			}
			cold := m.Has && now-m.NextFree >= w || !m.Has
			wt := 1 + rng.Int64N(3)
			r := m.Check(now, wt)
			if !r.OK {
				continue
			}
			m.Commit(now, wt, "")
			price := r.Reset - now
			if price < wt*s-3 || price > wt*f*s+1 {
				t.Fatalf("%d S %d W %d F %d: a price of %d us for %d permits", i, s, w, f, price, wt)
			}
			if cold && price <= wt*s {
				t.Fatalf("%d S %d W %d F %d: cold, yet the stable price %d for %d permits", i, s, w, f, price, wt)
			}
			if prev != nil {
				if now < prev.res.Reset {
					t.Fatalf("admitted at +%d before the last one's price was paid (+%d)", now-rateT0, prev.res.Reset-rateT0)
				}
				// since the first admission: never faster than stable
				if now-first < sumW*s-3*count {
					t.Fatalf("%d: %d permits in %d us at S %d", i, sumW, now-first, s)
				}
			} else {
				first = now
			}
			sumW += wt
			count++
			prev = &rateAdmission{at: now, w: wt, res: r}
		}
	}
}

// rateClone copies a model, so that a decision can be tried on the copy.
func rateClone(m Model) Model {
	switch v := m.(type) {
	case *TokenBucket:
		c := *v
		return &c
	case *GCRA:
		c := *v
		return &c
	case *LeakyBucket:
		c := *v
		return &c
	case *WarmUp:
		c := *v
		return &c
	}
	panic(fmt.Sprintf("clone %T", m))
}

// TestRetryAfterSuffices: after a refusal with retry r >= 0 the same
// request is admitted at now+r when nothing else happened, and not a us
// sooner, also after a change of limits.
func TestRetryAfterSuffices(t *testing.T) {
	t.Parallel()
	rng := rateRand(t)
	refusals := 0
	// params draws the parameters of model kind k; now and then a model's
	// limits change (Reparam), which the retries must survive too.
	params := func(k int) Params {
		iv := []int64{1, 7, 1000, 100_000}[rng.IntN(4)]
		n := 1 + rng.Int64N(6)
		switch k {
		case 0, 1:
			return Params{n, iv}
		case 2:
			return Params{n - 1, iv, 0}
		case 3:
			return Params{n, iv, 1 + rng.Int64N(n*iv)}
		}
		return Params{iv * 1000, iv * 1000 * (1 + rng.Int64N(20)), 2 + rng.Int64N(4)}
	}
	for range 80 {
		models := []Model{NewTokenBucket(params(0)), NewGCRA(params(1)), NewLeakyBucket(params(2)),
			NewLeakyBucket(params(3)), NewWarmUp(params(4))}
		for k, m := range models {
			now := rateT0
			for range 200 {
				switch rng.IntN(8) {
				case 0:
					now += rng.Int64N(10)
				case 1:
					now += rng.Int64N(2000)
				case 2:
					now += rng.Int64N(200_000_000)
				}
				if rng.IntN(25) == 0 {
					m.(interface{ Reparam(Params) }).Reparam(params(k))
				}
				w := 1 + rng.Int64N(6)
				r := m.Check(now, w)
				if r.OK {
					m.Commit(now, w, "")
					continue
				}
				if r.Retry < 0 {
					continue
				}
				refusals++
				if later := rateClone(m).Check(now+r.Retry, w); !later.OK {
					t.Fatalf("%T %+v: refused at +%d with retry %d, refused again then: %+v", m, m, now-rateT0, r.Retry, later)
				}
				if r.Retry > 0 {
					if sooner := rateClone(m).Check(now+r.Retry-1, w); sooner.OK {
						t.Fatalf("%T %+v: refused at +%d with retry %d, admitted a us sooner", m, m, now-rateT0, r.Retry)
					}
				}
			}
		}
	}
	if refusals < 1000 {
		t.Fatalf("only %d refusals: the schedules test nothing", refusals)
	}
}
