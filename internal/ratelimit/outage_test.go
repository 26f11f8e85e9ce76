package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// pendingTotals sums the tenant's pending rows.
func pendingTotals(tb testing.TB, r *Runner, tenant string) quota.PendingRow {
	tb.Helper()
	rows, err := r.Pending(context.Background(), tenant)
	if err != nil {
		tb.Fatal(err)
	}
	var t quota.PendingRow
	for _, row := range rows {
		t.Units += row.Units
		t.Requests += row.Requests
		t.Overage += row.Overage
		t.MeterOverage += row.MeterOverage
	}
	return t
}

func outageRow(meter string, units, requests int64) quota.OutageRow {
	now := time.Now()
	return quota.OutageRow{Meter: meter, Hour: now.Truncate(time.Hour), At: now, Units: units, Requests: requests}
}

// TestRecoverOutageCountsOnceAndMovesQuotas: a batch of fail-open usage
// adds its units, requests and overage (past the month's quota) to the
// pending usage and the quota counters, once: sent again under its id (a
// retry after a timeout), it changes nothing and answers the same counts.
// A later row of negative units gives back the units and the overage it
// names. In both key layouts.
func TestRecoverOutageCountsOnceAndMovesQuotas(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"v2", "v1"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			r, _ := mustRunner(t, testenv.Redis(t))
			r = r.WithLayout(layout)
			req := quota.Request{TenantID: newTenant(), Meter: "demo", Cost: 8, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
				Limits: quota.Limits{DailyQuota: i64(100), MonthlyQuota: i64(10)}}
			mustAdmit(t, r, req)
			b := &quota.OutageBatch{ID: "outage-" + testenv.RandomHex(8), Request: req, Rows: []quota.OutageRow{outageRow("demo", 5, 2)}}
			for try := range 2 {
				if err := r.RecoverOutage(ctx, b); err != nil {
					t.Fatal(err)
				}
				if got := b.Rows[0].Overage; got != 3 {
					t.Fatalf("try %d: overage %d, want 3 (8 + 5 past a quota of 10)", try, got)
				}
				if got := pendingTotals(t, r, req.TenantID); got.Units != 13 || got.Requests != 3 || got.Overage != 3 {
					t.Fatalf("try %d: pending %+v, want 13 units, 3 requests, 3 overage (counted once)", try, got)
				}
				d, err := r.Peek(ctx, req.TenantID, req.Limits, time.Time{})
				if err != nil {
					t.Fatal(err)
				}
				day, _ := d.Limit(quota.LimitDaily)
				month, _ := d.Limit(quota.LimitMonthly)
				if day.Remaining != 100-13 || month.Remaining != 0 {
					t.Fatalf("try %d: daily %d monthly %d remaining, want %d and 0", try, day.Remaining, month.Remaining, 100-13)
				}
			}
			back := &quota.OutageBatch{ID: "outage-" + testenv.RandomHex(8), Request: req, Rows: []quota.OutageRow{outageRow("demo", -5, 0)}}
			back.Rows[0].Overage = 3
			if err := r.RecoverOutage(ctx, back); err != nil {
				t.Fatal(err)
			}
			if got := pendingTotals(t, r, req.TenantID); got.Units != 8 || got.Requests != 3 || got.Overage != 0 {
				t.Fatalf("after giving back: pending %+v, want 8 units, 3 requests, 0 overage", got)
			}
		})
	}
}

// TestRecoverOutageStopsOverageAtTheSpendCap: outage usage past the
// month's quotas is overage (the meter's at its price, a unit past both
// the meter's only) until the month's overage would cost more than the
// cap; past it the units are counted, not billed; then admission refuses
// overage for the cap.
func TestRecoverOutageStopsOverageAtTheSpendCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, _ := mustRunner(t, testenv.Redis(t))
	// tier: 10 a month, then 1 cent a unit, at most 5 cents; search: 2 a
	// month, then 2 cents a unit
	req := quota.Request{TenantID: newTenant(), Meter: "other", Cost: 1, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
		Limits:      quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(5)},
		MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(2), Overage: quota.OverageBill, OveragePriceCentsPer1K: 2000}}}
	b := &quota.OutageBatch{ID: "outage-" + testenv.RandomHex(8), Request: req,
		Rows: []quota.OutageRow{outageRow("other", 12, 12), outageRow("search", 4, 4)}}
	if err := r.RecoverOutage(ctx, b); err != nil {
		t.Fatal(err)
	}
	// other: 2 past the tier's quota (2 cents); search: 2 past its quota,
	// 1 billed (2 cents, 4 of 5), then of its 2 past the tier's too only
	// 1 fits (1 cent): 5 cents in all
	if b.Rows[0].Overage != 2 || b.Rows[1].MeterOverage != 1 || b.Rows[1].Overage != 1 {
		t.Fatalf("counted %+v, want other 2 overage; search 1 meter overage, 1 overage", b.Rows)
	}
	if got := pendingTotals(t, r, req.TenantID); got.Units != 16 || got.Overage != 3 || got.MeterOverage != 1 {
		t.Fatalf("pending %+v, want 16 units, 3 overage, 1 meter overage", got)
	}
	d := mustAdmit(t, r, req)
	if d.Allowed || len(d.Violated) != 1 || d.Violated[0] != quota.LimitSpendCap {
		t.Fatalf("after the outage: %+v, want refused by the spend cap", d)
	}
}

// TestRecoverOutageRefusesBadInput: a batch the script cannot take is a
// CodeInvalid error and writes nothing.
func TestRecoverOutageRefusesBadInput(t *testing.T) {
	t.Parallel()
	r, prefix := mustRunner(t, testenv.Redis(t))
	req := quota.Request{TenantID: newTenant()}
	for name, b := range map[string]quota.OutageBatch{
		"no rows":     {ID: "outage-1", Request: req},
		"bad id":      {ID: "a b", Request: req, Rows: []quota.OutageRow{outageRow("demo", 1, 1)}},
		"bad meter":   {ID: "outage-1", Request: req, Rows: []quota.OutageRow{outageRow("a|b", 1, 1)}},
		"bad tenant":  {ID: "outage-1", Request: quota.Request{TenantID: "{x}"}, Rows: []quota.OutageRow{outageRow("demo", 1, 1)}},
		"empty meter": {ID: "outage-1", Request: req, Rows: []quota.OutageRow{outageRow("", 1, 1)}},
	} {
		if err := r.RecoverOutage(context.Background(), &b); quota.ErrorCode(err) != quota.CodeInvalid {
			t.Errorf("%s: %v, want a CodeInvalid error", name, err)
		}
	}
	if keys := mustKeys(t, testenv.Redis(t), prefix); len(keys) != 0 {
		t.Fatalf("bad batches wrote %v", keys)
	}
}
