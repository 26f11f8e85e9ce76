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

// TestMeterQuotaBesideTierQuotas: a tier with a daily quota of 3 and a
// monthly quota of 5 units for meter "search" (blocked past it) and a
// tier-wide daily quota of 100: searches stop at the meter's daily quota
// with search.daily (retry at the next UTC midnight) then at its monthly
// one with search.monthly, other meters go on, the meter's limits are in
// the decision after the tier's, refusals consume nothing, and the
// tier-wide quota counts every meter.
func TestMeterQuotaBesideTierQuotas(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	qs := []quota.MeterQuota{
		{Meter: "search", DailyQuota: i64(3), MonthlyQuota: i64(5), Overage: quota.OverageBlock},
		{Meter: "export", MonthlyQuota: i64(1), Overage: quota.OverageBlock},
	}
	limits := quota.Limits{DailyQuota: i64(100)}
	req := func(meter string, cost int64, now time.Time) quota.Request {
		return quota.Request{TenantID: tenant, Meter: meter, Cost: cost, Limits: limits, Overage: quota.OverageBlock,
			MeterQuotas: qs, Now: now}
	}
	day1 := at(t, "2031-03-10T08:00:00Z")
	for i := range 3 {
		d := mustAdmit(t, r, req("search", 1, day1))
		if !d.Allowed {
			t.Fatalf("search %d refused: %s", i, fmtDecision(d))
		}
		if l := limitOf(t, d, "search.daily"); l.Limit != 3 || l.Remaining != int64(2-i) || !l.Reset.Equal(at(t, "2031-03-11T00:00:00Z")) {
			t.Fatalf("search %d: search.daily %+v", i, l)
		}
		if l := limitOf(t, d, "search.monthly"); l.Limit != 5 || l.Remaining != int64(4-i) || !l.Reset.Equal(at(t, "2031-04-01T00:00:00Z")) {
			t.Fatalf("search %d: search.monthly %+v", i, l)
		}
		if names := limitNames(d); !slices.Equal(names, []quota.LimitName{"daily", "search.daily", "search.monthly"}) {
			t.Fatalf("limits %v", names)
		}
	}
	d := mustAdmit(t, r, req("search", 1, day1))
	if d.Allowed || !slices.Equal(d.Violated, []quota.LimitName{"search.daily"}) || d.RetryAfter != 16*time.Hour {
		t.Fatalf("4th search: %s, want refused by search.daily, retry 16h", fmtDecision(d))
	}
	if l := limitOf(t, d, "daily"); l.Remaining != 97 {
		t.Fatalf("tier daily after a refusal: %+v, want 97 left", l)
	}
	// another meter: its own quota, and the tier's
	d = mustAdmit(t, r, req("demo", 5, day1))
	if !d.Allowed || len(d.Limits) != 1 || d.Limits[0].Remaining != 92 {
		t.Fatalf("demo: %s", fmtDecision(d))
	}
	d = mustAdmit(t, r, req("export", 2, day1))
	if d.Allowed || !slices.Equal(d.Violated, []quota.LimitName{"export.monthly"}) || d.RetryAfter >= 0 {
		t.Fatalf("export of 2 with a quota of 1: %s, want refused for good (retry < 0)", fmtDecision(d))
	}
	// the next day: 2 more searches fit the month's 5, the third does not
	day2 := day1.Add(24 * time.Hour)
	for i := range 2 {
		if d := mustAdmit(t, r, req("search", 1, day2)); !d.Allowed {
			t.Fatalf("day 2 search %d: %s", i, fmtDecision(d))
		}
	}
	d = mustAdmit(t, r, req("search", 1, day2))
	if d.Allowed || !slices.Equal(d.Violated, []quota.LimitName{"search.monthly"}) || !d.Now.Add(d.RetryAfter).Equal(at(t, "2031-04-01T00:00:00Z")) {
		t.Fatalf("day 2, 3rd search: %s, want refused by search.monthly until April", fmtDecision(d))
	}
	// a dry run decides the same and writes nothing
	d = mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "search", Cost: 1, Limits: limits, MeterQuotas: qs, Now: day2, DryRun: true})
	if d.Allowed {
		t.Fatalf("dry run: %s", fmtDecision(d))
	}
	// the read model sees the same room
	peek, err := r.PeekMeterQuotas(context.Background(), tenant, quota.Calendar{}, qs, day2)
	if err != nil {
		t.Fatal(err)
	}
	want := []quota.LimitState{
		{Name: "search.daily", Limit: 3, Remaining: 1, Reset: at(t, "2031-03-12T00:00:00Z"), Window: 24 * time.Hour},
		{Name: "search.monthly", Limit: 5, Remaining: 0, Reset: at(t, "2031-04-01T00:00:00Z"), Window: 31 * 24 * time.Hour},
		{Name: "export.monthly", Limit: 1, Remaining: 1, Reset: at(t, "2031-04-01T00:00:00Z"), Window: 31 * 24 * time.Hour},
	}
	if !slices.EqualFunc(peek, want, func(a, b quota.LimitState) bool {
		return a.Name == b.Name && a.Limit == b.Limit && a.Remaining == b.Remaining && a.Reset.Equal(b.Reset) && a.Window == b.Window
	}) {
		t.Fatalf("PeekMeterQuotas:\n got %+v\nwant %+v", peek, want)
	}
	// a new month starts the meter's counters again
	if d := mustAdmit(t, r, req("search", 1, at(t, "2031-04-01T00:00:00Z"))); !d.Allowed || limitOf(t, d, "search.monthly").Remaining != 4 {
		t.Fatalf("April: %s", fmtDecision(d))
	}
}

func limitNames(d quota.Decision) []quota.LimitName {
	var out []quota.LimitName
	for _, l := range d.Limits {
		out = append(out, l.Name)
	}
	return out
}

// TestMeterOverageIsBilledOnce: "search" bills past 5 units a month at
// 100 cents per 1,000, the tier bills past 8 at 10 cents. Requests of cost
// 3: the first admits 3 (no overage), the second 3 (1 meter overage), the
// third 3 (3 meter overage; 1 of them past the tier's 8 too, counted as the
// meter's only), a demo request of 2 then is tier overage (3+3+3+2 = 11,
// past 8: 2 units, its own). The pending usage holds them apart.
func TestMeterOverageIsBilledOnce(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	qs := []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(5), Overage: quota.OverageBill, OveragePriceCentsPer1K: 100}}
	now := at(t, "2031-03-10T08:00:00Z")
	var tierOver []int64
	for _, meter := range []string{"search", "search", "search", "demo"} {
		cost := int64(3)
		if meter == "demo" {
			cost = 2
		}
		d := mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: meter, Cost: cost, Limits: quota.Limits{MonthlyQuota: i64(8)},
			Overage: quota.OverageBill, OveragePriceCentsPer1K: 10, MeterQuotas: qs, Now: now})
		if !d.Allowed {
			t.Fatalf("%s: %s", meter, fmtDecision(d))
		}
		tierOver = append(tierOver, d.OverageUnits)
	}
	if !slices.Equal(tierOver, []int64{0, 0, 0, 2}) {
		t.Fatalf("tier overage per request %v, want [0 0 0 2]", tierOver)
	}
	rows, err := r.Pending(context.Background(), tenant)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][2]int64{}
	for _, row := range rows {
		got[row.Meter] = [2]int64{row.Overage, row.MeterOverage}
	}
	if got["search"] != [2]int64{0, 4} || got["demo"] != [2]int64{2, 0} {
		t.Fatalf("pending (overage, meter overage) per meter %v, want search {0 4}, demo {2 0}", got)
	}
}

// TestMeterSpendCapExactUnderConcurrency: the spend cap bounds the tier's
// and the meters' overage together, in millicents, exactly, with 64
// clients of their own (like 64 API nodes) on one server and a cluster.
// The tier bills past 10 units at 1,000 cents per 1,000 (a cent a unit),
// "search" has a monthly quota of 0 billed at 300 (0.3 cent a unit), the
// cap is 10 cents. Demo requests fill the tier's quota; then every search
// unit is past both quotas, the meter's overage only: 33 of them (9.9
// cents) pass and the 34th (10.2) is refused; a demo request (tier
// overage, a cent) is refused too, as the cap holds 0.1 cent.
func TestMeterSpendCapExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	for name, newClient := range map[string]func(testing.TB) redis.UniversalClient{
		"single": testenv.Redis, "cluster": testenv.Cluster,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const workers = 64
			c := newClient(t)
			_, prefix := mustRunner(t, c)
			tenant := newTenant()
			now := at(t, "2031-05-15T12:00:00Z")
			qs := []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 300}}
			req := func(meter string) quota.Request {
				return quota.Request{TenantID: tenant, Meter: meter, Cost: 1, Now: now, MeterQuotas: qs,
					Limits: quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(10)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
			}
			// the tier's quota first, with demo requests
			r0 := newStack(newClient(t), prefix)
			for range 10 {
				if d := mustAdmit(t, r0, req("demo")); !d.Allowed {
					t.Fatalf("demo: %s", fmtDecision(d))
				}
			}
			ok, refusals := untilRefused(t, workers, newClient, prefix, func(int) quota.Request { return req("search") })
			admitted := count(ok)
			if admitted != 33 {
				t.Errorf("admitted %d searches, want exactly 33", admitted)
			}
			for _, d := range refusals {
				if !slices.Equal(d.Violated, []quota.LimitName{quota.LimitSpendCap}) {
					t.Fatalf("refusal: violated %v, want [spend_cap]", d.Violated)
				}
			}
			if d := mustAdmit(t, r0, req("demo")); d.Allowed || !slices.Equal(d.Violated, []quota.LimitName{quota.LimitSpendCap}) {
				t.Fatalf("demo past the tier's quota with 0.1 cent of cap left: %s", fmtDecision(d))
			}
			rows, err := r0.Pending(context.Background(), tenant)
			if err != nil {
				t.Fatal(err)
			}
			var meterOver, tierOver int64
			for _, row := range rows {
				meterOver += row.MeterOverage
				tierOver += row.Overage
			}
			if meterOver != 33 || tierOver != 0 {
				t.Fatalf("pending overage: meter %d, tier %d; want 33 and 0", meterOver, tierOver)
			}
		})
	}
}

// TestMeterQuotaExactUnderConcurrency: 64 clients race for a meter's
// monthly quota of 100 (blocked past it); exactly 100 are admitted, on one
// server and on a cluster.
func TestMeterQuotaExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	for name, newClient := range map[string]func(testing.TB) redis.UniversalClient{
		"single": testenv.Redis, "cluster": testenv.Cluster,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newClient(t)
			_, prefix := mustRunner(t, c)
			tenant := newTenant()
			qs := []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(100), Overage: quota.OverageBlock}}
			ok, refused := untilRefused(t, 64, newClient, prefix, func(int) quota.Request {
				return quota.Request{TenantID: tenant, Meter: "search", Cost: 1, MeterQuotas: qs}
			})
			if n := count(ok); n != 100 {
				t.Fatalf("admitted %d, want exactly 100", n)
			}
			for _, d := range refused {
				if !slices.Equal(d.Violated, []quota.LimitName{"search.monthly"}) {
					t.Errorf("refusal names %v", d.Violated)
				}
			}
		})
	}
}

// TestMeterQuotaWithPolicies: a meter quota and policies (in the tenant's
// slot and a global one reserved in its own) decide together, all or
// nothing: the meter quota refuses the 3rd request, and neither policy
// loses room for it; the policies' items follow the meter's.
func TestMeterQuotaWithPolicies(t *testing.T) {
	t.Parallel()
	for name, newClient := range map[string]func(testing.TB) redis.UniversalClient{
		"single": testenv.Redis, "cluster": testenv.Cluster,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, _ := mustRunner(t, newClient(t))
			tenant := newTenant()
			now := at(t, "2026-05-04T10:00:00Z")
			own := fixedWindow("pol-"+testenv.RandomHex(3), 10, quota.ScopeTenant, quota.RefuseReject)
			global := fixedWindow("pol-"+testenv.RandomHex(3), 10, quota.ScopeGlobal, quota.RefuseReject)
			qs := []quota.MeterQuota{{Meter: "m", MonthlyQuota: i64(2), Overage: quota.OverageBlock}}
			for i := range 3 {
				req := policyReq(tenant, now, i, 100, own, global)
				req.MeterQuotas = qs
				d := mustAdmit(t, r, req)
				if d.Allowed != (i < 2) {
					t.Fatalf("request %d: %s", i, fmtDecision(d))
				}
				if l := limitOf(t, d, "m.monthly"); l.Remaining != int64(max(0, 1-i)) {
					t.Fatalf("request %d: m.monthly %+v", i, l)
				}
				for _, p := range []*quota.Policy{own, global} {
					if got := policyRemaining(t, d, p.Name); got != 10-int64(min(i+1, 2)) {
						t.Fatalf("request %d: policy %s remaining %d, want %d", i, p.Name, got, 10-min(i+1, 2))
					}
				}
				if i == 2 && !slices.Equal(d.Violated, []quota.LimitName{"m.monthly"}) {
					t.Fatalf("3rd request violated %v, want [m.monthly]", d.Violated)
				}
			}
		})
	}
}

// TestMeterQuotaRefund: a refunded request gives its units back to its
// meter's quota too, its meter overage first, with the pending meter
// overage and the spend cap's millicents: after the refund the month's
// room is as if the request had not happened.
func TestMeterQuotaRefund(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	now := at(t, "2031-03-10T08:00:00Z")
	qs := []quota.MeterQuota{{Meter: "search", DailyQuota: i64(100), MonthlyQuota: i64(5), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}}
	req := quota.Request{TenantID: tenant, Meter: "search", Cost: 4, Now: now, MeterQuotas: qs,
		Limits: quota.Limits{MonthlyQuota: i64(1000), MaxOverageCents: i64(5)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1}
	first := mustAdmit(t, r, req)  // 4 of 5
	second := mustAdmit(t, r, req) // 8: 3 of meter overage (3 cents)
	if !first.Allowed || !second.Allowed {
		t.Fatalf("admissions: %s / %s", fmtDecision(first), fmtDecision(second))
	}
	if d := mustAdmit(t, r, req); d.Allowed || !slices.Equal(d.Violated, []quota.LimitName{quota.LimitSpendCap}) {
		t.Fatalf("third (4 more cents past a cap of 5 with 3 spent): %s, want spend_cap", fmtDecision(d))
	}
	if err := r.RefundRequest(context.Background(), req, second); err != nil {
		t.Fatal(err)
	}
	rows, err := r.Pending(context.Background(), tenant)
	if err != nil {
		t.Fatal(err)
	}
	var units, meterOver int64
	for _, row := range rows {
		units += row.Units
		meterOver += row.MeterOverage
	}
	if units != 4 || meterOver != 0 {
		t.Fatalf("pending after the refund: %d units, %d meter overage; want 4 and 0", units, meterOver)
	}
	d := mustAdmit(t, r, req) // as the second was: 8 units, 3 of overage, under the cap again
	if !d.Allowed || limitOf(t, d, "search.monthly").Remaining != 0 || limitOf(t, d, "search.daily").Remaining != 92 {
		t.Fatalf("after the refund: %s, want admitted as the second was", fmtDecision(d))
	}
}

// TestMeterQuotaSettle: settling changes the meter's counters as the
// tier's: a charge past the meter's billed monthly quota is the meter's
// overage (and not the tier's, though past the tier's quota too); a
// settlement down gives the meter's overage back first.
func TestMeterQuotaSettle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	qs := []quota.MeterQuota{{Meter: "llm", MonthlyQuota: i64(10), Overage: quota.OverageBill, OveragePriceCentsPer1K: 500}}
	req := quota.Request{TenantID: tenant, Meter: "llm", Cost: 5, MeterQuotas: qs,
		Limits: quota.Limits{MonthlyQuota: i64(12)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 10}
	pending := func() (units, over, meterOver int64) {
		t.Helper()
		rows, err := r.Pending(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range rows {
			units, over, meterOver = units+row.Units, over+row.Overage, meterOver+row.MeterOverage
		}
		return
	}
	d := mustAdmit(t, r, req)
	if err := r.Reserve(ctx, "s-1", req, d); err != nil {
		t.Fatal(err)
	}
	// 5 admitted, settled to 20: 15 more; the meter's quota (10) is passed
	// by 10, the tier's (12) by 8: 10 units of the meter's overage, none
	// of the tier's
	if s, err := r.Settle(ctx, tenant, "s-1", 20); err != nil || s.Status != quota.SettleApplied {
		t.Fatalf("settle up: %+v %v", s, err)
	}
	if u, o, m := pending(); u != 20 || o != 0 || m != 10 {
		t.Fatalf("after settling up: pending %d units, %d overage, %d meter overage; want 20, 0, 10", u, o, m)
	}
	d = mustAdmit(t, r, req) // 25 of 10: 5 more of the meter's overage
	if l := limitOf(t, d, "llm.monthly"); !d.Allowed || l.Remaining != 0 {
		t.Fatalf("after the charge: %s", fmtDecision(d))
	}
	if err := r.Reserve(ctx, "s-2", req, d); err != nil {
		t.Fatal(err)
	}
	if s, err := r.Settle(ctx, tenant, "s-2", 1); err != nil || s.Status != quota.SettleApplied {
		t.Fatalf("settle down: %+v %v", s, err)
	}
	if u, o, m := pending(); u != 21 || o != 0 || m != 11 {
		t.Fatalf("after settling down: pending %d units, %d overage, %d meter overage; want 21, 0, 11", u, o, m)
	}
	if s, err := r.Settle(ctx, tenant, "s-2", 5); err != nil || s.Status != quota.SettleAlready {
		t.Fatalf("a second settle: %+v %v, want already settled", s, err)
	}
	if u, _, m := pending(); u != 21 || m != 11 {
		t.Fatalf("a second settle changed the pending usage: %d units, %d meter overage", u, m)
	}
}

// TestPeekSpendCap: the spend cap's room in cents counts the tier's and the
// meters' overage of the month, rounded down, and resets at the month's end.
func TestPeekSpendCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	now := at(t, "2031-03-10T08:00:00Z")
	qs := []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 300}}
	req := func(meter string, cost int64) quota.Request {
		return quota.Request{TenantID: tenant, Meter: meter, Cost: cost, Now: now, MeterQuotas: qs,
			Limits: quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(25)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
	}
	peek := func() quota.LimitState {
		t.Helper()
		l, ok, err := r.PeekSpendCap(ctx, req("demo", 1), now)
		if err != nil || !ok {
			t.Fatalf("peek: %v %v", ok, err)
		}
		return l
	}
	if l := peek(); l.Limit != 25 || l.Remaining != 25 || !l.Reset.Equal(at(t, "2031-04-01T00:00:00Z")) || l.Name != quota.LimitSpendCap {
		t.Fatalf("fresh: %+v", l)
	}
	mustAdmit(t, r, req("demo", 12))  // 2 units of the tier's overage: 2 cents
	mustAdmit(t, r, req("search", 7)) // 7 of the meter's at 0.3: 2.1 cents
	if l := peek(); l.Remaining != 20 {
		t.Fatalf("after 4.1 cents of overage: %d cents left, want 20 (20.9 rounded down)", l.Remaining)
	}
	if _, ok, err := r.PeekSpendCap(ctx, quota.Request{TenantID: tenant, Limits: quota.Limits{MaxOverageCents: i64(25)}}, now); err != nil || ok {
		t.Fatalf("a tier that bills nothing: %v %v, want no spend cap", ok, err)
	}
}
