package locallimit

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/limits"
	"github.com/tollgate/tollgate/internal/quota"
)

// randomLimits returns valid limits, each of the four set or unlimited.
func randomLimits(r *rand.Rand) quota.Limits {
	rates := []float64{quota.MinRate, 0.3, 1, 3, 7, 1000, 333_333, quota.MaxRate}
	var l quota.Limits
	if r.IntN(3) > 0 {
		l.BurstRate, l.Burst = quota.Ptr(rates[r.IntN(len(rates))]), quota.Ptr(1+r.Int64N(20))
	}
	if r.IntN(3) > 0 {
		l.BucketRefillPerSec, l.BucketCapacity = quota.Ptr(rates[r.IntN(len(rates))]), quota.Ptr(1+r.Int64N(50))
	}
	if r.IntN(3) > 0 {
		l.DailyQuota = quota.Ptr(r.Int64N(100))
	}
	if r.IntN(3) > 0 {
		l.MonthlyQuota = quota.Ptr(r.Int64N(300))
	}
	if r.IntN(2) == 0 {
		l.MaxOverageCents = quota.Ptr(r.Int64N(60)) // the spend cap, at randomPrice
	}
	return l
}

// randomPrice is an overage price per 1,000 units (0: no price, no cap).
func randomPrice(r *rand.Rand) int64 {
	return []int64{1000, 1000, 333, 0}[r.IntN(4)]
}

// randomStep returns the time between two requests: often none or a few
// microseconds, sometimes past a day's or a month's end.
func randomStep(r *rand.Rand) time.Duration {
	switch r.IntN(6) {
	case 0:
		return 0
	case 1:
		return time.Duration(r.Int64N(10)) * time.Microsecond
	case 2, 3:
		return time.Duration(r.Int64N(int64(2 * time.Second)))
	case 4:
		return time.Duration(r.Int64N(int64(time.Hour)))
	default:
		return time.Duration(r.Int64N(int64(40 * 24 * time.Hour)))
	}
}

// reference decides req at now on its own state of the tenant with
// internal/limits, the tests' reference of lua/admit.lua, as the Limiter
// is to (no pending usage, no idempotency, UTC periods).
func reference(states map[string]*limits.State, req quota.Request, now time.Time) quota.Decision {
	l, err := limits.Compile(limits.Plan{Limits: req.Limits, Overage: req.Overage,
		OveragePriceCentsPer1K: req.OveragePriceCentsPer1K}, req.Meter)
	if err != nil {
		panic(err)
	}
	if states[req.TenantID] == nil {
		states[req.TenantID] = &limits.State{}
	}
	mode := limits.Admit
	if req.DryRun {
		mode = limits.Dry
	}
	d, err := l.Decide(states[req.TenantID], limits.Request{Now: now.UnixMicro(), Mode: mode, Cost: req.Cost})
	if err != nil {
		panic(err)
	}
	return d.Quota(l)
}

// TestLimiterMatchesModel holds the Limiter to internal/limits, the tests'
// reference of lua/admit.lua, on random schedules of requests of a few
// tenants: random limits (changed now and then, which exercises the
// clamps), costs, dry runs, overage policies and times, starting just
// before a month's end. Every decision must be the reference's, each
// tenant decided on a state of its own.
func TestLimiterMatchesModel(t *testing.T) {
	t.Parallel()
	schedules, steps := 400, 300
	if testing.Short() {
		schedules = 50
	}
	for seed := range uint64(schedules) {
		r := rand.New(rand.NewPCG(seed, 13))
		lim := NewLimiter(100)
		tenants := []string{"tn-a", "tn-b", "tn-c"}
		models := map[string]*limits.State{}
		lims := map[string]quota.Limits{}
		for _, tn := range tenants {
			lims[tn] = randomLimits(r)
		}
		now := time.Date(2026, 1, 31, 23, 59, 50, 0, time.UTC).Add(time.Duration(r.Int64N(int64(time.Minute))))
		for step := range steps {
			tn := tenants[r.IntN(len(tenants))]
			if r.IntN(40) == 0 {
				lims[tn] = randomLimits(r)
			}
			req := quota.Request{TenantID: tn, Meter: "m", Cost: 1 + r.Int64N(12), Limits: lims[tn],
				Overage: []quota.Overage{quota.OverageBlock, quota.OverageBill, ""}[r.IntN(3)], DryRun: r.IntN(5) == 0,
				OveragePriceCentsPer1K: randomPrice(r)}
			now = now.Add(randomStep(r))
			got, err := lim.Admit(req, now)
			if err != nil {
				t.Fatalf("seed %d step %d: %+v: %v", seed, step, req, err)
			}
			want := reference(models, req, now)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d step %d at %s: %s\ngot  %s\nwant %s", seed, step, now.Format(time.RFC3339Nano),
					describe(req), describeDecision(got), describeDecision(want))
			}
		}
	}
}

func describe(req quota.Request) string {
	s := fmt.Sprintf("%s cost %d overage %q dry %t limits", req.TenantID, req.Cost, req.Overage, req.DryRun)
	for _, p := range []any{req.Limits.BurstRate, req.Limits.Burst, req.Limits.BucketRefillPerSec,
		req.Limits.BucketCapacity, req.Limits.DailyQuota, req.Limits.MonthlyQuota} {
		switch v := p.(type) {
		case *float64:
			if v != nil {
				s += fmt.Sprintf(" %g", *v)
				continue
			}
		case *int64:
			if v != nil {
				s += fmt.Sprintf(" %d", *v)
				continue
			}
		}
		s += " -"
	}
	return s
}

func describeDecision(d quota.Decision) string {
	return fmt.Sprintf("allowed %t violated %v retry %s overage %d limits %+v", d.Allowed, d.Violated,
		d.RetryAfter, d.OverageUnits, d.Limits)
}

// BenchmarkFailOpen compares a fail-open decision of the Limiter with a
// decision of internal/limits compiling the list anew each time.
func BenchmarkFailOpen(b *testing.B) {
	req := quota.Request{TenantID: "tn", Meter: "m", Cost: 1, Limits: quota.Limits{BurstRate: quota.Ptr(quota.MaxRate),
		Burst: quota.Ptr(int64(100)), DailyQuota: quota.Ptr(quota.MaxQuantity), MonthlyQuota: quota.Ptr(quota.MaxQuantity)}}
	now := t0
	b.Run("locallimit", func(b *testing.B) {
		l := NewLimiter(10)
		for i := 0; b.Loop(); i++ {
			if _, err := l.Admit(req, now.Add(time.Duration(i)*time.Microsecond)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("compiled each time", func(b *testing.B) {
		states := map[string]*limits.State{}
		for i := 0; b.Loop(); i++ {
			reference(states, req, now.Add(time.Duration(i)*time.Microsecond))
		}
	})
}
