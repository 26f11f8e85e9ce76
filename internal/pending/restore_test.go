package pending_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/quotaredis/quotaredistest"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestRestoreKeepsTheMonthBefore: a repair in April of a tenant whose
// Redis still holds March (the loss was on another master of a cluster,
// say) starts April as an admission does: March's meter counters stay the
// month before ("search|w"), so that a settlement of a March request after
// the repair rates March's meter overage, and moves March's spend-cap
// total, not April's. Search bills past 10 units a month at a cent a unit:
// A (12 units at 23:55 on March 31, 2 of overage) settled to 20 after the
// repair bills 8 more units of March's overage.
func TestRestoreKeepsTheMonthBefore(t *testing.T) {
	t.Parallel()
	r := quotaredistest.OnPrefix(t, testenv.Redis(t), quotaredis.New)
	ctx := context.Background()
	march, april := quotaredistest.At(t, "2031-03-31T23:55:00Z"), quotaredistest.At(t, "2031-04-01T00:05:00Z")
	tenant := quotaredistest.NewTenant()
	qs := []quota.MeterQuota{{Meter: "search", MonthlyQuota: quotaredistest.I64(10), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}}
	a := quota.Request{TenantID: tenant, Meter: "search", Cost: 12, Now: march, MeterQuotas: qs,
		Limits: quota.Limits{MonthlyQuota: quotaredistest.I64(1000), MaxOverageCents: quotaredistest.I64(100)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
	da := quotaredistest.MustAdmit(t, r, a)
	if !da.Allowed || da.MeterOverageUnits != 2 {
		t.Fatalf("A: %s, want 2 units of the meter's overage", quotaredistest.FmtDecision(da))
	}
	if err := r.Reserve(ctx, "a-"+tenant, a, da); err != nil {
		t.Fatal(err)
	}
	rec := quota.Recorded{TenantID: tenant, DayUnits: 3, MonthUnits: 3,
		Meters: []quota.MeterRecorded{{Meter: "search", DayUnits: 3, MonthUnits: 3}}}
	if err := r.Restore(ctx, april, []quota.Recorded{rec}); err != nil {
		t.Fatal(err)
	}
	if s, err := r.Settle(ctx, tenant, "a-"+tenant, 20); err != nil || s.Status != quota.SettleApplied {
		t.Fatalf("settle: %+v %v", s, err)
	}
	if m := quotaredistest.PendingAt(t, r, tenant, march, "search", "m"); m != 10 {
		t.Errorf("March's meter overage billed %d, want 10 (A's 2, then 8 of its settlement)", m)
	}
	// March: 20 units (the tier's and search's), 10 of search's overage,
	// its 10,000 millicents; April: the ledger's 3 units
	quotaredistest.WantMonths(t, r, tenant, "after the settlement", "203103,20,0,0",
		[3]string{"203103,20,10", "", "203103,10000"}, [3]int64{203104, 3, 0})
}

// TestRestoreLeavesALaterMonthAlone: a repair computed for April 30
// 23:59:59 (the worker's clock) that reaches a state Redis already moved
// into May (an admission at 00:00:05 by Redis's clock) leaves May's
// counters as they are: it never rolls a state back to an earlier day or
// month, which would empty May's usage at the next admission.
func TestRestoreLeavesALaterMonthAlone(t *testing.T) {
	t.Parallel()
	r := quotaredistest.OnPrefix(t, testenv.Redis(t), quotaredis.New)
	ctx := context.Background()
	may := quotaredistest.At(t, "2031-05-01T00:00:05Z")
	tenant := quotaredistest.NewTenant()
	lim := quota.Limits{DailyQuota: quotaredistest.I64(100), MonthlyQuota: quotaredistest.I64(1000)}
	if d := quotaredistest.MustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "demo", Cost: 5, Now: may, Limits: lim}); !d.Allowed {
		t.Fatalf("May's admission: %s", quotaredistest.FmtDecision(d))
	}
	rec := quota.Recorded{TenantID: tenant, DayUnits: 40, MonthUnits: 400}
	if err := r.Restore(ctx, quotaredistest.At(t, "2031-04-30T23:59:59Z"), []quota.Recorded{rec}); err != nil {
		t.Fatal(err)
	}
	d := quotaredistest.MustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Now: may.Add(time.Second), DryRun: true, Limits: lim})
	if day, month := quotaredistest.LimitOf(t, d, quota.LimitDaily), quotaredistest.LimitOf(t, d, quota.LimitMonthly); day.Remaining != 94 || month.Remaining != 994 {
		t.Errorf("May after a repair of April: daily %d, monthly %d left; want 94 and 994 (May's 5 units and the dry run's 1)", day.Remaining, month.Remaining)
	}
}

// TestRestorePrepaidLeavesALaterPeriodAlone: a repair of a prepaid
// tenant's credit draws computed for April (the worker's clock) that
// reaches draws Redis already counts for May leaves them as they are:
// rolled back to April, May's draws would be lost to the balance check.
func TestRestorePrepaidLeavesALaterPeriodAlone(t *testing.T) {
	t.Parallel()
	r := quotaredistest.OnPrefix(t, testenv.Redis(t), quotaredis.New)
	ctx := context.Background()
	tenant := quotaredistest.NewTenant()
	may := quotaredistest.At(t, "2031-05-01T00:00:05Z")
	req := quota.Request{TenantID: tenant, Meter: "gen", Cost: 3, Now: may,
		Limits: quota.Limits{MonthlyQuota: quotaredistest.I64(0)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
		Prepaid: &quota.Prepaid{BalanceMillicents: 1_000_000, PeriodID: 203105, PrevID: 203104}}
	if d := quotaredistest.MustAdmit(t, r, req); !d.Allowed {
		t.Fatalf("May's admission: %s", quotaredistest.FmtDecision(d))
	}
	rec := quota.PrepaidRecorded{TenantID: tenant, Period: 203104, Millicents: 7000, Prev: 203103, PrevMillicents: 2000,
		Until: quotaredistest.At(t, "2031-05-01T00:00:00Z")}
	if err := r.RestorePrepaid(ctx, []quota.PrepaidRecorded{rec}); err != nil {
		t.Fatal(err)
	}
	if got := quotaredistest.MeterHash(t, r, tenant, "P"); got[0] != "203105,3000,-1,0" {
		t.Errorf("credit draws after a repair of April: %q, want May's 3,000 millicents as they were", got[0])
	}
}
