package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/policyalg"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The algorithms of lua/policy_windows.lua against their models
// (internal/policyalg/windows.go): random schedules through
// Runner.RunPolicies with explicit times, several policies per call, and
// after every step the items, the keys' contents and their expiries must be
// the models'.

func TestPolicyWindowsMatchModels(t *testing.T) {
	t.Parallel()
	runPolicyWindows(t, testenv.Redis(t), 20, 300)
}

func TestClusterPolicyWindowsMatchModels(t *testing.T) {
	t.Parallel()
	runPolicyWindows(t, testenv.Cluster(t), 5, 120)
}

var pwAlgs = []quota.Algorithm{quota.AlgFixedWindow, quota.AlgSlidingLog, quota.AlgSlidingWindow, quota.AlgConcurrency}

// pwPolicy is one policy instance of a schedule: its spec (without the
// weight) and its model.
type pwPolicy struct {
	spec  PolicySpec
	units bool // cost "units": the weight is the request's cost
	model policyalg.KeyModel
}

// pwAdmission is an admitted call: what undo and release need.
type pwAdmission struct {
	now   int64
	id    string
	specs []PolicySpec // of the policies that committed, with their weights
	pols  []*pwPolicy
}

// pwParams draws an algorithm's parameters: small limits (refusals are
// common; sometimes 0, as a param exception may be), whole-second windows
// as quota.Policy allows, and odd microsecond ones that stress the
// arithmetic.
func pwParams(rng *rand.Rand, alg quota.Algorithm) policyalg.Params {
	limit := 1 + rng.Int64N(10)
	if rng.IntN(25) == 0 {
		limit = 0
	}
	window := []int64{1e6, 2e6, 5e6, 60e6, 7, 1000, 333_333}[rng.IntN(7)]
	switch alg {
	case quota.AlgSlidingWindow:
		n := []int64{1, 2, 3, 4, 5, 10, 60}[rng.IntN(7)]
		return policyalg.Params{limit, window * n, n}
	case quota.AlgConcurrency:
		return policyalg.Params{min(limit, 5), window}
	}
	return policyalg.Params{limit, window}
}

// pwGap mixes bursts (no time), gaps within the shortest window and gaps
// across several of the longest.
func pwGap(rng *rand.Rand, shortest, longest int64) int64 {
	switch x := rng.IntN(20); {
	case x < 6:
		return 0
	case x < 14:
		return rng.Int64N(shortest/3 + 2)
	case x < 18:
		return rng.Int64N(longest/3 + 2)
	default:
		return rng.Int64N(2*longest + 2)
	}
}

func runPolicyWindows(t *testing.T, c redis.UniversalClient, schedules, steps int) {
	seed := propertySeed(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d: rerun with RATELIMIT_SEED=%d", seed, seed)
		}
	})
	rng := rand.New(rand.NewPCG(seed, 0x90117))
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	seen := map[string]int{}

	for s := range schedules {
		tenant := newTenant()
		var pols []*pwPolicy
		shortest, longest := int64(1)<<62, int64(0)
		for i := range 1 + rng.IntN(4) {
			alg := pwAlgs[rng.IntN(len(pwAlgs))]
			p := pwParams(rng, alg)
			if i == 0 {
				// every algorithm in turn, and every one with a limit of
				// 0 in the fifth round of four schedules
				alg = pwAlgs[s%len(pwAlgs)]
				p = pwParams(rng, alg)
				if s/len(pwAlgs)%5 == 4 {
					p[0] = 0
				}
			}
			m, err := policyalg.New(alg, p)
			if err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("p%d-%s", i, alg)
			pols = append(pols, &pwPolicy{
				spec:  PolicySpec{Key: r.PolicyKey("t:"+tenant, name, "v"), Alg: alg, Params: [4]int64(p)},
				units: alg != quota.AlgConcurrency && rng.IntN(2) == 0,
				model: m.(policyalg.KeyModel),
			})
			shortest, longest = min(shortest, p[1]), max(longest, p[1])
		}
		now := at(t, propertyStarts[rng.IntN(len(propertyStarts))]).UnixMicro() - rng.Int64N(longest)
		var (
			history  []string
			admitted []pwAdmission
		)
		fail := func(format string, args ...any) {
			t.Helper()
			var b strings.Builder
			for _, p := range pols {
				fmt.Fprintf(&b, "\n  %s units=%t params=%v", p.spec.Key, p.units, p.spec.Params)
			}
			t.Fatalf("seed %d schedule %d policies:%s\nlast steps:\n  %s\n%s", seed, s, b.String(),
				strings.Join(history[max(0, len(history)-10):], "\n  "), fmt.Sprintf(format, args...))
		}

		for i := range steps {
			now += pwGap(rng, shortest, longest)
			id := fmt.Sprintf("req-%d-%d", s, i)
			switch x := rng.IntN(100); {
			case x < 8 && len(admitted) > 0:
				// roll back an admission, at its own time
				k := rng.IntN(len(admitted))
				a := admitted[k]
				admitted = slices.Delete(admitted, k, k+1)
				if _, err := r.RunPolicies(ctx, PolicyUndo, a.now, a.id, a.specs); err != nil {
					fail("undo: %v", err)
				}
				for j, p := range a.pols {
					p.model.Undo(a.now, a.specs[j].Weight, a.id)
				}
				seen["undo"]++
				history = append(history, fmt.Sprintf("%d undo %s of %d", i, a.id, a.now))
			case x < 14 && len(admitted) > 0:
				// end the leases of an admission (a no-op on the windows)
				a := admitted[rng.IntN(len(admitted))]
				specs := make([]PolicySpec, len(pols))
				for j, p := range pols {
					specs[j] = p.spec
					specs[j].Weight = 1
				}
				if _, err := r.RunPolicies(ctx, PolicyRelease, now, a.id, specs); err != nil {
					fail("release: %v", err)
				}
				for _, p := range pols {
					p.model.Release(now, a.id)
				}
				seen["release"]++
				history = append(history, fmt.Sprintf("%d %d release %s", i, now, a.id))
			default:
				if len(admitted) > 0 && rng.IntN(30) == 0 {
					// an id again (a client's retry): the log's entry and
					// the lease move, counted once
					id = admitted[rng.IntN(len(admitted))].id
					seen["id again"]++
				}
				mode := PolicyAdmit
				if rng.IntN(10) == 0 {
					mode = PolicyDry
					seen["dry"]++
				}
				cost := 1 + rng.Int64N(4)
				if rng.IntN(8) == 0 {
					cost = 1 + rng.Int64N(14)
				}
				specs := make([]PolicySpec, len(pols))
				for j, p := range pols {
					specs[j] = p.spec
					specs[j].Weight = 1
					if p.units {
						specs[j].Weight = cost
					}
					// what a refusal does changes no state: it is drawn
					// per call, so that every algorithm meets every mode
					if x := rng.Int64N(20); x >= 12 {
						specs[j].How = (x - 12) / 2 // reject, queue, shadow, degrade
					}
				}
				got, err := r.RunPolicies(ctx, mode, now, id, specs)
				if err != nil {
					fail("step %d: %v", i, err)
				}
				want, results := pwExpect(pols, specs, mode, now)
				hows := make([]int64, len(specs))
				for j := range specs {
					hows[j] = specs[j].How
				}
				history = append(history, fmt.Sprintf("%d %d %s %s cost=%d how=%v -> %s", i, now, mode, id, cost, hows, pwFmt(want)))
				if g, w := pwFmt(got), pwFmt(want); g != w {
					fail("step %d %s:\n  got  %s\n  want %s", i, mode, g, w)
				}
				pwCount(seen, pols, results, want)
				if want.Allowed && mode == PolicyAdmit {
					a := pwAdmission{now: now, id: id}
					for j, p := range pols {
						if results[j].OK {
							p.model.Commit(now, specs[j].Weight, id)
							a.specs = append(a.specs, specs[j])
							a.pols = append(a.pols, p)
						}
					}
					admitted = append(admitted, a)
				}
			}
			// the keys hold what the models hold: in particular a refused
			// or dry call committed nothing to any of its policies
			for _, p := range pols {
				if msg := pwCompareKey(t, c, p); msg != "" {
					fail("after step %d, %s: %s", i, p.spec.Key, msg)
				}
			}
		}
		for _, p := range pols { // keep Redis small between schedules
			c.Del(ctx, p.spec.Key)
		}
	}
	t.Logf("outcomes: %v", seen)
	if schedules*steps >= 3000 {
		var missing []string
		for _, alg := range pwAlgs {
			for _, o := range []string{"admitted", "refused", "never", "shadow", "degrade", "undone"} {
				if seen[string(alg)+" "+o] == 0 {
					missing = append(missing, string(alg)+" "+o)
				}
			}
		}
		for _, o := range []string{"refused with some admitting", "dry", "undo", "release", "id again"} {
			if seen[o] == 0 {
				missing = append(missing, o)
			}
		}
		if len(missing) > 0 {
			t.Errorf("no %q in %d steps: the schedules no longer cover them", missing, schedules*steps)
		}
	}
}

// pwExpect is policy.lua's framework over the models' Results: outcome by
// the refusal mode, the longest enforced retry (-1 wins), all-or-nothing,
// and the room of an admitting policy given back when the call consumed
// nothing.
func pwExpect(pols []*pwPolicy, specs []PolicySpec, mode string, now int64) (PolicyResult, []policyalg.Result) {
	out := PolicyResult{Now: now}
	results := make([]policyalg.Result, len(pols))
	pass, retry := true, int64(0)
	for j, p := range pols {
		res := p.model.Check(now, specs[j].Weight)
		results[j] = res
		it := PolicyItem{Outcome: 1, Limit: res.Limit, Remaining: res.Remaining, Reset: res.Reset, Retry: res.Retry,
			Delay: res.Delay, How: specs[j].How}
		if !res.OK {
			switch specs[j].How {
			case HowShadow:
				it.Outcome = 2
			case HowDegrade:
				it.Outcome = 3
				out.Degraded = true
			default:
				it.Outcome, pass = 0, false
				if retry != -1 && (res.Retry < 0 || res.Retry > retry) {
					retry = res.Retry
				}
			}
		}
		out.Items = append(out.Items, it)
	}
	out.Allowed = pass && !out.Degraded
	if !out.Allowed {
		out.Retry = retry
	}
	if !out.Allowed || mode != PolicyAdmit {
		for j := range out.Items {
			if it := &out.Items[j]; it.Outcome == 1 {
				it.Remaining = min(it.Remaining+specs[j].Weight, it.Limit)
			}
		}
	}
	return out, results
}

func pwFmt(r PolicyResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "allowed=%t now=%d retry=%d degraded=%t", r.Allowed, r.Now, r.Retry, r.Degraded)
	for _, it := range r.Items {
		fmt.Fprintf(&b, " | out=%d limit=%d rem=%d reset=%d retry=%d delay=%d how=%d",
			it.Outcome, it.Limit, it.Remaining, it.Reset, it.Retry, it.Delay, it.How)
	}
	return b.String()
}

func pwCount(seen map[string]int, pols []*pwPolicy, results []policyalg.Result, want PolicyResult) {
	some := false
	for j, p := range pols {
		alg, it := string(p.spec.Alg), want.Items[j]
		switch it.Outcome {
		case 1:
			seen[alg+" admitted"]++
			some = true
			if !want.Allowed {
				seen[alg+" undone"]++
			}
		case 2:
			seen[alg+" shadow"]++
		case 3:
			seen[alg+" degrade"]++
		default:
			seen[alg+" refused"]++
		}
		if !results[j].OK && results[j].Retry < 0 {
			seen[alg+" never"]++
		}
	}
	if some && !want.Allowed {
		seen["refused with some admitting"]++
	}
}

// pwCompareKey compares p's Redis key (its content in the model's
// rendering, and its expiry) with the model; "" when they agree. The
// schedules' times lie in the future, so an expiry is written as it is
// (lua/policy_windows.lua's shift is 0): PEXPIRETIME must be the model's
// expiry rounded up to a millisecond.
func pwCompareKey(tb testing.TB, c redis.UniversalClient, p *pwPolicy) string {
	tb.Helper()
	got, err := pwKeyState(c, p.spec.Alg, p.spec.Key)
	if err != nil {
		tb.Fatalf("read %s: %v", p.spec.Key, err)
	}
	if want := p.model.KeyState(); got != want {
		return fmt.Sprintf("key holds %q, model %q", got, want)
	}
	at, err := c.PExpireTime(context.Background(), p.spec.Key).Result()
	if err != nil {
		tb.Fatalf("PEXPIRETIME %s: %v", p.spec.Key, err)
	}
	us, exists := p.model.KeyExpiry()
	want := int64(-2) // no key
	if exists {
		want = (us + 999) / 1000 // rounded up (us > 0)
	}
	if at.Milliseconds() != want && (want != -2 || at != -2) {
		return fmt.Sprintf("PEXPIRETIME %d ms, model %d (from %d us, exists %t)", at.Milliseconds(), want, us, exists)
	}
	return ""
}

// pwKeyState renders a policy key as policyalg's KeyState does.
func pwKeyState(c redis.UniversalClient, alg quota.Algorithm, key string) (string, error) {
	ctx := context.Background()
	switch alg {
	case quota.AlgFixedWindow:
		v, err := c.Get(ctx, key).Result()
		if errors.Is(err, redis.Nil) {
			return "", nil
		}
		return v, err
	case quota.AlgSlidingWindow:
		h, err := c.HGetAll(ctx, key).Result()
		if err != nil {
			return "", err
		}
		js := make([]int64, 0, len(h))
		for f := range h {
			j, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return "", fmt.Errorf("field %q: %w", f, err)
			}
			js = append(js, j)
		}
		slices.Sort(js)
		parts := make([]string, len(js))
		for x, j := range js {
			parts[x] = fmt.Sprintf("%d=%s", j, h[strconv.FormatInt(j, 10)])
		}
		return strings.Join(parts, " "), nil
	}
	z, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
	if err != nil {
		return "", err
	}
	parts := make([]string, len(z))
	for x, e := range z {
		if float64(int64(e.Score)) != e.Score {
			return "", fmt.Errorf("member %v: score %v is not an integer", e.Member, e.Score)
		}
		parts[x] = fmt.Sprintf("%s=%d", e.Member, int64(e.Score))
	}
	return strings.Join(parts, " "), nil
}

// TestPolicyWindowsExactUnderConcurrency hammers one key per algorithm from
// 64 goroutines, each with a client (a connection) of its own, all at one
// explicit time: exactly the limit is admitted, whatever the interleaving.
// For concurrency, 64 goroutines then take and release leases: never more
// than the limit hold one at once, and all are released in the end.
func TestPolicyWindowsExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	const workers, limit = 64, 300
	for _, alg := range pwAlgs {
		t.Run(string(alg), func(t *testing.T) {
			t.Parallel()
			c := testenv.Redis(t)
			r, prefix := mustRunner(t, c)
			// the middle of a minute: one window, one bucket
			now := at(t, "2031-05-15T12:00:30Z").UnixMicro()
			spec := PolicySpec{Key: r.PolicyKey("t:"+newTenant(), "hammer", "v"), Alg: alg, How: HowReject, Weight: 1,
				Params: [4]int64{limit, 60e6, 6}}
			runners := make([]*stack, workers)
			for i := range runners {
				runners[i] = newStack(testenv.Redis(t), prefix)
			}
			var (
				admitted atomic.Int64
				ids      sync.Map
				wg       sync.WaitGroup
				start    = make(chan struct{})
			)
			for w, rw := range runners {
				wg.Go(func() {
					<-start
					// (until refused; a broken limit ends after limit+1)
					for n := range limit + 1 {
						id := fmt.Sprintf("w%d-%d", w, n)
						res, err := rw.RunPolicies(context.Background(), PolicyAdmit, now, id, []PolicySpec{spec})
						if err != nil {
							t.Errorf("worker %d: %v", w, err)
							return
						}
						if !res.Allowed {
							return
						}
						admitted.Add(1)
						ids.Store(id, w)
					}
				})
			}
			close(start)
			wg.Wait()
			if got := admitted.Load(); got != limit {
				t.Fatalf("%s: admitted %d, want exactly %d", alg, got, limit)
			}
			if alg != quota.AlgConcurrency {
				return
			}
			// every holder releases; then 64 take and release leases
			ids.Range(func(id, _ any) bool {
				if _, err := r.RunPolicies(context.Background(), PolicyRelease, now, id.(string), []PolicySpec{spec}); err != nil {
					t.Fatal(err)
				}
				return true
			})
			if n := c.ZCard(context.Background(), spec.Key).Val(); n != 0 {
				t.Fatalf("%d leases left after every holder released", n)
			}
			churn := spec
			churn.Params[0] = 8
			var holders, most, grants atomic.Int64
			start = make(chan struct{})
			for w, rw := range runners {
				wg.Go(func() {
					<-start
					for n := range 40 {
						id := fmt.Sprintf("c%d-%d", w, n)
						res, err := rw.RunPolicies(context.Background(), PolicyAdmit, now, id, []PolicySpec{churn})
						if err != nil {
							t.Errorf("worker %d: %v", w, err)
							return
						}
						if !res.Allowed {
							continue
						}
						grants.Add(1)
						h := holders.Add(1)
						for m := most.Load(); h > m && !most.CompareAndSwap(m, h); {
							m = most.Load()
						}
						// (the count drops before the lease is released, so
						// it never undercounts the holders Redis sees)
						holders.Add(-1)
						if _, err := rw.RunPolicies(context.Background(), PolicyRelease, now, id, []PolicySpec{churn}); err != nil {
							t.Errorf("worker %d: release: %v", w, err)
							return
						}
					}
				})
			}
			close(start)
			wg.Wait()
			if m := most.Load(); m > churn.Params[0] {
				t.Errorf("%d holders at once, limit %d", m, churn.Params[0])
			}
			if grants.Load() <= churn.Params[0] {
				t.Errorf("only %d leases granted in the churn: it tested nothing", grants.Load())
			}
			if n := c.ZCard(context.Background(), spec.Key).Val(); n != 0 {
				t.Errorf("%d leases left after the churn", n)
			}
		})
	}
}

// TestPolicyWindowsKeysExpire commits to every algorithm with Redis time
// (and an explicit past time, as the gate's tests use) and requires every
// key under the prefix to expire no later than its state needs: the
// window's end, the newest log entry + W, the newest bucket + W + bw, the
// latest lease's end (+ 1 ms of rounding up).
func TestPolicyWindowsKeysExpire(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, prefix := mustRunner(t, c)
	ctx := context.Background()
	const window = 20e6 // us
	for _, past := range []bool{false, true} {
		for _, alg := range pwAlgs {
			tenant := newTenant()
			spec := PolicySpec{Key: r.PolicyKey("t:"+tenant, "ttl", string(alg)), Alg: alg, How: HowReject, Weight: 1,
				Params: [4]int64{100, window, 4}}
			var now int64 // Redis time
			if past {
				now = at(t, "2026-05-04T10:00:00Z").UnixMicro()
			}
			before := time.Now()
			for n := range 5 {
				id := fmt.Sprintf("r%d", n)
				res, err := r.RunPolicies(ctx, PolicyAdmit, now, id, []PolicySpec{spec})
				if err != nil || !res.Allowed {
					t.Fatalf("%s: %v %+v", alg, err, res)
				}
				if n == 3 {
					if _, err := r.RunPolicies(ctx, PolicyUndo, res.Now, id, []PolicySpec{spec}); err != nil {
						t.Fatal(err)
					}
				}
			}
			ttl, err := c.PTTL(ctx, spec.Key).Result()
			if err != nil {
				t.Fatal(err)
			}
			need := time.Duration(window) * time.Microsecond
			if alg == quota.AlgSlidingWindow {
				need += need / 4
			}
			// (the time since before only loosens the bound)
			if ttl <= 0 || ttl > need+time.Since(before)+time.Millisecond {
				t.Errorf("%s (past %t): PTTL %v, want within (0, %v]", alg, past, ttl, need)
			}
		}
	}
	for _, k := range mustKeys(t, c, prefix) {
		if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("key %s has no expiry (PTTL %v)", k, ttl)
		}
	}
}

// pwBench runs RunPolicies with Redis time, serially, on one key of alg,
// each request an id of its own, in two settings of a second-long window
// (lease) and 10 buckets:
//
//	full       limit 1000: after the first second the key is at its steady
//	           state, a full window (the most such a key holds), admissions
//	           as entries leave and refusals between (the share admitted is
//	           reported)
//	admitting  limit 100000 (sliding_log's and concurrency's maximum): every
//	           request is admitted (the write path); the log and the leases
//	           hold a second's admissions
//
// It reports µs per decision and the key's MEMORY USAGE (SAMPLES 0: every
// entry counted) at the end.
func pwBench(b *testing.B, alg quota.Algorithm) {
	for _, bc := range []struct {
		name  string
		limit int64
	}{{"full", 1000}, {"admitting", 100_000}} {
		b.Run(bc.name, func(b *testing.B) {
			c := testenv.Redis(b)
			r, _ := mustRunner(b, c)
			ctx := context.Background()
			spec := PolicySpec{Key: r.PolicyKey("t:"+newTenant(), "bench", "v"), Alg: alg, How: HowReject, Weight: 1,
				Params: [4]int64{bc.limit, 1e6, 10}}
			var n, ok int64
			b.ReportAllocs()
			for b.Loop() {
				n++
				res, err := r.RunPolicies(ctx, PolicyAdmit, 0, "req-"+strconv.FormatInt(n, 10)+"-bench", []PolicySpec{spec})
				if err != nil {
					b.Fatal(err)
				}
				if res.Allowed {
					ok++
				}
			}
			if bc.name == "admitting" && ok != n {
				b.Fatalf("%d of %d refused: not the write path", n-ok, n)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n)/1e3, "µs/decision")
			b.ReportMetric(float64(ok)/float64(n), "admitted/op")
			mem, err := c.MemoryUsage(ctx, spec.Key, 0).Result()
			if err != nil {
				b.Fatalf("MEMORY USAGE: %v", err)
			}
			b.ReportMetric(float64(mem), "bytes/key")
		})
	}
}

func BenchmarkPolicy_fixed_window(b *testing.B)   { pwBench(b, quota.AlgFixedWindow) }
func BenchmarkPolicy_sliding_log(b *testing.B)    { pwBench(b, quota.AlgSlidingLog) }
func BenchmarkPolicy_sliding_window(b *testing.B) { pwBench(b, quota.AlgSlidingWindow) }
func BenchmarkPolicy_concurrency(b *testing.B)    { pwBench(b, quota.AlgConcurrency) }
