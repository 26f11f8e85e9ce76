package ratelimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/limits"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestAlgebraMoneySeeds runs the money scenarios of money_test.go (and a
// few of their neighbours) through the differential harness: every step
// on Redis and on internal/limits, every answer and the whole state
// compared after each. They are the seeds of the random schedules: each
// reaches a branch of the money (meter overage given back, grants under a
// charge, the spend total of another month) that a bug there changes.
func TestAlgebraMoneySeeds(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	for name, seed := range moneySeeds(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			seed(newTwin(t, c, r))
		})
	}
}

// last is the index of the last admission.
func (w *twin) last() int { return len(w.admitted) - 1 }

func moneySeeds(tb testing.TB) map[string]func(w *twin) {
	seeds := map[string]func(w *twin){}
	now := at(tb, "2031-05-15T12:00:00Z")
	march, april := at(tb, "2031-03-31T23:55:00Z"), at(tb, "2031-04-01T00:01:00Z")

	// TestSpendCapBindsBesideEveryMeterQuota
	for name, qs := range besideTheCap {
		seeds["spend cap beside "+name] = func(w *twin) {
			p := plan{limits: quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(5)}, overage: quota.OverageBill, price: 1000, meters: qs}
			for range 20 {
				w.admit(p.request("demo", 1, now), false)
			}
			w.admit(p.request("demo", 16, now), false)
		}
	}

	// TestRefundGivesBackTheMeterOverageItTook
	for _, prepaid := range []bool{false, true} {
		seeds[fmt.Sprintf("refund gives back the meter overage it took, prepaid=%t", prepaid)] = func(w *twin) {
			p := plan{limits: quota.Limits{MonthlyQuota: i64(1000), MaxOverageCents: i64(100)}, overage: quota.OverageBill, price: 1000,
				meters: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(10), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}}}
			if prepaid {
				p.prepaid = &quota.Prepaid{BalanceMillicents: 1_000_000}
			}
			w.admit(p.request("search", 10, at(tb, "2031-03-10T10:30:00Z")), false)
			w.admit(p.request("search", 10, at(tb, "2031-03-10T11:30:00Z")), false)
			w.refund(0)
			w.refund(1)
		}
	}

	// TestSettleDownGivesBackTheRequestsOwnOverage
	for _, actual := range []int64{5, 0, 7, 2, 25} {
		seeds[fmt.Sprintf("settle to %d gives back the request's own overage", actual)] = func(w *twin) {
			p := plan{limits: quota.Limits{MonthlyQuota: i64(12)}, overage: quota.OverageBill, price: 10,
				meters: []quota.MeterQuota{{Meter: "llm", MonthlyQuota: i64(5), Overage: quota.OverageBill, OveragePriceCentsPer1K: 500}}}
			t0 := at(tb, "2031-03-10T10:30:00Z")
			w.admit(p.request("demo", 10, t0), false)
			w.admit(p.request("llm", 10, t0), true)
			w.settle(w.last(), actual)
		}
	}

	// TestSettleAfterTheMonthRolledRatesTheAdmissionsMonth
	gen := plan{limits: quota.Limits{MonthlyQuota: i64(10)}, overage: quota.OverageBill, price: 1000}
	seeds["settle up after the month rolled"] = func(w *twin) {
		w.admit(gen.request("gen", 10, march), true)
		w.admit(gen.request("gen", 1, april), false)
		w.settle(0, 30)
		w.admit(gen.request("gen", 1, april), false)
	}
	for _, order := range []string{"ab", "ba", "before"} {
		seeds["two settled after the month rolled, "+order] = func(w *twin) {
			w.admit(gen.request("gen", 5, march.Add(-time.Minute)), true)
			w.admit(gen.request("gen", 5, march), true)
			if order != "before" {
				w.admit(gen.request("gen", 1, april), false)
			}
			first, second := 0, 1
			if order == "ba" {
				first, second = 1, 0
			}
			w.settle(first, 15)
			w.settle(second, 15)
		}
	}

	// TestSettleUpBillsOverageWithinTheSpendCap
	for _, tc := range []struct {
		name        string
		roll, meter bool
	}{{"within the month", false, false}, {"after the roll", true, false}, {"with a meter quota", false, true},
		{"with a meter quota, after the roll", true, true}} {
		seeds["settle up within the spend cap, "+tc.name] = func(w *twin) {
			p := plan{limits: quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(15)}, overage: quota.OverageBill, price: 1000}
			if tc.meter {
				p.meters = []quota.MeterQuota{{Meter: "gen", MonthlyQuota: i64(12), Overage: quota.OverageBill, OveragePriceCentsPer1K: 2000}}
			}
			t0 := at(tb, "2031-03-31T23:50:00Z")
			w.admit(p.request("gen", 10, t0), true)
			w.admit(p.request("demo", 5, t0), false)
			if tc.roll {
				for range 25 {
					w.admit(p.request("demo", 1, april), false)
				}
			}
			w.settle(0, 30)
			w.admit(p.request("demo", 1, t0), false)
		}
	}

	// TestResetKeepsTheMonthsOverageAndCap
	for _, meter := range []string{"demo", "search"} {
		seeds["reset keeps the month's overage and cap, "+meter] = func(w *twin) {
			p := plan{limits: quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(5)}, overage: quota.OverageBill, price: 1000,
				meters: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}}}
			until := func() {
				for n := range 20 {
					m := meter
					if n < 10 {
						m = "demo"
					}
					if d := w.admit(p.request(m, 1, now), false); !d.Allowed {
						return
					}
				}
			}
			until()
			w.reset(p.cal, now, false)
			w.reset(p.cal, now, true)
			until()
		}
	}

	// TestAdjustingLastMonthLeavesThisMonthAlone, and the same with this
	// month's meter spend larger than last month's: a settlement up of
	// last month's request rates its overage within last month's room
	for _, spendNow := range []int64{5, 9} {
		for _, how := range []string{"refund", "settle down", "settle up"} {
			seeds[fmt.Sprintf("adjusting last month leaves this month alone, %s, %d cents now", how, spendNow)] = func(w *twin) {
				p := plan{limits: quota.Limits{MonthlyQuota: i64(1000), MaxOverageCents: i64(10)}, overage: quota.OverageBill, price: 1000,
					meters: []quota.MeterQuota{
						{Meter: "search", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000},
						{Meter: "llm", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}}}
				t0, t1 := at(tb, "2031-03-31T23:59:00Z"), april
				w.admit(p.request("search", 3, t0), true)
				w.admit(p.request("llm", spendNow, t1), false)
				switch how {
				case "refund":
					w.refund(0)
				case "settle down":
					w.settle(0, 1)
				case "settle up":
					w.settle(0, 6)
				}
				w.admit(p.request("llm", 11-spendNow, t1), false)
				w.admit(p.request("llm", 10-spendNow, t1), false)
			}
		}
	}

	// TestRefundAndSettleAfterTheTenantsPeriodRolled
	seeds["refund and settle after the tenant's period rolled"] = func(w *twin) {
		p := plan{limits: quota.Limits{MonthlyQuota: i64(10)}, overage: quota.OverageBill, price: 1000,
			meters: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(10), Overage: quota.OverageBill, OveragePriceCentsPer1K: 2000}},
			cal:    mustCalendar(tb, "America/New_York", 15)}
		w.admit(p.request("search", 10, at(tb, "2031-03-15T03:55:00Z")), true)
		w.admit(p.request("search", 5, at(tb, "2031-03-15T03:58:00Z")), false)
		w.admit(p.request("search", 1, at(tb, "2031-03-15T04:01:00Z")), false)
		w.refund(1)
		w.settle(0, 30)
		w.admit(p.request("search", 1, at(tb, "2031-03-15T04:02:00Z")), false)
	}

	// TestRefundAcrossADayLeavesTodayAlone
	seeds["refund across a day leaves today alone"] = func(w *twin) {
		p := plan{limits: quota.Limits{DailyQuota: i64(10), MonthlyQuota: i64(100)},
			meters: []quota.MeterQuota{{Meter: "search", DailyQuota: i64(10), MonthlyQuota: i64(100), Overage: quota.OverageBlock}}}
		w.admit(p.request("search", 5, at(tb, "2031-03-10T23:30:00Z")), false)
		w.admit(p.request("search", 5, at(tb, "2031-03-11T00:30:00Z")), false)
		w.refund(0)
		req := p.request("search", 1, at(tb, "2031-03-11T00:40:00Z"))
		req.DryRun = true
		w.admit(req, false)
	}

	// TestPrepaidSettlementAfterTheRollDrawsOnItsPeriod
	seeds["prepaid settlement after the roll draws on its period"] = func(w *twin) {
		p := plan{limits: quota.Limits{MonthlyQuota: i64(10)}, overage: quota.OverageBill, price: 1000,
			prepaid: &quota.Prepaid{BalanceMillicents: 1_000_000}}
		w.admit(p.request("gen", 10, march), true)
		p.prepaid.PrevID = 1
		w.admit(p.request("gen", 11, april), false)
		w.settle(0, 30)
	}

	// a grant raises the month's quota for a settlement's charge too: a
	// request settled up within quota + grant bills no overage
	seeds["settle up within a grant"] = func(w *twin) {
		p := plan{limits: quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(100)}, overage: quota.OverageBill, price: 1000}
		t0 := at(tb, "2031-03-10T10:30:00Z")
		w.grant("month", 10, t0)
		w.admit(p.request("gen", 15, t0), true)
		w.settle(0, 18)
		w.admit(p.request("gen", 5, t0), true)
	}
	return seeds
}

// TestLuaDefects holds the scripts to internal/limits where the scripts
// of an earlier release answered otherwise than the algebra means: each
// runs on Redis and on internal/limits, and passes when they agree.
func TestLuaDefects(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	now := at(t, "2031-03-10T10:30:00Z")

	// A refund of a prepaid request whose meter has no quota gives
	// nothing back to that meter's counters, which it never counted (an
	// earlier refund.lua read the meter's field whenever the tenant was
	// prepaid). Here "a" had a quota of 20 a month under the plan before
	// (5 used); under the prepaid plan a request of 2 units of "a" is
	// refunded: "a" must keep its 5 (that refund.lua left 3: 2 units of
	// free quota).
	t.Run("refund of a prepaid request of a meter without a quota", func(t *testing.T) {
		t.Parallel()
		w := newTwin(t, c, r)
		before := plan{limits: quota.Limits{MonthlyQuota: i64(100)}, overage: quota.OverageBill, price: 1000,
			meters: []quota.MeterQuota{{Meter: "a", MonthlyQuota: i64(20), Overage: quota.OverageBlock}}}
		w.admit(before.request("a", 5, now), false)
		prepaid := plan{limits: quota.Limits{MonthlyQuota: i64(100)}, overage: quota.OverageBill, price: 1000,
			prepaid: &quota.Prepaid{BalanceMillicents: 1_000_000}}
		w.admit(prepaid.request("a", 2, now), false)
		a := w.admitted[1]
		if err := r.RefundRequest(ctx, a.req, a.d); err != nil {
			t.Fatal(err)
		}
		w.m.Refund(a.req, a.d)
		got := meterCounters(t, r, w.tenant, "a")
		if want := w.m.Meters["a"]; got != [5]int64{want.Day, want.DayUsed, want.Month, want.Used, want.Over} {
			t.Fatalf("meter a's counters %v, want %+v", got, want)
		}
		w.same("refund")
	})

	// The spend cap bounds the month's overage, the tier's and the
	// meters' together, whatever plan billed it. The plan before billed 8
	// cents of meter overage in the month (cap 10 cents); the plan after
	// has the same cap and no meter quota: 3 cents more of the tier's
	// overage would make 11. (admit.lua checked such a plan's cap in units
	// of the tier's overage only, and admitted.)
	t.Run("spend cap after a plan change within the month", func(t *testing.T) {
		t.Parallel()
		w := newTwin(t, c, r)
		before := plan{limits: quota.Limits{MonthlyQuota: i64(0), MaxOverageCents: i64(10)}, overage: quota.OverageBill, price: 1000,
			meters: []quota.MeterQuota{{Meter: "s", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}}}
		if d := w.admit(before.request("s", 8, now), false); !d.Allowed || d.MeterOverageUnits != 8 {
			t.Fatalf("the plan before: %s", fmtDecision(d))
		}
		after := plan{limits: quota.Limits{MonthlyQuota: i64(0), MaxOverageCents: i64(10)}, overage: quota.OverageBill, price: 1000}
		req := after.request("demo", 3, now)
		req.TenantID = w.tenant
		got := mustAdmit(t, r, req)
		want := w.m.Admit(req, now)
		if want.Allowed {
			t.Fatalf("reference: %s, want refused by the spend cap", fmtDecision(want))
		}
		if fmtDecision(got) != fmtDecision(want) {
			t.Fatalf("got %s\nwant %s", fmtDecision(got), fmtDecision(want))
		}
	})
}

// TestAlgebraGrantIDs holds recorded grants (ApplyGrant: applied once, in
// their period only, at Redis time) to internal/limits, with admissions
// at Redis time between them, the reference deciding at each decision's
// time, in the default calendar and in New York's: the state, marks
// included, compared after every step.
func TestAlgebraGrantIDs(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	for _, cal := range []quota.Calendar{{}, mustCalendar(t, "America/New_York", 15)} {
		t.Run(fmt.Sprint(cal.Zone), func(t *testing.T) {
			t.Parallel()
			w := newTwin(t, c, r)
			p := plan{limits: quota.Limits{DailyQuota: i64(20), MonthlyQuota: i64(10)}, overage: quota.OverageBill, price: 1000, cal: cal}
			admit := func(cost int64) {
				t.Helper()
				req := p.request("a", cost, time.Time{})
				req.TenantID = w.tenant
				got := mustAdmit(t, r, req)
				want := w.m.Admit(req, got.Now)
				if fmtDecision(got) != fmtDecision(want) {
					t.Fatalf("admit %d:\n got  %s\n want %s", cost, fmtDecision(got), fmtDecision(want))
				}
				w.same(fmt.Sprintf("admit %d", cost))
			}
			grant := func(id, period string, start time.Time, units int64, want bool) {
				t.Helper()
				now, err := c.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				got, err := r.ApplyGrant(ctx, w.tenant, cal, id, period, start, units)
				if err != nil || got != want {
					t.Fatalf("ApplyGrant(%s %s %s): %t %v, want %t", id, period, start, got, err, want)
				}
				start = start.UTC()
				pid := start.Unix() / 86400
				if period == "month" {
					pid = int64(start.Year())*100 + int64(start.Month())
				}
				if n := limits.Grant(&w.m.State, cal, now.UnixMicro(), period == "month", units, id, pid); (n >= 0) != want {
					t.Fatalf("the reference's grant %s: %d, want %t", id, n, want)
				}
				w.same("grant " + id)
			}
			now, err := c.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			// a period's id names its first date, as a recorded grant's
			// period_start holds it
			dayStart, _ := cal.Day(now)
			monthStart, _ := cal.Period(now)
			local := func(t time.Time) time.Time {
				if cal.Zone != nil {
					t = t.In(cal.Zone)
				}
				y, m, d := t.Date()
				return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
			}
			admit(8)
			grant("g1", "month", local(monthStart), 5, true)
			grant("g1", "month", local(monthStart), 5, true) // applied before: nothing more
			admit(6)
			grant("g2", "day", local(dayStart), 3, true)
			grant("g3", "month", local(monthStart).AddDate(0, -1, 0), 4, false) // not the current period
			grant("g4", "day", local(dayStart).AddDate(0, 0, 1), 4, false)
			admit(9)
		})
	}
}
