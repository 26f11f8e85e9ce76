package ratelimit

import (
	"context"
	"strconv"
	"strings"
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

// BenchmarkAdmitGroup sends groups of n admissions of one tenant as the
// batcher sends them (one call of admit alone, admitn for more), and
// reports Redis's time per admission from INFO commandstats
// (redis-µs/adm; run it on a Redis of its own: every client counts).
func BenchmarkAdmitGroup(b *testing.B) {
	for _, n := range []int{1, 4, 16, 32} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			c := testenv.Redis(b)
			r, _ := mustRunner(b, c)
			p, err := paramsOf(benchLimits())
			if err != nil {
				b.Fatal(err)
			}
			tenant := newTenant()
			batch := make([]*call, n)
			for i := range batch {
				keys, args, _ := r.admitCall(tenant, "", 0, "admit", 1, "demo", "block", p, "", 0, nil, nil)
				batch[i] = &call{keys: keys, args: args, done: make(chan struct{}, 1)}
			}
			ctx := context.Background()
			r.batch.run(batch, nil) // the library loaded, the tenant's state made
			before := scriptMicros(b, ctx, c)
			b.ResetTimer()
			for b.Loop() {
				r.batch.run(batch, nil)
				for _, cl := range batch {
					if cl.err != nil || cl.res[0] != 1 {
						b.Fatalf("admit: %v %v", cl.err, cl.res)
					}
				}
			}
			b.StopTimer()
			b.ReportMetric((scriptMicros(b, ctx, c)-before)/float64(b.N*n), "redis-µs/adm")
		})
	}
}

// scriptMicros is the usec INFO commandstats gives FCALL so far.
func scriptMicros(tb testing.TB, ctx context.Context, c redis.UniversalClient) float64 {
	tb.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_fcall:") {
			continue
		}
		for _, kv := range strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "cmdstat_fcall:")), ",") {
			if v, ok := strings.CutPrefix(kv, "usec="); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
	}
	return 0
}
