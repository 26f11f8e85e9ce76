package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// pendingTotals sums the tenant's pending rows.
func pendingTotals(tb testing.TB, r *stack, tenant string) quota.PendingRow {
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
// names.
func TestRecoverOutageCountsOnceAndMovesQuotas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, _ := mustRunner(t, testenv.Redis(t))
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
}

// TestRecoverOutageStopsOverageAtTheSpendCap: outage usage past the
// month's quotas is overage (the meter's at its price, a unit past both
// the meter's only) until the month's overage would cost more than the
// cap, in the order the units were admitted (a row's units past the
// tier's quota come before its units past the meter's too, which are its
// last), as admission would have refused them; past it the units are
// counted, not billed; then admission bills what room is left and refuses
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
	// other: 2 past the tier's quota (2 cents); search: its first 2 units
	// fit its quota and are the tier's overage (2 cents, 4 of 5), its last
	// 2 are past both, the meter's (2 cents each): the first would pass
	// the cap, so neither is billed
	if b.Rows[0].Overage != 2 || b.Rows[1].Overage != 2 || b.Rows[1].MeterOverage != 0 {
		t.Fatalf("counted %+v, want other 2 overage; search 2 overage, no meter overage", b.Rows)
	}
	if got := pendingTotals(t, r, req.TenantID); got.Units != 16 || got.Overage != 4 || got.MeterOverage != 0 {
		t.Fatalf("pending %+v, want 16 units, 4 overage, no meter overage", got)
	}
	if got := capLeft(t, r, req, time.Time{}); got != 1 {
		t.Fatalf("spend cap room after the outage: %d cents, want 1", got)
	}
	if d := mustAdmit(t, r, req); !d.Allowed || d.OverageUnits != 1 {
		t.Fatalf("after the outage: %s, want 1 unit of overage admitted (the cap's last cent)", fmtDecision(d))
	}
	d := mustAdmit(t, r, req)
	if d.Allowed || len(d.Violated) != 1 || d.Violated[0] != quota.LimitSpendCap {
		t.Fatalf("with the cap spent: %+v, want refused by the spend cap", d)
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

// outageRowAt is a row of units and requests of meter admitted at t.
func outageRowAt(meter string, t time.Time, units, requests int64) quota.OutageRow {
	return quota.OutageRow{Meter: meter, Hour: t.Truncate(time.Hour), At: t, Units: units, Requests: requests}
}

// TestRecoverOutageRollKeepsTheMonthBefore: outage rows of April reach a
// tenant whose state is still in March (nothing admitted through Redis in
// April yet). They start April as an admission does: March's counters stay
// the month before (the tier's w, the meter's "search|w", the meters'
// spend-cap total '$w'), where a refund or a settlement of a March request
// arriving after the roll finds them; April starts from the rows.
func TestRecoverOutageRollKeepsTheMonthBefore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, _ := mustRunner(t, testenv.Redis(t))
	march, april := at(t, "2031-03-31T23:50:00Z"), at(t, "2031-04-01T00:10:00Z")
	tenant := newTenant()
	req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 12, Now: march,
		MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}},
		Limits:      quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(100)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
	if d := mustAdmit(t, r, req); !d.Allowed || d.OverageUnits != 2 {
		t.Fatalf("March's demo: %s, want 2 units of overage", fmtDecision(d))
	}
	s := req
	s.Meter, s.Cost = "search", 3
	if d := mustAdmit(t, r, s); !d.Allowed || d.MeterOverageUnits != 3 {
		t.Fatalf("March's search: %s, want 3 units of the meter's overage", fmtDecision(d))
	}
	b := &quota.OutageBatch{ID: "outage-" + testenv.RandomHex(8), Request: req,
		Rows: []quota.OutageRow{outageRowAt("demo", april, 1, 1), outageRowAt("search", april, 1, 1)}}
	if err := r.RecoverOutage(ctx, b); err != nil {
		t.Fatal(err)
	}
	if b.Rows[0].Overage != 0 || b.Rows[1].MeterOverage != 1 || b.Rows[1].Overage != 0 {
		t.Errorf("April's rows counted %+v, want no overage for demo, 1 of the meter's for search", b.Rows)
	}
	// March: 15 units, 2 of the tier's overage; search's 3 units and
	// 3 of overage, 3,000 millicents; April: search's 1 unit of
	// overage, 1,000 millicents
	wantMonths(t, r, tenant, "after the outage", "203103,15,0,2",
		[3]string{"203103,3,3", "203103,3000", "203104,1000"}, [3]int64{203104, 1, 1})
}

// TestRecoverOutageOfTheMonthBeforeBillsItsOverage: an outage across the
// end of March whose rows arrive after April began (an admission rolled
// the state) counts March's rows into March: its units and overage into
// the month before (w, "search|w", '$w'), within March's spend cap (8
// cents: the tier's overage and the meters' at a cent a unit), as a
// settlement after the roll does; April's counters and room stay as they
// are. March: 10 units of demo (the quota), 2 of search (the meter's
// overage: 2 cents). Rows of 23:58: demo 4 (the tier's overage: 4 cents,
// 6 in all), search 4 (the meter's overage; 2 cents of room: 2 billed).
func TestRecoverOutageOfTheMonthBeforeBillsItsOverage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, _ := mustRunner(t, testenv.Redis(t))
	march, late, april := at(t, "2031-03-31T23:50:00Z"), at(t, "2031-03-31T23:58:00Z"), at(t, "2031-04-01T00:01:00Z")
	tenant := newTenant()
	req := func(meter string, cost int64, now time.Time) quota.Request {
		return quota.Request{TenantID: tenant, Meter: meter, Cost: cost, Now: now,
			MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}},
			Limits:      quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(8)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
	}
	for _, q := range []quota.Request{req("demo", 10, march), req("search", 2, march), req("search", 1, april)} {
		if d := mustAdmit(t, r, q); !d.Allowed {
			t.Fatalf("%s at %v: %s", q.Meter, q.Now, fmtDecision(d))
		}
	}
	b := &quota.OutageBatch{ID: "outage-" + testenv.RandomHex(8), Request: req("demo", 1, time.Time{}),
		Rows: []quota.OutageRow{outageRowAt("demo", late, 4, 4), outageRowAt("search", late, 4, 4)}}
	if err := r.RecoverOutage(ctx, b); err != nil {
		t.Fatal(err)
	}
	if b.Rows[0].Overage != 4 || b.Rows[1].Overage != 0 || b.Rows[1].MeterOverage != 2 {
		t.Errorf("March's rows counted %+v, want demo 4 of the tier's overage, search 2 of the meter's", b.Rows)
	}
	// March: 20 units, 4 of the tier's overage; search's 6 units, 4
	// of overage, 4,000 millicents; April as it was
	wantMonths(t, r, tenant, "after the outage", "203103,20,0,4",
		[3]string{"203103,6,4", "203103,4000", "203104,1000"}, [3]int64{203104, 1, 1})
	if o, m := pendingAt(t, r, tenant, late, "demo", "o"), pendingAt(t, r, tenant, late, "search", "m"); o != 4 || m != 4 {
		t.Errorf("March's last hour bills %d of the tier's overage, %d of the meter's; want 4 and 4 (8 cents: the cap)", o, m)
	}
	if got := capLeft(t, r, req("search", 1, april), april); got != 7 {
		t.Errorf("April's spend cap room %d cents, want 7", got)
	}
	// the rows' requests refunded (a later batch): March gives back
	// what they counted
	back := &quota.OutageBatch{ID: "outage-" + testenv.RandomHex(8), Request: b.Request,
		Rows: []quota.OutageRow{outageRowAt("demo", late, -4, 0), outageRowAt("search", late, -4, 0)}}
	back.Rows[0].Overage, back.Rows[1].MeterOverage = 4, 2
	if err := r.RecoverOutage(ctx, back); err != nil {
		t.Fatal(err)
	}
	if back.Rows[0].Overage != -4 || back.Rows[1].MeterOverage != -2 || back.Rows[1].Overage != 0 {
		t.Errorf("given back %+v, want demo 4 of the tier's overage, search 2 of the meter's", back.Rows)
	}
	wantMonths(t, r, tenant, "after the give-back", "203103,12,0,0",
		[3]string{"203103,2,2", "203103,2000", "203104,1000"}, [3]int64{203104, 1, 1})
	if d := mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Now: april, DryRun: true,
		Limits: quota.Limits{MonthlyQuota: i64(10)}}); limitOf(t, d, "monthly").Remaining != 8 {
		t.Errorf("April's quota: %s, want 8 left after a dry run of 1 (April's 1 unit only)", fmtDecision(d))
	}
}

// TestRecoverOutageGivesBackNoMoreOverageThanUnits: a later row of
// negative units (its requests refunded) gives back at most as many
// overage units as units: its last units first, the meter's overage, then
// the tier's, within what the row names. The tier's quota of 10 is filled
// by demo; search's 4 units are past it, 2 of them past search's own
// quota of 2 too (the meter's only): 2 of each overage. Giving back 2 of
// search's units gives back the meter's 2 alone.
func TestRecoverOutageGivesBackNoMoreOverageThanUnits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, _ := mustRunner(t, testenv.Redis(t))
	req := quota.Request{TenantID: newTenant(), Meter: "demo", Cost: 1, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
		Limits:      quota.Limits{MonthlyQuota: i64(10)},
		MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(2), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}}}
	b := &quota.OutageBatch{ID: "outage-" + testenv.RandomHex(8), Request: req,
		Rows: []quota.OutageRow{outageRow("demo", 10, 10), outageRow("search", 4, 4)}}
	if err := r.RecoverOutage(ctx, b); err != nil {
		t.Fatal(err)
	}
	if b.Rows[1].Overage != 2 || b.Rows[1].MeterOverage != 2 {
		t.Fatalf("search counted %+v, want 2 of the tier's overage, 2 of the meter's", b.Rows[1])
	}
	back := &quota.OutageBatch{ID: "outage-" + testenv.RandomHex(8), Request: req, Rows: []quota.OutageRow{outageRow("search", -2, 0)}}
	back.Rows[0].Overage, back.Rows[0].MeterOverage = 2, 2 // what the node recovered for the row, each at most its units
	if err := r.RecoverOutage(ctx, back); err != nil {
		t.Fatal(err)
	}
	if back.Rows[0].Overage != 0 || back.Rows[0].MeterOverage != -2 {
		t.Errorf("given back %+v, want the meter's 2 units of overage only", back.Rows[0])
	}
	if got := pendingTotals(t, r, req.TenantID); got.Units != 12 || got.Overage != 2 || got.MeterOverage != 0 {
		t.Errorf("pending %+v, want 12 units, 2 of the tier's overage, none of the meter's", got)
	}
}
