package locallimit

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

var t0 = time.Date(2026, 3, 31, 23, 59, 0, 0, time.UTC)

// step is one request of a table case: its cost, the time since the case's
// start, and what it must get.
type step struct {
	cost     int64
	at       time.Duration
	dry      bool
	allowed  bool
	retry    time.Duration // when refused; -1µs = never
	violated quota.LimitName
	overage  int64
	remain   int64 // of the case's one limit
}

func TestLimiterDecides(t *testing.T) {
	t.Parallel()
	never := -time.Microsecond
	for _, tc := range []struct {
		name    string
		limits  quota.Limits
		overage quota.Overage
		steps   []step
	}{
		{"burst of 2 at 1 a second", quota.Limits{BurstRate: quota.Ptr(1.0), Burst: quota.Ptr(int64(2))}, "", []step{
			{cost: 5, allowed: true, remain: 1},
			{cost: 5, allowed: true, remain: 0},
			{cost: 1, retry: time.Second, violated: quota.LimitBurst},
			{cost: 1, at: 400 * time.Millisecond, retry: 600 * time.Millisecond, violated: quota.LimitBurst},
			{cost: 1, at: time.Second, allowed: true, remain: 0},
		}},
		{"bucket of 10 units at 2 a second", quota.Limits{BucketCapacity: quota.Ptr(int64(10)), BucketRefillPerSec: quota.Ptr(2.0)}, "", []step{
			{cost: 7, allowed: true, remain: 3},
			{cost: 4, retry: 500 * time.Millisecond, violated: quota.LimitBucket},
			{cost: 11, retry: never, violated: quota.LimitBucket},
			{cost: 4, at: 500 * time.Millisecond, allowed: true, remain: 0},
		}},
		{"daily quota of 5, refilled at midnight", quota.Limits{DailyQuota: quota.Ptr(int64(5))}, "", []step{
			{cost: 3, allowed: true, remain: 2},
			{cost: 3, retry: time.Minute, violated: quota.LimitDaily},
			{cost: 6, retry: never, violated: quota.LimitDaily},
			{cost: 2, at: time.Second, allowed: true, remain: 0},
			{cost: 5, at: time.Minute, allowed: true, remain: 0},
		}},
		{"monthly quota of 4 blocks", quota.Limits{MonthlyQuota: quota.Ptr(int64(4))}, quota.OverageBlock, []step{
			{cost: 4, allowed: true, remain: 0},
			{cost: 1, retry: time.Minute, violated: quota.LimitMonthly},
			{cost: 1, at: time.Minute, allowed: true, remain: 3},
		}},
		{"monthly quota of 4 bills past it", quota.Limits{MonthlyQuota: quota.Ptr(int64(4))}, quota.OverageBill, []step{
			{cost: 3, allowed: true, remain: 1},
			{cost: 3, allowed: true, overage: 2, remain: 0},
			{cost: 9, allowed: true, overage: 9, remain: 0},
		}},
		{"a dry run consumes nothing", quota.Limits{DailyQuota: quota.Ptr(int64(2))}, "", []step{
			{cost: 2, dry: true, allowed: true, remain: 0},
			{cost: 2, dry: true, allowed: true, remain: 0},
			{cost: 2, allowed: true, remain: 0},
			{cost: 1, dry: true, retry: time.Minute, violated: quota.LimitDaily},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := NewLimiter(10)
			for i, s := range tc.steps {
				req := quota.Request{TenantID: "tn", Meter: "m", Cost: s.cost, Limits: tc.limits, Overage: tc.overage, DryRun: s.dry}
				d, err := l.Admit(req, t0.Add(s.at))
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if d.Allowed != s.allowed {
					t.Fatalf("step %d: got allowed %t, want %t (%+v)", i, d.Allowed, s.allowed, d)
				}
				if !d.Allowed && (d.RetryAfter != s.retry || len(d.Violated) != 1 || d.Violated[0] != s.violated) {
					t.Errorf("step %d: got retry %s, violated %v, want %s, [%s]", i, d.RetryAfter, d.Violated, s.retry, s.violated)
				}
				if d.OverageUnits != s.overage {
					t.Errorf("step %d: got overage %d, want %d", i, d.OverageUnits, s.overage)
				}
				if d.Allowed && (len(d.Limits) != 1 || d.Limits[0].Remaining != s.remain) {
					t.Errorf("step %d: got limits %+v, want one with %d remaining", i, d.Limits, s.remain)
				}
				if !d.Now.Equal(t0.Add(s.at)) {
					t.Errorf("step %d: got Now %s, want %s", i, d.Now, t0.Add(s.at))
				}
			}
		})
	}
}

// TestLimiterRefusesWhatItCannotDecide: bad input is a CodeInvalid error,
// never a panic, and leaves no state behind.
func TestLimiterRefusesWhatItCannotDecide(t *testing.T) {
	t.Parallel()
	ok := quota.Request{TenantID: "tn", Meter: "m", Cost: 1, Limits: quota.Limits{DailyQuota: quota.Ptr(int64(10))}}
	for _, tc := range []struct {
		name  string
		field string
		mut   func(*quota.Request, *time.Time)
	}{
		{"cost 0", "cost", func(r *quota.Request, _ *time.Time) { r.Cost = 0 }},
		{"negative cost", "cost", func(r *quota.Request, _ *time.Time) { r.Cost = -3 }},
		{"cost past MaxQuantity", "cost", func(r *quota.Request, _ *time.Time) { r.Cost = quota.MaxQuantity + 1 }},
		{"burst without rate", "burst", func(r *quota.Request, _ *time.Time) { r.Limits.Burst = quota.Ptr(int64(3)) }},
		{"burst 0", "burst", func(r *quota.Request, _ *time.Time) {
			r.Limits.BurstRate, r.Limits.Burst = quota.Ptr(1.0), quota.Ptr(int64(0))
		}},
		{"NaN rate", "burst_rate", func(r *quota.Request, _ *time.Time) {
			r.Limits.BurstRate, r.Limits.Burst = quota.Ptr(math.NaN()), quota.Ptr(int64(3))
		}},
		{"infinite refill", "bucket_refill_per_sec", func(r *quota.Request, _ *time.Time) {
			r.Limits.BucketCapacity, r.Limits.BucketRefillPerSec = quota.Ptr(int64(3)), quota.Ptr(math.Inf(1))
		}},
		{"window past 2^50 us", "bucket_capacity", func(r *quota.Request, _ *time.Time) {
			r.Limits.BucketCapacity, r.Limits.BucketRefillPerSec = quota.Ptr(quota.MaxQuantity), quota.Ptr(quota.MinRate)
		}},
		{"negative daily quota", "daily_quota", func(r *quota.Request, _ *time.Time) { r.Limits.DailyQuota = quota.Ptr(int64(-1)) }},
		{"monthly quota past MaxQuantity", "monthly_quota", func(r *quota.Request, _ *time.Time) {
			r.Limits.MonthlyQuota = quota.Ptr(quota.MaxQuantity + 1)
		}},
		{"unknown overage", "overage", func(r *quota.Request, _ *time.Time) { r.Overage = "maybe" }},
		{"no tenant", "tenant_id", func(r *quota.Request, _ *time.Time) { r.TenantID = "" }},
		{"before 1970", "now", func(_ *quota.Request, now *time.Time) { *now = time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC) }},
		{"the zero time", "now", func(_ *quota.Request, now *time.Time) { *now = time.Time{} }},
		{"too far ahead", "now", func(_ *quota.Request, now *time.Time) { *now = time.UnixMicro(math.MaxInt64) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req, now := ok, t0
			tc.mut(&req, &now)
			l := NewLimiter(10)
			var d quota.Decision
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("Admit panicked: %v", r)
					}
				}()
				d, err = l.Admit(req, now)
			}()
			e, isQuota := err.(*quota.Error)
			if !isQuota || e.Code != quota.CodeInvalid || e.Field != tc.field {
				t.Fatalf("got %+v, %v; want a CodeInvalid error on %s", d, err, tc.field)
			}
			if n := l.Len(); n != 0 {
				t.Errorf("got %d tenants held after an error, want 0", n)
			}
		})
	}
}

// TestLimiterBoundsMemory: past its bound the limiter starts afresh.
func TestLimiterBoundsMemory(t *testing.T) {
	t.Parallel()
	const bound = 1000
	l := NewLimiter(bound)
	req := quota.Request{Meter: "m", Cost: 1, Limits: quota.Limits{DailyQuota: quota.Ptr(int64(1))}}
	for i := range 10 * bound {
		req.TenantID = fmt.Sprint("tn-", i)
		if _, err := l.Admit(req, t0); err != nil {
			t.Fatal(err)
		}
		if n := l.Len(); n > bound {
			t.Fatalf("after %d tenants: got %d held, want at most %d", i+1, n, bound)
		}
		l.mu.Lock()
		n := len(l.tenants)
		l.mu.Unlock()
		if n != l.Len() {
			t.Fatalf("Len() = %d, want len(tenants) = %d", l.Len(), n)
		}
	}
}

// TestLimiterForget: a forgotten tenant starts from zero; others keep
// their state.
func TestLimiterForget(t *testing.T) {
	t.Parallel()
	l := NewLimiter(10)
	req := quota.Request{Meter: "m", Cost: 1, Limits: quota.Limits{DailyQuota: quota.Ptr(int64(1))}}
	for _, tn := range []string{"a", "b"} {
		req.TenantID = tn
		if d, _ := l.Admit(req, t0); !d.Allowed {
			t.Fatalf("tenant %s: first request refused", tn)
		}
	}
	l.Forget("a")
	l.Forget("nobody")
	if got := l.Len(); got != 1 {
		t.Fatalf("got %d tenants held, want 1", got)
	}
	for tn, want := range map[string]bool{"a": true, "b": false} {
		req.TenantID = tn
		if d, _ := l.Admit(req, t0); d.Allowed != want {
			t.Errorf("tenant %s after Forget(a): got allowed %t, want %t", tn, d.Allowed, want)
		}
	}
}

// TestLimiterIsSafeForConcurrentUse: concurrent requests of one tenant
// share its burst exactly (run with -race).
func TestLimiterIsSafeForConcurrentUse(t *testing.T) {
	t.Parallel()
	const burst, workers, each = 50, 16, 40
	l := NewLimiter(workers * each) // room for every tenant: no restart
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				req := quota.Request{TenantID: "tn", Meter: "m", Cost: 1,
					Limits: quota.Limits{BurstRate: quota.Ptr(quota.MinRate), Burst: quota.Ptr(int64(burst))}}
				if i%4 == 0 {
					req.TenantID = fmt.Sprint("other-", w, "-", i) // other tenants meanwhile
				}
				d, err := l.Admit(req, t0)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed && req.TenantID == "tn" {
					admitted.Add(1)
				}
				if i%7 == 0 {
					l.Forget("nobody")
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != burst {
		t.Fatalf("got %d admitted, want the burst of %d", got, burst)
	}
}
