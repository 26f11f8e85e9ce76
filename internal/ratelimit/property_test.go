package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPropertyScriptMatchesModel drives random request schedules through the
// script (with explicit times) and the reference, internal/limits, and
// requires identical decisions, remainders and retry times at every step,
// and identical state, field by field, at the end of each schedule.
func TestPropertyScriptMatchesModel(t *testing.T) {
	t.Parallel()
	runProperty(t, testenv.Redis(t), 20, 300)
}

// propertySeed is RATELIMIT_SEED when set (to replay a failure), else random.
func propertySeed(tb testing.TB) uint64 {
	tb.Helper()
	if s := os.Getenv("RATELIMIT_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			tb.Fatalf("RATELIMIT_SEED=%q: %v", s, err)
		}
		return v
	}
	return rand.Uint64()
}

// Boundaries near which schedules start: UTC day, month and year ends,
// leap and common Februaries, and a century that is not a leap year. All lie
// in the future, so that keys written with explicit times do not expire in
// real time while the test runs.
var propertyStarts = []string{
	"2027-01-01T00:00:00Z",
	"2028-02-29T00:00:00Z",
	"2028-03-01T00:00:00Z",
	"2029-03-01T00:00:00Z",
	"2030-06-11T00:00:00Z",
	"2030-12-31T00:00:00Z",
	"2031-01-01T00:00:00Z",
	"2032-07-01T00:00:00Z",
	"2100-03-01T00:00:00Z",
}

// propertyRand is the random source of a property test: of
// propertySeed, on stream; a failing test names its seed.
func propertyRand(t *testing.T, stream uint64) (*rand.Rand, uint64) {
	seed := propertySeed(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d: rerun with RATELIMIT_SEED=%d", seed, seed)
		}
	})
	return rand.New(rand.NewPCG(seed, stream)), seed
}

func runProperty(t *testing.T, c redis.UniversalClient, schedules, steps int) {
	rng, seed := propertyRand(t, 0x7011_6a7e)
	r, prefix := mustRunner(t, c)
	ctx := context.Background()
	seen := map[string]int{} // outcomes, to show (and require) that the schedules reach every branch

	for s := range schedules {
		tenant := newTenant()
		var m ref
		limits, overage := randomLimits(rng), randomOverage(rng)
		price := randomPrice(rng)
		now := at(t, propertyStarts[rng.IntN(len(propertyStarts))]).Add(-time.Duration(rng.Int64N(int64(2 * time.Minute))))
		if rng.IntN(4) == 0 {
			now = now.Add(-time.Duration(rng.Int64N(int64(3 * time.Hour))))
		}
		now = now.Truncate(time.Microsecond)
		var history []string
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d schedule %d tenant %s limits %s overage %s price %d\nlast steps:\n  %s\n%s", seed, s, tenant,
				fmtLimits(limits), overage, price, strings.Join(history[max(0, len(history)-8):], "\n  "), fmt.Sprintf(format, args...))
		}

		for i := range steps {
			now = now.Add(randomGap(rng))
			switch x := rng.IntN(100); {
			case x < 3:
				period := []string{"day", "month"}[rng.IntN(2)]
				units := 1 + rng.Int64N(20)
				if err := r.Grant(ctx, tenant, period, units, now); err != nil {
					fail("Grant: %v", err)
				}
				m.Grant(period, units, now)
				history = append(history, fmt.Sprintf("%d %s grant %s %d", i, now.Format(time.RFC3339Nano), period, units))
			case x < 5:
				limits, overage, price = randomLimits(rng), randomOverage(rng), randomPrice(rng)
				history = append(history, fmt.Sprintf("%d new limits %s overage %s price %d", i, fmtLimits(limits), overage, price))
			case x < 10:
				got, err := r.Peek(ctx, tenant, limits, now)
				if err != nil {
					fail("Peek: %v", err)
				}
				want := m.Peek(limits, quota.Calendar{}, now)
				history = append(history, fmt.Sprintf("%d %s peek -> %s", i, now.Format(time.RFC3339Nano), fmtDecision(want)))
				if g, w := fmtDecision(got), fmtDecision(want); g != w {
					fail("step %d peek:\n  got  %s\n  want %s", i, g, w)
				}
			default:
				req := quota.Request{
					TenantID: tenant,
					Meter:    []string{"a", "b"}[rng.IntN(2)],
					Cost:     randomCost(rng),
					Limits:   limits,
					Overage:  overage,
					DryRun:   rng.IntN(10) == 0,
					Now:      now,

					OveragePriceCentsPer1K: price,
				}
				if rng.IntN(7) == 0 {
					req.IdempotencyKey = fmt.Sprintf("key-%d", rng.IntN(3))
				}
				got := mustAdmit(t, r, req)
				want := m.Admit(req, now)
				history = append(history, fmt.Sprintf("%d %s cost=%d meter=%s dry=%t idem=%q -> %s",
					i, now.Format(time.RFC3339Nano), req.Cost, req.Meter, req.DryRun, req.IdempotencyKey, fmtDecision(want)))
				if g, w := fmtDecision(got), fmtDecision(want); g != w {
					fail("step %d admit:\n  got  %s\n  want %s", i, g, w)
				}
				countOutcome(seen, req, got)
			}
		}
		if msg := compareState(t, c, r, tenant, &m, "key-0", "key-1", "key-2"); msg != "" {
			fail("state after the schedule: %s", msg)
		}
		testenv.DeleteKeys(c, prefix+"*") // keep Redis small between schedules
	}
	t.Logf("outcomes: %v", seen)
	if schedules*steps >= 3000 {
		for _, o := range []string{"allowed", "refused burst", "refused bucket", "refused daily", "refused monthly",
			"refused spend_cap", "never", "overage", "replayed", "dry"} {
			if seen[o] == 0 {
				t.Errorf("no %q outcome in %d steps: the schedules no longer cover it", o, schedules*steps)
			}
		}
	}
}

func countOutcome(seen map[string]int, req quota.Request, d quota.Decision) {
	switch {
	case d.Replayed():
		seen["replayed"]++
	case d.Allowed:
		seen["allowed"]++
	}
	for _, v := range d.Violated {
		seen["refused "+string(v)]++
	}
	if !d.Allowed && d.RetryAfter < 0 {
		seen["never"]++
	}
	if d.OverageUnits > 0 {
		seen["overage"]++
	}
	if req.DryRun {
		seen["dry"]++
	}
}

// compareState compares what Redis holds of the tenant (its hash, pending
// usage, meter quotas and the idempotency records of keys) with the
// reference's state, field by field.
func compareState(tb testing.TB, c redis.UniversalClient, r *stack, tenant string, m *ref, keys ...string) string {
	tb.Helper()
	got := redisState(tb, c, r, tenant, keys...)
	return diffStates(&got, &m.State)
}

func randomLimits(rng *rand.Rand) quota.Limits {
	var l quota.Limits
	if rng.IntN(4) > 0 {
		l.BurstRate = f64([]float64{0.5, 1, 2, 3, 7, 10, 50}[rng.IntN(7)])
		l.Burst = i64(1 + rng.Int64N(5))
	}
	if rng.IntN(4) > 0 {
		l.BucketCapacity = i64(1 + rng.Int64N(20))
		l.BucketRefillPerSec = f64([]float64{0.3, 1, 2.5, 10}[rng.IntN(4)])
	}
	if rng.IntN(3) > 0 {
		l.DailyQuota = i64(rng.Int64N(60))
	}
	if rng.IntN(3) > 0 {
		l.MonthlyQuota = i64(rng.Int64N(200))
	}
	if rng.IntN(4) > 0 {
		// the spend cap, in cents (units at randomPrice: cents × 1000 / price),
		// small enough that schedules reach it
		l.MaxOverageCents = i64(rng.Int64N(12))
	}
	return l
}

// randomPrice is an overage price per 1,000 units: mostly one cent a unit
// (the cap in cents is the cap in units), or one that rounds the cap down,
// or 0 (no price: no cap).
func randomPrice(rng *rand.Rand) int64 {
	return []int64{1000, 1000, 1000, 1000, 7, 333, 2500, 0}[rng.IntN(8)]
}

func randomOverage(rng *rand.Rand) quota.Overage {
	if rng.IntN(2) == 0 {
		return quota.OverageBill
	}
	return quota.OverageBlock
}

// randomCost is mostly small, sometimes larger than a small bucket or quota.
func randomCost(rng *rand.Rand) int64 {
	if rng.IntN(10) == 0 {
		return 1 + rng.Int64N(30)
	}
	return 1 + rng.Int64N(4)
}

// randomGap mixes no wait (bursts), sub-second gaps (GCRA and bucket
// refill), hours, days and gaps beyond a month (period rollover).
func randomGap(rng *rand.Rand) time.Duration {
	us := func(d time.Duration) time.Duration {
		return time.Duration(rng.Int64N(int64(d/time.Microsecond))) * time.Microsecond
	}
	switch x := rng.IntN(100); {
	case x < 30:
		return 0
	case x < 70:
		return us(2 * time.Second)
	case x < 88:
		return us(time.Hour)
	case x < 97:
		return us(3 * 24 * time.Hour)
	default:
		return us(40 * 24 * time.Hour)
	}
}

func fmtLimits(l quota.Limits) string {
	f := func(p *float64) string {
		if p == nil {
			return "nil"
		}
		return strconv.FormatFloat(*p, 'g', -1, 64)
	}
	i := func(p *int64) string {
		if p == nil {
			return "nil"
		}
		return strconv.FormatInt(*p, 10)
	}
	return fmt.Sprintf("{rate=%s burst=%s cap=%s refill=%s daily=%s monthly=%s max_overage_cents=%s}",
		f(l.BurstRate), i(l.Burst), i(l.BucketCapacity), f(l.BucketRefillPerSec), i(l.DailyQuota), i(l.MonthlyQuota),
		i(l.MaxOverageCents))
}
