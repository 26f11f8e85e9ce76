package ratelimit

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestSpendCapExactUnderConcurrency: 64 clients (connections of their own,
// like 64 API nodes) admit cost 1 on a bill tier with a monthly quota of
// 100, an overage price of 1000 cents per 1,000 units (a cent a unit) and
// a spend cap of 50 cents: exactly 150 units are admitted, 50 of them
// overage, and every refusal names spend_cap with a retry to the month's
// end. On one server and on a cluster.
func TestSpendCapExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	for name, newClient := range map[string]func(testing.TB) redis.UniversalClient{
		"single": testenv.Redis, "cluster": testenv.Cluster,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const workers, quotaN, capCents, want = 64, 100, 50, 150
			c := newClient(t)
			_, prefix := mustRunner(t, c)
			tenant := newTenant()
			now := at(t, "2031-05-15T12:00:00Z")
			monthEnd := at(t, "2031-06-01T00:00:00Z")
			limits := quota.Limits{MonthlyQuota: i64(quotaN), MaxOverageCents: i64(capCents)}
			ok, refusals := untilRefused(t, workers, newClient, prefix, func(int) quota.Request {
				return quota.Request{TenantID: tenant, Meter: "demo", Cost: 1,
					Limits: limits, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000, Now: now}
			})
			admitted, over := count(ok), int64(0)
			for _, ds := range ok {
				for _, d := range ds {
					over += d.OverageUnits
				}
			}
			if admitted != want || over != capCents {
				t.Errorf("admitted %d units, %d of them overage; want exactly %d and %d", admitted, over, want, capCents)
			}
			if len(refusals) != workers {
				t.Fatalf("%d refusals, want one per worker (%d)", len(refusals), workers)
			}
			for _, d := range refusals {
				if !slices.Equal(d.Violated, []quota.LimitName{quota.LimitSpendCap}) || d.RetryAfter != monthEnd.Sub(now) {
					t.Fatalf("refusal: violated %v retry %v, want [spend_cap] and %v", d.Violated, d.RetryAfter, monthEnd.Sub(now))
				}
			}
			got := sumPending(t, newStack(c, prefix), tenant)
			if got["u"] != want || got["r"] != want || got["o"] != capCents || got["x"] != workers {
				t.Errorf("pending: got %v, want u=r=%d o=%d x=%d", got, want, capCents, workers)
			}
		})
	}
}

// TestSpendCapRules: the rounding of the cap to units, a cost whose
// overage passes the cap even in a fresh month (never), a block tier and a
// cap of 0 (no overage at all), and a request that would pass the cap in
// part (refused whole, consuming nothing).
func TestSpendCapRules(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	now := at(t, "2031-05-15T12:00:00Z")
	admit := func(tenant string, cost int64, l quota.Limits, o quota.Overage, price int64) quota.Decision {
		t.Helper()
		d, err := r.Admit(ctx, quota.Request{TenantID: tenant, Meter: "m", Cost: cost, Limits: l, Overage: o,
			OveragePriceCentsPer1K: price, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// 7 cents per 1,000 units, a cap of 1 cent: 142 units (0.994 cent) pass
	if got := quota.SpendCapUnits(i64(1), quota.OverageBill, 7); got != 142 {
		t.Errorf("SpendCapUnits(1 cent, 7/1k) = %d, want 142", got)
	}
	if quota.SpendCapUnits(nil, quota.OverageBill, 7) != -1 || quota.SpendCapUnits(i64(5), quota.OverageBlock, 7) != -1 {
		t.Errorf("no cap, or a block tier: want -1")
	}
	tn := newTenant()
	l := quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(1)}
	if d := admit(tn, 10+142, l, quota.OverageBill, 7); !d.Allowed || d.OverageUnits != 142 {
		t.Fatalf("the quota and 142 units of overage: %+v", d)
	}
	if d := admit(tn, 1, l, quota.OverageBill, 7); d.Allowed || !slices.Equal(d.Violated, []quota.LimitName{quota.LimitSpendCap}) {
		t.Fatalf("the 143rd unit of overage: %+v", d)
	}
	// a cost whose overage alone passes the cap: never
	tn = newTenant()
	if d := admit(tn, 10+143, l, quota.OverageBill, 7); d.Allowed || d.RetryAfter != -time.Microsecond {
		t.Fatalf("cost past quota + cap: allowed %t retry %v, want a refusal that never passes", d.Allowed, d.RetryAfter)
	}
	// refused whole: the 5 units that still fit are not taken
	tn = newTenant()
	l = quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(5)}
	admit(tn, 10, l, quota.OverageBill, 1000)
	if d := admit(tn, 6, l, quota.OverageBill, 1000); d.Allowed {
		t.Fatalf("6 units of overage past a cap of 5: admitted")
	}
	if d := admit(tn, 5, l, quota.OverageBill, 1000); !d.Allowed || d.OverageUnits != 5 {
		t.Fatalf("5 units after a refusal of 6: %+v", d)
	}
	// a cap of 0: no overage at all
	tn = newTenant()
	l = quota.Limits{MonthlyQuota: i64(3), MaxOverageCents: i64(0)}
	if d := admit(tn, 3, l, quota.OverageBill, 1000); !d.Allowed || d.OverageUnits != 0 {
		t.Fatalf("within the quota: %+v", d)
	}
	if d := admit(tn, 1, l, quota.OverageBill, 1000); d.Allowed {
		t.Fatalf("overage past a cap of 0: admitted")
	}
	// a block tier: the monthly quota refuses, the cap does not apply
	if d := admit(tn, 1, l, quota.OverageBlock, 0); d.Allowed || !slices.Equal(d.Violated, []quota.LimitName{quota.LimitMonthly}) {
		t.Fatalf("block tier: %+v", d)
	}
}
