package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The money of the scripts: what the spend cap bounds, and what refunds,
// settlements and quota resets move. Each test states the money the
// tenant is billed (the pending usage the ledger will hold) and what Redis
// holds against the limits, which must agree.

// capLeft is the spend cap's room of req's tenant at now, in cents.
func capLeft(tb testing.TB, r *stack, req quota.Request, now time.Time) int64 {
	tb.Helper()
	l, ok, err := r.PeekSpendCap(context.Background(), req, now)
	if err != nil || !ok {
		tb.Fatalf("PeekSpendCap: %v %v", ok, err)
	}
	return l.Remaining
}

// besideTheCap are the meter quotas a spend cap binds beside: none, demo's
// own that do not bill, another meter's, blocked or billed.
var besideTheCap = map[string][]quota.MeterQuota{
	"none":                         nil,
	"demo's own, daily, blocked":   {{Meter: "demo", DailyQuota: i64(1000), Overage: quota.OverageBlock}},
	"demo's own, monthly, blocked": {{Meter: "demo", MonthlyQuota: i64(1000), Overage: quota.OverageBlock}},
	"another meter's, blocked":     {{Meter: "search", MonthlyQuota: i64(5), Overage: quota.OverageBlock}},
	"another meter's, billed":      {{Meter: "search", MonthlyQuota: i64(5), Overage: quota.OverageBill, OveragePriceCentsPer1K: 300}},
}

// TestSpendCapBindsBesideEveryMeterQuota: a bill tier of 10 units a month,
// a cent a unit past them, capped at 5 cents, admits 15 units of "demo"
// and then refuses naming spend_cap (until the month's end; for good a
// request whose cost alone passes quota + cap), whatever meter quotas the
// tier has: none, demo's own that do not bill (daily or monthly, blocked),
// or another meter's, blocked or billed. Every unit billed as overage
// counts against the cap, whichever limit made it overage.
func TestSpendCapBindsBesideEveryMeterQuota(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	now := at(t, "2031-05-15T12:00:00Z")
	monthEnd := at(t, "2031-06-01T00:00:00Z")
	for name, qs := range besideTheCap {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tenant := newTenant()
			req := func(cost int64) quota.Request {
				return quota.Request{TenantID: tenant, Meter: "demo", Cost: cost, Now: now, MeterQuotas: qs,
					Limits:  quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(5)},
					Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
			}
			var admitted, over int64
			for range 40 {
				d := mustAdmit(t, r, req(1))
				if !d.Allowed {
					if !slices.Equal(d.Violated, []quota.LimitName{quota.LimitSpendCap}) || d.RetryAfter != monthEnd.Sub(now) {
						t.Fatalf("refusal after %d: %s, want [spend_cap] until the month's end", admitted, fmtDecision(d))
					}
					break
				}
				admitted, over = admitted+1, over+d.OverageUnits
			}
			if admitted != 15 || over != 5 {
				t.Fatalf("admitted %d units, %d of them overage; want 15 and 5 (a cap of 5 cents at a cent a unit)", admitted, over)
			}
			if got := sumPending(t, r, tenant); got["u"] != 15 || got["o"] != 5 {
				t.Fatalf("pending %v, want 15 units, 5 of overage", got)
			}
			fresh := newTenant()
			big := req(16) // past quota + cap even in a fresh month
			big.TenantID = fresh
			if d := mustAdmit(t, r, big); d.Allowed || !slices.Equal(d.Violated, []quota.LimitName{quota.LimitSpendCap}) || d.RetryAfter >= 0 {
				t.Fatalf("cost 16 past a quota of 10 and a cap of 5: %s, want [spend_cap] for good", fmtDecision(d))
			}
		})
	}
}

// TestRefundGivesBackTheMeterOverageItTook: "search" bills past 10 units
// a month (a cent a unit; the tier's own quota is far off, its cap a
// dollar). A (10 units, hour H-1) fits the meter's quota; B (10 units,
// hour H) is all the meter's overage. Refunding A gives back A's units
// and no overage: B's 10 units stay the month's meter overage in Redis,
// in hour H's pending usage, in the spend cap's total and (prepaid) in
// the credit drawn, and hour H-1 loses A's units only. Refunding B then
// gives back its 10 overage units, from hour H. What the ledger bills
// equals what Redis holds at every step.
func TestRefundGivesBackTheMeterOverageItTook(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	hA, hB := at(t, "2031-03-10T10:30:00Z"), at(t, "2031-03-10T11:30:00Z")
	for _, prepaid := range []bool{false, true} {
		t.Run(fmt.Sprintf("prepaid=%t", prepaid), func(t *testing.T) {
			t.Parallel()
			tenant := newTenant()
			req := func(now time.Time) quota.Request {
				q := quota.Request{TenantID: tenant, Meter: "search", Cost: 10, Now: now,
					MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(10), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}},
					Limits:      quota.Limits{MonthlyQuota: i64(1000), MaxOverageCents: i64(100)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
				if prepaid {
					q.Prepaid = &quota.Prepaid{BalanceMillicents: 1_000_000, PeriodID: 203103}
				}
				return q
			}
			a, b := req(hA), req(hB)
			da, db := mustAdmit(t, r, a), mustAdmit(t, r, b)
			if !da.Allowed || !db.Allowed {
				t.Fatalf("admissions: %s / %s", fmtDecision(da), fmtDecision(db))
			}
			check := func(when string, mu, mo, pendA, pendB, capCents int64) {
				t.Helper()
				f := meterCounters(t, r, tenant, "search")
				if f[3] != mu || f[4] != mo {
					t.Errorf("%s: Redis holds search's month at %d units, %d overage; want %d and %d", when, f[3], f[4], mu, mo)
				}
				if got := pendingAt(t, r, tenant, hA, "search", "m"); got != pendA {
					t.Errorf("%s: hour H-1 pending meter overage %d, want %d", when, got, pendA)
				}
				if got := pendingAt(t, r, tenant, hB, "search", "m"); got != pendB {
					t.Errorf("%s: hour H pending meter overage %d, want %d", when, got, pendB)
				}
				if pendA+pendB != mo {
					t.Fatalf("the test's own numbers: billed %d, Redis %d", pendA+pendB, mo)
				}
				if got := capLeft(t, r, b, hB); got != capCents {
					t.Errorf("%s: spend cap room %d cents, want %d", when, got, capCents)
				}
				if prepaid {
					drawn, err := r.PrepaidDrawn(ctx, tenant, *b.Prepaid)
					if err != nil {
						t.Fatal(err)
					}
					if drawn != mo*1000 {
						t.Errorf("%s: %d millicents of credit drawn, want %d (the meter overage billed)", when, drawn, mo*1000)
					}
				}
			}
			check("before the refunds", 20, 10, 0, 10, 90)
			if err := r.RefundRequest(ctx, a, da); err != nil {
				t.Fatal(err)
			}
			check("A refunded", 10, 10, 0, 10, 90)
			if got := pendingAt(t, r, tenant, hA, "search", "u"); got != 0 {
				t.Errorf("A refunded: hour H-1 pending units %d, want 0", got)
			}
			if err := r.RefundRequest(ctx, b, db); err != nil {
				t.Fatal(err)
			}
			check("A and B refunded", 0, 0, 0, 0, 100)
		})
	}
}

// TestSettleDownGivesBackTheRequestsOwnOverage: a request that took both
// the tier's overage and the meter's (cost 10 after 10 units of another
// meter: the tier's quota of 12 is passed by 8, the meter's quota of 5 by
// 5, which are the meter's only: 3 units of the tier's overage, 5 of the
// meter's, its last 5 units) settled down to 5 gives
// back its last 5 units, the meter's overage: the tier's 3 stay. Settled
// to 0 it gives back all 8, never more than it took.
func TestSettleDownGivesBackTheRequestsOwnOverage(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	now := at(t, "2031-03-10T10:30:00Z")
	for _, tc := range []struct {
		actual             int64
		tierOver, meterOvr int64
	}{{5, 3, 0}, {0, 0, 0}, {7, 3, 2}, {2, 0, 0}} {
		t.Run(strconv.FormatInt(tc.actual, 10), func(t *testing.T) {
			t.Parallel()
			tenant := newTenant()
			qs := []quota.MeterQuota{{Meter: "llm", MonthlyQuota: i64(5), Overage: quota.OverageBill, OveragePriceCentsPer1K: 500}}
			fill := quota.Request{TenantID: tenant, Meter: "demo", Cost: 10, Now: now, MeterQuotas: qs,
				Limits: quota.Limits{MonthlyQuota: i64(12)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 10}
			mustAdmit(t, r, fill) // 10 of the tier's 12
			req := fill
			req.Meter, req.Cost = "llm", 10
			d := mustAdmit(t, r, req)
			if !d.Allowed || d.OverageUnits != 3 {
				t.Fatalf("admission: %s, want 3 units of the tier's overage", fmtDecision(d))
			}
			if got := pendingAt(t, r, tenant, now, "llm", "m"); got != 5 {
				t.Fatalf("meter overage admitted %d, want 5", got)
			}
			if err := r.Reserve(ctx, "s-"+tenant, req, d); err != nil {
				t.Fatal(err)
			}
			s, err := r.Settle(ctx, tenant, "s-"+tenant, tc.actual)
			if err != nil || s.Status != quota.SettleApplied || s.OverageDelta != tc.tierOver-3 {
				t.Fatalf("settle: %+v %v, want applied with overage delta %d", s, err, tc.tierOver-3)
			}
			to, mo := pendingAt(t, r, tenant, now, "llm", "o"), pendingAt(t, r, tenant, now, "llm", "m")
			if to != tc.tierOver || mo != tc.meterOvr {
				t.Errorf("after settling to %d: pending overage %d of the tier's, %d of the meter's; want %d and %d",
					tc.actual, to, mo, tc.tierOver, tc.meterOvr)
			}
			if f := meterCounters(t, r, tenant, "llm"); f[3] != tc.actual || f[4] != tc.meterOvr {
				t.Errorf("Redis: llm's month %d units, %d overage; want %d and %d", f[3], f[4], tc.actual, tc.meterOvr)
			}
			if st := stateOf(t, c, r, tenant); st.Month.Used != 10+tc.actual || st.Month.Overage != tc.tierOver {
				t.Errorf("Redis: the month %d units, %d overage; want %d and %d", st.Month.Used, st.Month.Overage, 10+tc.actual, tc.tierOver)
			}
		})
	}
}

// TestSettleAfterTheMonthRolledRatesTheAdmissionsMonth: a quota of 10
// units a month, billed at a cent a unit past it. Requests of March 31
// settled after April began (an April admission rolled the state) rate
// the overage of March: A (10 units at 23:55) settled to 30 bills 20
// units of overage in March's hour; two requests of March (5 units each)
// settled to 15 each after the roll bill 20 in either order, as they do
// settled before it. April's counters are not touched.
func TestSettleAfterTheMonthRolledRatesTheAdmissionsMonth(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	ctx := context.Background()
	march, april := at(t, "2031-03-31T23:55:00Z"), at(t, "2031-04-01T00:01:00Z")
	r, _ := mustRunner(t, c)
	req := func(tenant string, cost int64, now time.Time) quota.Request {
		return quota.Request{TenantID: tenant, Meter: "gen", Cost: cost, Now: now,
			Limits: quota.Limits{MonthlyQuota: i64(10)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
	}
	reserve := func(req quota.Request, id string) {
		t.Helper()
		d := mustAdmit(t, r, req)
		if !d.Allowed {
			t.Fatalf("admission: %s", fmtDecision(d))
		}
		if err := r.Reserve(ctx, id, req, d); err != nil {
			t.Fatal(err)
		}
	}
	settle := func(tenant, id string, actual, overage int64) {
		t.Helper()
		s, err := r.Settle(ctx, tenant, id, actual)
		if err != nil || s.Status != quota.SettleApplied || s.OverageDelta != overage {
			t.Fatalf("settle %s to %d: %+v %v, want applied with %d units of overage", id, actual, s, err, overage)
		}
	}
	roll := func(tenant string) {
		t.Helper()
		if d := mustAdmit(t, r, req(tenant, 1, april)); !d.Allowed || d.OverageUnits != 0 {
			t.Fatalf("April's first admission: %s", fmtDecision(d))
		}
	}

	// one request, settled up after the roll
	tenant := newTenant()
	reserve(req(tenant, 10, march), "a-"+tenant)
	roll(tenant)
	settle(tenant, "a-"+tenant, 30, 20)
	if u, o := pendingAt(t, r, tenant, march, "gen", "u"), pendingAt(t, r, tenant, march, "gen", "o"); u != 30 || o != 20 {
		t.Errorf("March's pending usage: %d units, %d of overage; want 30 and 20", u, o)
	}
	if d := mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "gen", Cost: 1, Now: april, DryRun: true,
		Limits: quota.Limits{MonthlyQuota: i64(10)}, Overage: quota.OverageBill}); limitOf(t, d, "monthly").Remaining != 8 {
		t.Errorf("April's quota after a settlement of March: %s, want 8 left after a dry run of 1 (April's 1 unit only)", fmtDecision(d))
	}

	// two requests, settled in either order after the roll, or before it
	for _, order := range []string{"ab", "ba", "before"} {
		tenant := newTenant()
		reserve(req(tenant, 5, march.Add(-time.Minute)), "a-"+tenant)
		reserve(req(tenant, 5, march), "b-"+tenant)
		if order != "before" {
			roll(tenant)
		}
		first, second := "a-", "b-"
		if order == "ba" {
			first, second = second, first
		}
		settle(tenant, first+tenant, 15, 10)
		settle(tenant, second+tenant, 15, 10)
		// (both in March's last hour)
		if o := pendingAt(t, r, tenant, march, "gen", "o"); o != 20 {
			t.Errorf("%s: March's overage %d, want 20", order, o)
		}
	}
}

// TestSettleUpBillsOverageWithinTheSpendCap: a bill tier of 10 units a
// month at a cent a unit, capped at 15 cents. A charge of a settlement
// counts as usage whole, but the overage it bills is bounded by the cap's
// room in the admission's month; the rest is usage not billed as
// overage. Within the month: 5 cents of overage admitted, a request of 10
// settled to 30 bills 10 units of overage (not 20). Across the roll: the
// same, March's room, whatever April spent. With a meter quota billed too,
// the room counts both, in millicents: the tier's units first, then the
// meter's, in the order the units were charged.
func TestSettleUpBillsOverageWithinTheSpendCap(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	march, april := at(t, "2031-03-31T23:50:00Z"), at(t, "2031-04-01T00:01:00Z")
	for _, tc := range []struct {
		name          string
		roll          bool
		meter         bool
		tierO, meterO int64 // billed by the settlement
	}{
		{"within the month", false, false, 10, 0},
		{"after the roll", true, false, 10, 0},
		// the meter "gen" bills past 12 at 2 cents a unit: of the 20
		// charged units, 2 are the tier's (a cent each) then 18 the
		// meter's; 10 cents of room: the tier's 2 and 4 of the meter's
		{"with a meter quota", false, true, 2, 4},
		{"with a meter quota, after the roll", true, true, 2, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tenant := newTenant()
			req := func(meter string, cost int64, now time.Time) quota.Request {
				q := quota.Request{TenantID: tenant, Meter: meter, Cost: cost, Now: now,
					Limits:  quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(15)},
					Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
				if tc.meter {
					q.MeterQuotas = []quota.MeterQuota{{Meter: "gen", MonthlyQuota: i64(12), Overage: quota.OverageBill, OveragePriceCentsPer1K: 2000}}
				}
				return q
			}
			a := req("gen", 10, march)
			da := mustAdmit(t, r, a)
			if err := r.Reserve(ctx, "a-"+tenant, a, da); err != nil {
				t.Fatal(err)
			}
			if d := mustAdmit(t, r, req("demo", 5, march)); !d.Allowed || d.OverageUnits != 5 {
				t.Fatalf("5 units past the quota: %s", fmtDecision(d))
			}
			if tc.roll {
				// April spends its own room: March's is what bounds
				for range 25 {
					mustAdmit(t, r, req("demo", 1, april))
				}
			}
			s, err := r.Settle(ctx, tenant, "a-"+tenant, 30)
			if err != nil || s.Status != quota.SettleApplied || s.Delta != 20 || s.OverageDelta != tc.tierO {
				t.Fatalf("settle: %+v %v, want 20 units charged, %d of the tier's overage", s, err, tc.tierO)
			}
			if u := pendingAt(t, r, tenant, march, "gen", "u"); u != 30 {
				t.Errorf("pending units of the settled request %d, want 30 (all counted)", u)
			}
			if o, m := pendingAt(t, r, tenant, march, "gen", "o"), pendingAt(t, r, tenant, march, "gen", "m"); o != tc.tierO || m != tc.meterO {
				t.Errorf("billed overage: %d of the tier's, %d of the meter's; want %d and %d", o, m, tc.tierO, tc.meterO)
			}
			var cost int64 // the month's overage in millicents
			for f, n := range pendingFields(t, r, tenant) {
				if strings.HasPrefix(f, strconv.FormatInt(march.Truncate(time.Hour).Unix(), 10)+"|") {
					switch f[len(f)-1] {
					case 'o':
						cost += n * 1000
					case 'm':
						cost += n * 2000
					}
				}
			}
			if cost > 15_000 {
				t.Errorf("March bills %d millicents of overage, past its cap of 15 cents", cost)
			}
			if !tc.roll {
				if d := mustAdmit(t, r, req("demo", 1, march)); d.Allowed || !slices.Equal(d.Violated, []quota.LimitName{quota.LimitSpendCap}) {
					t.Errorf("after the settlement filled the cap: %s, want spend_cap", fmtDecision(d))
				}
			}
		})
	}
}

// TestResetKeepsTheMonthsOverageAndCap: a quota reset (a tier change with
// quota "reset") empties the used units but not the overage already
// billed, nor the spend cap's total: a month never bills more overage
// than its cap. The tier bills past 10 units at a cent a unit, "search"
// past 0 at a cent, the cap is 5 cents: 10 units and 5 of overage; after
// the reset 10 more units fit the quota, and the next is refused
// (spend_cap), for the tier's overage and the meter's alike.
func TestResetKeepsTheMonthsOverageAndCap(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	for _, meter := range []string{"demo", "search"} {
		t.Run(meter, func(t *testing.T) {
			t.Parallel()
			tenant := newTenant()
			now, err := c.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			req := func(m string) quota.Request {
				return quota.Request{TenantID: tenant, Meter: m, Cost: 1,
					MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}},
					Limits:      quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(5)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
			}
			until := func() (n int64) {
				t.Helper()
				for range 40 {
					m := meter
					if n < 10 {
						m = "demo" // the tier's quota first
					}
					d := mustAdmit(t, r, req(m))
					if !d.Allowed {
						if !slices.Equal(d.Violated, []quota.LimitName{quota.LimitSpendCap}) {
							t.Fatalf("refusal: %s, want spend_cap", fmtDecision(d))
						}
						return n
					}
					n++
				}
				return n
			}
			if n := until(); n != 15 {
				t.Fatalf("before the reset: %d admitted, want 15", n)
			}
			if applied, err := r.ResetQuotas(ctx, tenant, now); err != nil || !applied {
				t.Fatalf("reset: %v %v", applied, err)
			}
			if n := until(); n != 10 {
				t.Errorf("after the reset: %d admitted, want 10 (the quota again, and no overage: the cap is spent)", n)
			}
			if got := capLeft(t, r, req(meter), time.Time{}); got != 0 {
				t.Errorf("spend cap room after the reset: %d cents, want 0", got)
			}
			got := sumPending(t, r, tenant)
			if got["u"] != 25 || got["o"]+got["m"] != 5 {
				t.Errorf("pending %v, want 25 units, 5 of overage", got)
			}
			if st := stateOf(t, c, r, tenant); meter == "demo" && st.Month.Overage != 5 {
				t.Errorf("the month's overage in Redis %d, want 5", st.Month.Overage)
			}
		})
	}
}

// TestAdjustingLastMonthLeavesThisMonthAlone: a refund or settlement of a
// request of March, arriving in April, changes March's numbers only. A
// "search" request takes 3 cents of meter overage at 23:59 on March 31;
// an "llm" request 5 cents at 00:01 on April 1 (cap 10 cents). Refunding
// (or settling down, or up) the March request leaves April's spend-cap
// room at 5 cents: April's next 6 cents are refused, 5 admitted.
func TestAdjustingLastMonthLeavesThisMonthAlone(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	march, april := at(t, "2031-03-31T23:59:00Z"), at(t, "2031-04-01T00:01:00Z")
	for _, how := range []string{"refund", "settle down", "settle up"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			tenant := newTenant()
			qs := []quota.MeterQuota{
				{Meter: "search", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000},
				{Meter: "llm", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000},
			}
			req := func(meter string, cost int64, now time.Time) quota.Request {
				return quota.Request{TenantID: tenant, Meter: meter, Cost: cost, Now: now, MeterQuotas: qs,
					Limits:  quota.Limits{MonthlyQuota: i64(1000), MaxOverageCents: i64(10)},
					Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
			}
			s := req("search", 3, march)
			ds := mustAdmit(t, r, s)
			if err := r.Reserve(ctx, "s-"+tenant, s, ds); err != nil {
				t.Fatal(err)
			}
			if d := mustAdmit(t, r, req("llm", 5, april)); !d.Allowed {
				t.Fatalf("April's llm: %s", fmtDecision(d))
			}
			if got := capLeft(t, r, s, april); got != 5 {
				t.Fatalf("April's room before: %d cents, want 5", got)
			}
			var err error
			switch how {
			case "refund":
				err = r.RefundRequest(ctx, s, ds)
			case "settle down":
				_, err = r.Settle(ctx, tenant, "s-"+tenant, 1)
			case "settle up":
				_, err = r.Settle(ctx, tenant, "s-"+tenant, 6)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := capLeft(t, r, s, april); got != 5 {
				t.Errorf("April's room after a %s of March's request: %d cents, want 5", how, got)
			}
			if d := mustAdmit(t, r, req("llm", 6, april)); d.Allowed {
				t.Errorf("6 cents more in April with 5 left: %s, want spend_cap", fmtDecision(d))
			}
			if d := mustAdmit(t, r, req("llm", 5, april)); !d.Allowed {
				t.Errorf("5 cents more in April with 5 left: %s, want admitted", fmtDecision(d))
			}
			if f := meterCounters(t, r, tenant, "llm"); f[2] != 203104 || f[3] != 10 || f[4] != 10 {
				t.Errorf("llm's counters %v, want April's 10 units, 10 of overage", f)
			}
		})
	}
}

// TestRefundAndSettleAfterTheTenantsPeriodRolled: the same in a tenant's
// own calendar (anchor day 15, New York): its billing period ends at
// 04:00 UTC on March 15. A (search, 10) at 03:55 fits the meter's quota
// of 10; B (search, 5) at 03:58 is the meter's overage; the next period's
// first search (04:01) rolls the counters. Refunding B and settling A to
// 30 after it move the old period's numbers: its hour bills 30 units and
// 20 of the meter's overage, and the new period holds its own unit only.
func TestRefundAndSettleAfterTheTenantsPeriodRolled(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	cal := mustCalendar(t, "America/New_York", 15)
	tenant := newTenant()
	req := func(cost int64, at0 string) quota.Request {
		return quota.Request{TenantID: tenant, Meter: "search", Cost: cost, Now: at(t, at0), Calendar: cal,
			MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(10), Overage: quota.OverageBill, OveragePriceCentsPer1K: 2000}},
			Limits:      quota.Limits{MonthlyQuota: i64(10)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
	}
	a, b := req(10, "2031-03-15T03:55:00Z"), req(5, "2031-03-15T03:58:00Z")
	da, db := mustAdmit(t, r, a), mustAdmit(t, r, b)
	if db.MeterOverageUnits != 5 || db.OverageUnits != 0 {
		t.Fatalf("B: %s, meter overage %d; want 5 of the meter's overage only", fmtDecision(db), db.MeterOverageUnits)
	}
	if err := r.Reserve(ctx, "a-"+tenant, a, da); err != nil {
		t.Fatal(err)
	}
	if d := mustAdmit(t, r, req(1, "2031-03-15T04:01:00Z")); !d.Allowed || limitOf(t, d, "search.monthly").Remaining != 9 {
		t.Fatalf("the new period's first search: %s", fmtDecision(d))
	}
	if err := r.RefundRequest(ctx, b, db); err != nil {
		t.Fatal(err)
	}
	if s, err := r.Settle(ctx, tenant, "a-"+tenant, 30); err != nil || s.Status != quota.SettleApplied {
		t.Fatalf("settle: %+v %v", s, err)
	}
	old := at(t, "2031-03-15T03:00:00Z")
	if u, m, o := pendingAt(t, r, tenant, old, "search", "u"), pendingAt(t, r, tenant, old, "search", "m"),
		pendingAt(t, r, tenant, old, "search", "o"); u != 30 || m != 20 || o != 0 {
		t.Errorf("the old period's hour: %d units, %d of the meter's overage, %d of the tier's; want 30, 20, 0", u, m, o)
	}
	if f := meterCounters(t, r, tenant, "search"); f[2] != 203103 || f[3] != 1 || f[4] != 0 {
		t.Errorf("the new period's search counters %v, want its 1 unit", f)
	}
	if w, err := r.Client().HGet(ctx, r.Key(tenant, "mq"), "search|w").Result(); err != nil || w != "203102,30,20" {
		t.Errorf("the old period's search counters %q (%v), want 30 units, 20 of overage", w, err)
	}
	if d := mustAdmit(t, r, req(1, "2031-03-15T04:02:00Z")); limitOf(t, d, "monthly").Remaining != 8 {
		t.Errorf("the new period's quota: %s, want 8 left", fmtDecision(d))
	}
	// the tier's old period: 15 units, less B's 5, plus A's 20
	if w, err := r.Client().HGet(ctx, r.StateKeys(tenant)[0], "w").Result(); err != nil || w != "203102,30,0,0" {
		t.Errorf("the tier's old period %q (%v), want 30 units, none of the tier's overage (the meter's only)", w, err)
	}
}

// TestRefundAcrossADayLeavesTodayAlone: a request of yesterday refunded
// today gives its units back to the month only: today's daily quotas (the
// tier's and the meter's) keep today's usage.
func TestRefundAcrossADayLeavesTodayAlone(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	tenant := newTenant()
	req := func(at0 string) quota.Request {
		return quota.Request{TenantID: tenant, Meter: "search", Cost: 5, Now: at(t, at0),
			MeterQuotas: []quota.MeterQuota{{Meter: "search", DailyQuota: i64(10), MonthlyQuota: i64(100), Overage: quota.OverageBlock}},
			Limits:      quota.Limits{DailyQuota: i64(10), MonthlyQuota: i64(100)}}
	}
	a := req("2031-03-10T23:30:00Z")
	da := mustAdmit(t, r, a)
	mustAdmit(t, r, req("2031-03-11T00:30:00Z"))
	if err := r.RefundRequest(ctx, a, da); err != nil {
		t.Fatal(err)
	}
	d := mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "search", Cost: 1, Now: at(t, "2031-03-11T00:40:00Z"), DryRun: true,
		MeterQuotas: a.MeterQuotas, Limits: a.Limits})
	for name, want := range map[quota.LimitName]int64{"daily": 4, "monthly": 94, "search.daily": 4, "search.monthly": 94} {
		if l := limitOf(t, d, name); l.Remaining != want {
			t.Errorf("%s: %d left, want %d", name, l.Remaining, want)
		}
	}
	if u := pendingAt(t, r, tenant, a.Now, "search", "u"); u != 0 {
		t.Errorf("yesterday's hour: %d units pending, want 0", u)
	}
}

// TestPrepaidSettlementAfterTheRollDrawsOnItsPeriod: a prepaid tenant
// (10 units a month included, then a cent a unit from its credit) whose
// March drew nothing: A (10 units, March 31 23:55) settled to 30 after
// April drew its first cent bills 20 units of March's overage and draws
// them on March's count, beside April's, where the balance check sees
// them; before, the draw had no place and was lost to the balance.
func TestPrepaidSettlementAfterTheRollDrawsOnItsPeriod(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	tenant := newTenant()
	req := func(cost int64, at0 string, period, prev int) quota.Request {
		return quota.Request{TenantID: tenant, Meter: "gen", Cost: cost, Now: at(t, at0),
			Limits: quota.Limits{MonthlyQuota: i64(10)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
			Prepaid: &quota.Prepaid{BalanceMillicents: 1_000_000, PeriodID: period, PrevID: prev}}
	}
	a := req(10, "2031-03-31T23:55:00Z", 203103, 0)
	if err := r.Reserve(ctx, "a-"+tenant, a, mustAdmit(t, r, a)); err != nil {
		t.Fatal(err)
	}
	if d := mustAdmit(t, r, req(11, "2031-04-01T00:01:00Z", 203104, 203103)); !d.Allowed || d.OverageUnits != 1 {
		t.Fatalf("April: %s", fmtDecision(d))
	}
	if s, err := r.Settle(ctx, tenant, "a-"+tenant, 30); err != nil || s.OverageDelta != 20 {
		t.Fatalf("settle: %+v %v, want 20 units of March's overage", s, err)
	}
	if p, err := r.Client().HGet(ctx, r.Key(tenant, "mq"), "P").Result(); err != nil || p != "203104,1000,203103,20000" {
		t.Errorf("credit draws %q (%v), want April's 1,000 and March's 20,000 millicents", p, err)
	}
}

// TestSettleReadsEntriesOfOlderNodes: a settle entry written by a node
// before this version (a rolling upgrade: the meter's quota without the
// overage it took or the spend cap) settles as those nodes settled it: up,
// the charge past the meter's billed quota is its overage; down, the
// meter's month gives back its overage first.
func TestSettleReadsEntriesOfOlderNodes(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	tenant := newTenant()
	now := at(t, "2031-03-10T10:30:00Z")
	req := quota.Request{TenantID: tenant, Meter: "llm", Cost: 5, Now: now,
		MeterQuotas: []quota.MeterQuota{{Meter: "llm", MonthlyQuota: i64(10), Overage: quota.OverageBill, OveragePriceCentsPer1K: 500}},
		Limits:      quota.Limits{MonthlyQuota: i64(12)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 10}
	for i, tc := range []struct {
		actual, units, meterOver int64
	}{{20, 20, 10}, {1, 21, 11}} {
		rid := fmt.Sprintf("old-%d-%s", i, tenant)
		d := mustAdmit(t, r, req)
		entry := fmt.Sprintf("5|%d|%d|203103|%d|1|12|10,500,0|llm", now.Truncate(time.Hour).Unix(), now.Unix()/86400, d.OverageUnits)
		if err := r.Client().Set(ctx, r.Key(tenant, "settle:"+rid), entry, quota.SettleWindow).Err(); err != nil {
			t.Fatal(err)
		}
		if s, err := r.Settle(ctx, tenant, rid, tc.actual); err != nil || s.Status != quota.SettleApplied {
			t.Fatalf("settle %s: %+v %v", entry, s, err)
		}
		if u, m := pendingAt(t, r, tenant, now, "llm", "u"), pendingAt(t, r, tenant, now, "llm", "m"); u != tc.units || m != tc.meterOver {
			t.Errorf("after settling %s to %d: %d units, %d of the meter's overage pending; want %d and %d", entry, tc.actual, u, m, tc.units, tc.meterOver)
		}
	}
}
