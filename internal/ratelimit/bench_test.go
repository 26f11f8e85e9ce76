package ratelimit

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// benchLimits are four active limits too large to refuse during a
// benchmark, so that every iteration takes the full write path.
func benchLimits() quota.Limits {
	return quota.Limits{
		BurstRate: f64(quota.MaxRate), Burst: i64(1 << 30),
		BucketCapacity: i64(1 << 30), BucketRefillPerSec: f64(quota.MaxRate),
		DailyQuota: i64(quota.MaxQuantity), MonthlyQuota: i64(quota.MaxQuantity),
	}
}

// BenchmarkAdmit is one admission with all four limits, serially: one
// FCALL round trip each.
func BenchmarkAdmit(b *testing.B) {
	c := testenv.Redis(b)
	r, _ := mustRunner(b, c)
	req := quota.Request{TenantID: newTenant(), Meter: "demo", Cost: 1, Limits: benchLimits()}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if d, err := r.Admit(ctx, req); err != nil || !d.Allowed {
			b.Fatalf("Admit: %v %s", err, fmtDecision(d))
		}
	}
}

// BenchmarkAdmitParallel admits from GOMAXPROCS goroutines on one client
// (its connection pool), each goroutine a tenant of its own.
func BenchmarkAdmitParallel(b *testing.B) {
	c := testenv.Redis(b)
	r, _ := mustRunner(b, c)
	ctx := context.Background()
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := quota.Request{TenantID: "bench-" + strconv.FormatInt(n.Add(1), 10), Meter: "demo", Cost: 1, Limits: benchLimits()}
		for pb.Next() {
			if d, err := r.Admit(ctx, req); err != nil || !d.Allowed {
				b.Errorf("Admit: %v %s", err, fmtDecision(d))
				return
			}
		}
	})
}

// BenchmarkTrivialEvalSha is the floor under BenchmarkAdmit: EVALSHA of
// "return 1" on the same server (a call of a function costs as little),
// so the difference is the function's own work.
func BenchmarkTrivialEvalSha(b *testing.B) {
	c := testenv.Redis(b)
	s := redis.NewScript("return 1")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Run(ctx, c, nil).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTenantMemory admits one request for a tenant with all four
// limits active and reports the summed MEMORY USAGE of its keys (the
// state hash and the pending hash; idempotency keys are per request, not
// per tenant, and are left out).
func BenchmarkTenantMemory(b *testing.B) {
	c := testenv.Redis(b)
	r, _ := mustRunner(b, c)
	ctx := context.Background()
	var bytes int64
	for b.Loop() {
		tenant := newTenant()
		req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Limits: benchLimits()}
		// A GCRA and bucket slow enough that their keys outlive the measurement.
		req.Limits.BurstRate, req.Limits.BucketRefillPerSec = f64(0.001), f64(0.001)
		req.Limits.Burst, req.Limits.BucketCapacity = i64(100), i64(100)
		if _, err := r.Admit(ctx, req); err != nil {
			b.Fatal(err)
		}
		// Every key admit may touch; those it did not write (the pending
		// hash, written only for a tenant without state) have no memory.
		bytes = 0
		for _, k := range r.keys(tenant, "") {
			n, err := c.MemoryUsage(ctx, k, 0).Result()
			if err == redis.Nil {
				continue
			}
			if err != nil {
				b.Fatalf("MEMORY USAGE %s: %v", k, err)
			}
			bytes += n
		}
		if bytes == 0 {
			b.Fatal("the admission left no key")
		}
	}
	b.ReportMetric(float64(bytes), "bytes/tenant")
}

// BenchmarkAdmitCalendar is BenchmarkAdmit for a tenant with a billing
// calendar (America/New_York, anchor 15): the boundaries argument, cached
// for the day, and calendar.lua's pick of the day and period.
func BenchmarkAdmitCalendar(b *testing.B) {
	c := testenv.Redis(b)
	r, _ := mustRunner(b, c)
	req := quota.Request{TenantID: newTenant(), Meter: "demo", Cost: 1, Limits: benchLimits(),
		Calendar: mustCalendar(b, "America/New_York", 15)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if d, err := r.Admit(ctx, req); err != nil || !d.Allowed {
			b.Fatalf("Admit: %v %s", err, fmtDecision(d))
		}
	}
}
