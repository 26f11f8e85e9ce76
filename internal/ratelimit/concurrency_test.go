package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

func TestExactQuotaUnderConcurrency(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	testExactQuota(t, c, testenv.Redis, []string{newTenant()})
}

// testExactQuota runs 64 goroutines, each with a client (and so a
// connection) of its own, like 64 API nodes, admitting cost 1 on every tenant
// until refused. Each tenant has a monthly quota of 1000 and no other limit:
// exactly 1000 must be admitted per tenant, and the pending usage must count
// 1000 units, 1000 requests and one refusal per goroutine.
//
// The requests carry one explicit time in the middle of a month, so that a
// run across a real month end cannot reset the quota halfway.
func testExactQuota(t *testing.T, c redis.UniversalClient, newClient func(testing.TB) redis.UniversalClient, tenants []string) {
	const (
		workers = 64
		quotaN  = 1000
	)
	_, prefix := mustRunner(t, c)
	now := at(t, "2031-05-15T12:00:00Z")
	limits := quota.Limits{MonthlyQuota: i64(quotaN)}

	runners := make([]*stack, workers)
	for i := range runners {
		runners[i] = newStack(newClient(t), prefix)
	}
	admitted := make([][]int, workers) // per worker, per tenant
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w, r := range runners {
		admitted[w] = make([]int, len(tenants))
		wg.Go(func() {
			<-start
			done := make([]bool, len(tenants))
			for left := len(tenants); left > 0; {
				for i, tenant := range tenants {
					if done[i] {
						continue
					}
					d, err := r.Admit(context.Background(), quota.Request{TenantID: tenant, Meter: "demo", Cost: 1,
						Limits: limits, Overage: quota.OverageBlock, Now: now})
					if err != nil {
						t.Errorf("worker %d tenant %s: %v", w, tenant, err)
						return
					}
					if d.Allowed {
						admitted[w][i]++
					} else {
						done[i] = true
						left--
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()

	for i, tenant := range tenants {
		total := 0
		for w := range workers {
			total += admitted[w][i]
		}
		if total != quotaN {
			t.Errorf("tenant %s: admitted %d, want exactly %d", tenant, total, quotaN)
		}
		got := sumPending(t, newStack(c, prefix), tenant)
		if got["u"] != quotaN || got["r"] != quotaN || got["x"] != workers || got["o"] != 0 {
			t.Errorf("tenant %s pending: got u=%d r=%d x=%d o=%d, want u=%d r=%d x=%d o=0",
				tenant, got["u"], got["r"], got["x"], got["o"], quotaN, quotaN, workers)
		}
	}
}

// TestGCRAWindowBound hammers one tenant from 8 clients with Redis time and
// checks DESIGN's promise on the admitted requests: in every window [t_i,
// t_j] at most burst + rate × (t_j - t_i) are admitted.
//
// The script's exact guarantee is n ≤ B + floor((t_j - t_i) / T) with T the
// whole-microsecond interval: after the first admission in the window TAT ≥
// t_i + T, each admission adds at least T, and the last needs TAT ≤ t_j + B·T.
// The test asserts that, and the rate form with +1: T = round(1e6/rate) can
// be up to 0.5 us shorter than 1e6/rate, which over at most 2 s adds a tiny
// fraction of a request (for 30/s: 2e6/33333 − 60 ≈ 0.0006), and the floor of
// a count is an integer, so +1 absorbs it. Decision.Now is the TIME the
// script read, in script order, so the recorded times are the ones the
// algorithm saw.
func TestGCRAWindowBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate  float64
		burst int64
	}{
		{50, 10}, // T = 20000 us exactly
		{30, 10}, // T = 33333 us, rounded down from 33333.3
	} {
		t.Run(fmt.Sprintf("rate %g burst %d", tc.rate, tc.burst), func(t *testing.T) {
			t.Parallel()
			c := testenv.Redis(t)
			_, prefix := mustRunner(t, c)
			tenant := newTenant()
			limits := quota.Limits{BurstRate: f64(tc.rate), Burst: i64(tc.burst)}
			T := quota.IntervalMicros(tc.rate)

			var (
				mu    sync.Mutex
				times []int64
				wg    sync.WaitGroup
			)
			deadline := time.Now().Add(1500 * time.Millisecond)
			for range 8 {
				r := newStack(testenv.Redis(t), prefix)
				wg.Go(func() {
					for time.Now().Before(deadline) {
						d, err := r.Admit(context.Background(), quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Limits: limits})
						if err != nil {
							t.Errorf("Admit: %v", err)
							return
						}
						if d.Allowed {
							mu.Lock()
							times = append(times, d.Now.UnixMicro())
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			slices.Sort(times)
			n := len(times)
			if n < int(tc.burst) {
				t.Fatalf("admitted %d, want at least the burst %d: the test did not exercise the limiter", n, tc.burst)
			}
			span := times[n-1] - times[0]
			if minWant := (span / T) / 2; int64(n) < minWant {
				t.Errorf("admitted %d in %dus, want at least %d: the limiter refused far more than its rate", n, span, minWant)
			}
			for i := range n {
				for j := i; j < n; j++ {
					count := int64(j - i + 1)
					dt := times[j] - times[i]
					if exact := tc.burst + dt/T; count > exact {
						t.Fatalf("%d admitted in [%d, %d] (%dus): got %d, want ≤ B + floor(dt/T) = %d", count, times[i], times[j], dt, count, exact)
					}
					if bound := float64(tc.burst) + tc.rate*float64(dt)/1e6 + 1; float64(count) > bound {
						t.Fatalf("%d admitted in %dus: want ≤ burst + rate·t + 1 = %.3f", count, dt, bound)
					}
				}
			}
			t.Logf("rate %g/s burst %d: %d admitted over %v (B + span/T = %d)", tc.rate, tc.burst, n,
				time.Duration(span)*time.Microsecond, tc.burst+span/T)
		})
	}
}

// TestExactQuotaThroughOneCoalescingRunner: 64 goroutines share one Runner,
// so their admissions are coalesced into pipelines: exactly the quota is
// admitted, and every admission and refusal is counted once.
func TestExactQuotaThroughOneCoalescingRunner(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]redis.UniversalClient{"single": testenv.Redis(t), "cluster": testenv.Cluster(t)} {
		t.Run(name, func(t *testing.T) {
			r, _ := mustRunner(t, c)
			tenants := []string{newTenant(), newTenant()}
			now := at(t, "2031-05-15T12:00:00Z")
			const workers, quotaN = 64, 500
			limits := quota.Limits{MonthlyQuota: i64(quotaN)}
			var mu sync.Mutex
			admitted := map[string]int{}
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tenant := tenants[w%2]
					for i := 0; ; i++ {
						req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Limits: limits, Now: now}
						if i%5 == 0 { // some carry a key of their own: another record per request
							req.IdempotencyKey = fmt.Sprintf("w%d-%d", w, i)
						}
						d, err := r.Admit(context.Background(), req)
						if err != nil {
							t.Error(err)
							return
						}
						if !d.Allowed {
							return
						}
						mu.Lock()
						admitted[tenant]++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if r.batch.shared.Load() == 0 {
				t.Errorf("no admission was coalesced with another: the test did not exercise batches")
			}
			for _, tenant := range tenants {
				if admitted[tenant] != quotaN {
					t.Errorf("tenant %s: admitted %d, want exactly %d", tenant, admitted[tenant], quotaN)
				}
				got := sumPending(t, r, tenant)
				if got["u"] != quotaN || got["r"] != quotaN || got["x"] != workers/2 {
					t.Errorf("tenant %s pending: got %v, want u=r=%d x=%d", tenant, got, quotaN, workers/2)
				}
			}
		})
	}
}
