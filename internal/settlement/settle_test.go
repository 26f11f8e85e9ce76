package settlement_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/quotaredis/quotaredistest"
	"github.com/tollgate/tollgate/internal/testenv"
)

// pendingOf sums the tenant's pending units and overage units.
func pendingOf(tb testing.TB, r *quotaredis.Store, tenant string) (units, over int64) {
	tb.Helper()
	rows, err := r.Pending(context.Background(), tenant)
	if err != nil {
		tb.Fatal(err)
	}
	for _, row := range rows {
		units += row.Units
		over += row.Overage
	}
	return units, over
}

// TestSettleExactlyOnce: 64 clients (connections of their own, like 64
// API nodes) settle one reserved request at once: exactly one applies, the
// other 63 find it settled, and the counters and pending usage moved once.
// On one server and on a cluster.
func TestSettleExactlyOnce(t *testing.T) {
	t.Parallel()
	for name, newClient := range map[string]func(testing.TB) redis.UniversalClient{
		"single": testenv.Redis, "cluster": testenv.Cluster,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newClient(t)
			r := quotaredistest.OnPrefix(t, c, quotaredis.New)
			tenant := quotaredistest.NewTenant()
			now := quotaredistest.At(t, "2031-05-15T12:00:00Z")
			req := quota.Request{TenantID: tenant, Meter: "gen", Cost: 10, Now: now,
				Limits: quota.Limits{DailyQuota: quotaredistest.I64(1000), MonthlyQuota: quotaredistest.I64(5000)}}
			d := quotaredistest.MustAdmit(t, r, req)
			if err := r.Reserve(context.Background(), "rid-1", req, d); err != nil {
				t.Fatal(err)
			}
			// another tenant finds nothing under the id
			if s, err := r.Settle(context.Background(), quotaredistest.NewTenant(), "rid-1", 3); err != nil || s.Status != quota.SettleUnknown {
				t.Fatalf("another tenant's settle: %+v %v, want unknown", s, err)
			}
			var (
				wg               sync.WaitGroup
				mu               sync.Mutex
				applied, already int
			)
			for range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, err := r.Settle(context.Background(), tenant, "rid-1", 3)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					switch s.Status {
					case quota.SettleApplied:
						applied++
						if s.Delta != -7 {
							t.Errorf("delta %d, want -7", s.Delta)
						}
					case quota.SettleAlready:
						already++
					}
				}()
			}
			wg.Wait()
			if applied != 1 || already != 63 {
				t.Fatalf("applied %d, already %d; want 1 and 63", applied, already)
			}
			st := quotaredistest.StateOf(t, c, r, tenant)
			if st.Day.Used != 3 || st.Month.Used != 3 {
				t.Fatalf("day %d month %d used, want 3 and 3", st.Day.Used, st.Month.Used)
			}
			if u, _ := pendingOf(t, r, tenant); u != 3 {
				t.Fatalf("pending units %d, want 3", u)
			}
		})
	}
}

// TestSettleRefundAndCharge: a refund gives back the difference, overage
// first, as Refund does; a charge adds it unconditionally, past the quota
// (overage on a bill tier), and the next request is refused on a block
// tier.
func TestSettleRefundAndCharge(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r := quotaredistest.OnPrefix(t, c, quotaredis.New)
	ctx := context.Background()
	now := quotaredistest.At(t, "2031-05-15T12:00:00Z")

	t.Run("refund with overage", func(t *testing.T) {
		tenant := quotaredistest.NewTenant()
		req := quota.Request{TenantID: tenant, Meter: "gen", Cost: 10, Now: now, Overage: quota.OverageBill,
			Limits: quota.Limits{MonthlyQuota: quotaredistest.I64(15)}}
		quotaredistest.MustAdmit(t, r, req)
		d := quotaredistest.MustAdmit(t, r, req) // 5 of its 10 units overage
		if d.OverageUnits != 5 {
			t.Fatalf("overage %d, want 5", d.OverageUnits)
		}
		if err := r.Reserve(ctx, "a", req, d); err != nil {
			t.Fatal(err)
		}
		s, err := r.Settle(ctx, tenant, "a", 2)
		if err != nil || s.Status != quota.SettleApplied || s.Delta != -8 || s.OverageDelta != -5 {
			t.Fatalf("settle: %+v %v", s, err)
		}
		st := quotaredistest.StateOf(t, c, r, tenant)
		if st.Month.Used != 12 || st.Month.Overage != 0 {
			t.Fatalf("month %+v, want 12 used, 0 overage", st.Month)
		}
		if u, o := pendingOf(t, r, tenant); u != 12 || o != 0 {
			t.Fatalf("pending %d units %d overage, want 12 and 0", u, o)
		}
	})

	t.Run("charge on a bill tier", func(t *testing.T) {
		tenant := quotaredistest.NewTenant()
		req := quota.Request{TenantID: tenant, Meter: "gen", Cost: 10, Now: now, Overage: quota.OverageBill,
			Limits: quota.Limits{MonthlyQuota: quotaredistest.I64(15)}}
		d := quotaredistest.MustAdmit(t, r, req)
		if err := r.Reserve(ctx, "b", req, d); err != nil {
			t.Fatal(err)
		}
		s, err := r.Settle(ctx, tenant, "b", 25)
		if err != nil || s.Status != quota.SettleApplied || s.Delta != 15 || s.OverageDelta != 10 {
			t.Fatalf("settle: %+v %v", s, err)
		}
		st := quotaredistest.StateOf(t, c, r, tenant)
		if st.Month.Used != 25 || st.Month.Overage != 10 {
			t.Fatalf("month %+v, want 25 used, 10 overage", st.Month)
		}
		if u, o := pendingOf(t, r, tenant); u != 25 || o != 10 {
			t.Fatalf("pending %d units %d overage, want 25 and 10", u, o)
		}
	})

	t.Run("charge past a block quota", func(t *testing.T) {
		tenant := quotaredistest.NewTenant()
		req := quota.Request{TenantID: tenant, Meter: "gen", Cost: 5, Now: now,
			Limits: quota.Limits{DailyQuota: quotaredistest.I64(10)}}
		d := quotaredistest.MustAdmit(t, r, req)
		if err := r.Reserve(ctx, "c", req, d); err != nil {
			t.Fatal(err)
		}
		s, err := r.Settle(ctx, tenant, "c", 40)
		if err != nil || s.Status != quota.SettleApplied || s.Delta != 35 || s.OverageDelta != 0 {
			t.Fatalf("settle: %+v %v", s, err)
		}
		if st := quotaredistest.StateOf(t, c, r, tenant); st.Day.Used != 40 {
			t.Fatalf("day %+v, want 40 used", st.Day)
		}
		if u, _ := pendingOf(t, r, tenant); u != 40 {
			t.Fatalf("pending %d, want 40", u)
		}
		req.Cost = 1
		if d := quotaredistest.MustAdmit(t, r, req); d.Allowed {
			t.Fatalf("after a charge past the quota: %s, want a refusal", quotaredistest.FmtDecision(d))
		}
	})

	t.Run("after the window", func(t *testing.T) {
		tenant := quotaredistest.NewTenant()
		req := quota.Request{TenantID: tenant, Meter: "gen", Cost: 5, Now: now,
			Limits: quota.Limits{DailyQuota: quotaredistest.I64(10)}}
		d := quotaredistest.MustAdmit(t, r, req)
		if err := r.Reserve(ctx, "d", req, d); err != nil {
			t.Fatal(err)
		}
		// the window's end: the keys expire
		for _, k := range []string{r.Key(tenant, "settle:d")} {
			if ttl := c.PTTL(ctx, k).Val(); ttl <= 9*time.Minute || ttl > quota.SettleWindow {
				t.Fatalf("%s TTL %v, want the settle window", k, ttl)
			}
			c.PExpire(ctx, k, time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
		s, err := r.Settle(ctx, tenant, "d", 0)
		if err != nil || s.Status != quota.SettleUnknown {
			t.Fatalf("settle after the window: %+v %v", s, err)
		}
		if st := quotaredistest.StateOf(t, c, r, tenant); st.Day.Used != 5 {
			t.Fatalf("day %+v, want 5 used (nothing changed)", st.Day)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, a := range []int64{-1, quota.MaxQuantity + 1} {
			if _, err := r.Settle(ctx, quotaredistest.NewTenant(), "x", a); err == nil {
				t.Fatalf("actual %d: no error", a)
			}
		}
		if _, err := r.Settle(ctx, quotaredistest.NewTenant(), "a b", 1); err == nil {
			t.Fatal("request id with a space: no error")
		}
	})
}
