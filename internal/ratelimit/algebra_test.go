package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/limits"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The differential tests: random sequences of every operation that moves a
// tenant's limits (admissions of random lists, dry runs, peeks, refunds,
// settlements up and down, grants, quota resets, plan changes, month and
// calendar rollovers, clock jumps) run against Redis, through the Runner,
// and against internal/limits, comparing every answer and, after every
// step, everything Redis holds of the tenant with the reference's state,
// field by field. The money scenarios of money_test.go run the same way
// (TestAlgebraMoneySeeds).

// twin drives one tenant on Redis and on the reference side by side.
type twin struct {
	tb       testing.TB
	c        redis.UniversalClient
	r        *stack
	tenant   string
	m        ref
	keys     []string // the idempotency keys used
	admitted []admission
	stamp    int64 // the last quota reset's stamp
	history  []string
	fail     func(format string, args ...any)
}

// admission is an admitted request, for a refund or a settlement.
type admission struct {
	req     quota.Request
	d       quota.Decision
	rid     string // its settle entry, "" none
	settled bool
}

func newTwin(tb testing.TB, c redis.UniversalClient, r *stack) *twin {
	w := &twin{tb: tb, c: c, r: r, tenant: newTenant()}
	w.fail = func(format string, args ...any) {
		tb.Helper()
		tb.Fatalf("tenant %s\nlast steps:\n  %s\n%s", w.tenant, strings.Join(w.history[max(0, len(w.history)-10):], "\n  "),
			fmt.Sprintf(format, args...))
	}
	return w
}

func (w *twin) log(format string, args ...any) {
	w.history = append(w.history, fmt.Sprintf(format, args...))
}

// same compares the state after a step.
func (w *twin) same(step string) {
	w.tb.Helper()
	got := redisState(w.tb, w.c, w.r, w.tenant, w.keys...)
	if msg := diffStates(&got, &w.m.State); msg != "" {
		w.fail("%s: state differs: %s", step, msg)
	}
}

// admit admits req on both; it returns Redis's decision and whether it
// was admitted (not a dry run, not a replay).
func (w *twin) admit(req quota.Request, reserve bool) quota.Decision {
	w.tb.Helper()
	req.TenantID = w.tenant
	if req.IdempotencyKey != "" && !contains(w.keys, req.IdempotencyKey) {
		w.keys = append(w.keys, req.IdempotencyKey)
	}
	got, gerr := w.r.Admit(context.Background(), req)
	want, werr := w.m.admit(req, req.Now)
	step := fmt.Sprintf("admit %s cost=%d meter=%s dry=%t idem=%q%s -> %s", req.Now.Format(time.RFC3339Nano), req.Cost,
		req.Meter, req.DryRun, req.IdempotencyKey, fmtPlan(req), fmtDecision(want))
	w.log("%s", step)
	var gs, ws *quota.PrepaidStaleError
	switch {
	case gerr != nil || werr != nil:
		if !errors.As(gerr, &gs) || !errors.As(werr, &ws) || !gs.Now.Equal(ws.Now) {
			w.fail("%s: errors: got %v, want %v", step, gerr, werr)
		}
	case fmtDecision(got) != fmtDecision(want) || got.MeterOverageUnits != want.MeterOverageUnits:
		w.fail("%s:\n  got  %s meter overage %d\n  want %s meter overage %d", step, fmtDecision(got), got.MeterOverageUnits,
			fmtDecision(want), want.MeterOverageUnits)
	}
	w.same(step)
	if gerr == nil && got.Allowed && !req.DryRun && !got.Replayed() {
		a := admission{req: req, d: got}
		if reserve {
			a.rid = fmt.Sprintf("s%d-%s", len(w.admitted), w.tenant)
			if err := w.r.Reserve(context.Background(), a.rid, req, got); err != nil {
				w.fail("Reserve: %v", err)
			}
		}
		w.admitted = append(w.admitted, a)
	}
	return got
}

// refund refunds the i-th admission on both.
func (w *twin) refund(i int) {
	w.tb.Helper()
	a := &w.admitted[i]
	a.settled = true
	if err := w.r.RefundRequest(context.Background(), a.req, a.d); err != nil {
		w.fail("RefundRequest: %v", err)
	}
	w.m.Refund(a.req, a.d)
	step := fmt.Sprintf("refund #%d (%s meter %s cost %d overage %d/%d%s)", i, a.req.Now.Format(time.RFC3339Nano), a.req.Meter,
		a.req.Cost, a.d.OverageUnits, a.d.MeterOverageUnits, fmtPlan(a.req))
	w.log("%s", step)
	w.same(step)
}

// settle settles the i-th admission (reserved) to actual on both.
func (w *twin) settle(i int, actual int64) {
	w.tb.Helper()
	a := &w.admitted[i]
	a.settled = true
	got, err := w.r.Settle(context.Background(), w.tenant, a.rid, actual)
	if err != nil {
		w.fail("Settle: %v", err)
	}
	want := w.m.Settle(a.req, a.d, actual)
	step := fmt.Sprintf("settle #%d (%s meter %s cost %d overage %d/%d%s) to %d -> %+v", i, a.req.Now.Format(time.RFC3339Nano),
		a.req.Meter, a.req.Cost, a.d.OverageUnits, a.d.MeterOverageUnits, fmtPlan(a.req), actual, want)
	w.log("%s", step)
	if got != want {
		w.fail("%s: got %+v", step, got)
	}
	w.same(step)
}

// reset applies a quota reset of a plan change at at (stamp: at, or the
// last stamp again: a retry) on both.
func (w *twin) reset(cal quota.Calendar, at time.Time, retry bool) {
	w.tb.Helper()
	if !retry || w.stamp == 0 {
		w.stamp = max(w.stamp+1, at.UnixMicro())
	}
	stamp := time.UnixMicro(w.stamp)
	got, err := w.r.ResetQuotasIn(context.Background(), w.tenant, cal, stamp)
	if err != nil {
		w.fail("ResetQuotasIn: %v", err)
	}
	day, month := redisfn.PeriodIDs(cal, stamp)
	want := w.m.Reset(w.stamp, day, month, time.Now().UnixMicro()) >= 0
	step := fmt.Sprintf("reset %s retry=%t -> %t", stamp.Format(time.RFC3339Nano), retry, want)
	w.log("%s", step)
	if got != want {
		w.fail("%s: got %t", step, got)
	}
	w.same(step)
}

// grant adds units to the day or month of now on both.
func (w *twin) grant(period string, units int64, now time.Time) {
	w.tb.Helper()
	if err := w.r.Grant(context.Background(), w.tenant, period, units, now); err != nil {
		w.fail("Grant: %v", err)
	}
	w.m.Grant(period, units, now)
	step := fmt.Sprintf("grant %s %d at %s", period, units, now.Format(time.RFC3339Nano))
	w.log("%s", step)
	w.same(step)
}

// peek compares Runner.PeekIn with the reference's report.
func (w *twin) peek(lim quota.Limits, cal quota.Calendar, now time.Time) {
	w.tb.Helper()
	got, err := w.r.PeekIn(context.Background(), w.tenant, cal, lim, now)
	if err != nil {
		w.fail("PeekIn: %v", err)
	}
	want := w.m.Peek(lim, cal, now)
	step := fmt.Sprintf("peek %s -> %s", now.Format(time.RFC3339Nano), fmtDecision(want))
	w.log("%s", step)
	if fmtDecision(got) != fmtDecision(want) {
		w.fail("%s:\n  got  %s", step, fmtDecision(got))
	}
	w.same(step)
}

// store stores the answer of the request with key and fp on both.
func (w *twin) store(key, fp string) {
	w.tb.Helper()
	got, err := w.r.StoreAnswer(context.Background(), quota.Request{TenantID: w.tenant, IdempotencyKey: key,
		IdempotencyFingerprint: fp, IdempotencyClaim: "claim-" + key}, quota.StoredAnswer{Status: 200})
	if err != nil {
		w.fail("StoreAnswer: %v", err)
	}
	want := w.m.StoreAnswer(key, fp)
	step := fmt.Sprintf("store %s %s -> %t", key, fp, want)
	w.log("%s", step)
	if got != want {
		w.fail("%s: got %t", step, got)
	}
	w.same(step)
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// plan is a tenant's tier as a request carries it.
type plan struct {
	limits  quota.Limits
	overage quota.Overage
	price   int64
	meters  []quota.MeterQuota
	prepaid *quota.Prepaid // its balance; PeriodID set per request
	cal     quota.Calendar
}

func (p plan) request(meter string, cost int64, now time.Time) quota.Request {
	req := quota.Request{Meter: meter, Cost: cost, Now: now, Limits: p.limits, Overage: p.overage,
		OveragePriceCentsPer1K: p.price, MeterQuotas: p.meters, Calendar: p.cal}
	if p.prepaid != nil {
		pp := *p.prepaid
		_, month := redisfn.PeriodIDs(p.cal, now)
		pp.PeriodID = int(month)
		if pp.PrevID != 0 {
			pp.PrevID = prevPeriod(pp.PeriodID)
		}
		req.Prepaid = &pp
	}
	return req
}

func prevPeriod(id int) int {
	if id%100 == 1 {
		return id - 100 + 11
	}
	return id - 1
}

func fmtPlan(req quota.Request) string {
	s := " plan " + fmtLimits(req.Limits) + fmt.Sprintf(" overage=%s price=%d", req.Overage, req.OveragePriceCentsPer1K)
	for _, q := range req.MeterQuotas {
		s += fmt.Sprintf(" %s{d=%s m=%s %s %d}", q.Meter, ptr(q.DailyQuota), ptr(q.MonthlyQuota), q.Overage, q.OveragePriceCentsPer1K)
	}
	if pp := req.Prepaid; pp != nil {
		s += fmt.Sprintf(" prepaid{bal=%d id=%d prev=%d lines=%d exp=%d}", pp.BalanceMillicents, pp.PeriodID, pp.PrevID, pp.Lines, pp.ExpiringMillicents)
	}
	if !req.Calendar.IsDefault() {
		s += fmt.Sprintf(" cal=%s/%d", req.Calendar.Zone, req.Calendar.AnchorDay)
	}
	return s
}

func ptr(p *int64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

// randomPlan draws a tier: any mix of burst limits, day and month quotas
// (blocked or billed), meter quotas of "a" and "b" (daily, monthly,
// blocked or billed), a spend cap, prepaid credit, a calendar.
func randomPlan(rng *rand.Rand, cals []quota.Calendar) plan {
	p := plan{limits: randomLimits(rng), overage: randomOverage(rng), price: randomPrice(rng)}
	if p.overage == quota.OverageBlock {
		p.limits.MaxOverageCents, p.price = nil, 0
	}
	for _, m := range []string{"a", "b"} {
		if rng.IntN(2) == 0 {
			continue
		}
		q := quota.MeterQuota{Meter: m, Overage: quota.OverageBlock}
		if rng.IntN(3) > 0 {
			q.MonthlyQuota = i64(rng.Int64N(40))
		}
		if rng.IntN(3) == 0 || q.MonthlyQuota == nil {
			q.DailyQuota = i64(rng.Int64N(20))
		}
		if q.MonthlyQuota != nil && rng.IntN(2) == 0 {
			q.Overage, q.OveragePriceCentsPer1K = quota.OverageBill, []int64{300, 1000, 2500}[rng.IntN(3)]
		}
		p.meters = append(p.meters, q)
		if q.Bills() && p.overage == quota.OverageBill && rng.IntN(4) > 0 {
			// a cap the meters' spend reaches over days, not at once
			p.limits.MaxOverageCents = i64(rng.Int64N(80))
		}
	}
	if rng.IntN(5) == 0 {
		p.overage, p.price = quota.OverageBill, []int64{1000, 333, 2000}[rng.IntN(3)]
		if p.limits.MonthlyQuota == nil {
			p.limits.MonthlyQuota = i64(rng.Int64N(30))
		}
		p.prepaid = &quota.Prepaid{BalanceMillicents: rng.Int64N(60_000), Lines: 1 + rng.IntN(3),
			ExpiringMillicents: []int64{0, 5_000, 1 << 53}[rng.IntN(3)]}
		if rng.IntN(2) == 0 {
			p.prepaid.PrevID = 1
		}
	}
	p.cal = cals[rng.IntN(len(cals))]
	return p
}

// moneyPlan draws a plan that bills: the tier past its monthly quota, a
// billed quota of meter "a", of "b" billed or blocked, a spend cap the
// month reaches over days, credit one time in three.
func moneyPlan(rng *rand.Rand, cals []quota.Calendar) plan {
	p := plan{limits: quota.Limits{MonthlyQuota: i64(rng.Int64N(30)), MaxOverageCents: i64(20 + rng.Int64N(60))},
		overage: quota.OverageBill, price: []int64{300, 1000}[rng.IntN(2)], cal: cals[rng.IntN(len(cals))]}
	for _, m := range []string{"a", "b"} {
		q := quota.MeterQuota{Meter: m, MonthlyQuota: i64(rng.Int64N(20)), Overage: quota.OverageBill,
			OveragePriceCentsPer1K: []int64{300, 1000, 2500}[rng.IntN(3)]}
		if m == "b" && rng.IntN(2) == 0 {
			q.Overage, q.OveragePriceCentsPer1K = quota.OverageBlock, 0
		}
		p.meters = append(p.meters, q)
	}
	if rng.IntN(3) == 0 {
		p.prepaid = &quota.Prepaid{BalanceMillicents: 20_000 + rng.Int64N(200_000), Lines: 1 + rng.IntN(3),
			ExpiringMillicents: []int64{0, 5_000, 1 << 53}[rng.IntN(3)], PrevID: rng.IntN(2)}
	}
	return p
}

// gap is the time to the next step: none, µs, seconds, hours, days,
// beyond a month, or back (a clock set back).
func gap(rng *rand.Rand) time.Duration {
	switch x := rng.IntN(100); {
	case x < 4:
		return -time.Duration(rng.Int64N(int64(3 * time.Hour)))
	case x < 5:
		return -time.Duration(rng.Int64N(int64(4 * 24 * time.Hour)))
	}
	return randomGap(rng)
}

// TestAlgebraMatchesScripts runs random sequences on one Redis.
func TestAlgebraMatchesScripts(t *testing.T) {
	t.Parallel()
	runAlgebra(t, testenv.Redis(t), 24, 150)
}

// TestClusterAlgebraMatchesScripts runs them on the 3-master cluster.
func TestClusterAlgebraMatchesScripts(t *testing.T) {
	t.Parallel()
	runAlgebra(t, testenv.Cluster(t), 6, 100)
}

func runAlgebra(t *testing.T, c redis.UniversalClient, schedules, steps int) {
	runAlgebraWith(t, c, schedules, steps, func(w *twin) *twin { return w })
}

// runAlgebraWith runs the schedules with each tenant's twin made by wrap.
func runAlgebraWith(t *testing.T, c redis.UniversalClient, schedules, steps int, wrap func(*twin) *twin) {
	rng, _ := propertyRand(t, 0xa16eb7a)
	r, _ := mustRunner(t, c)
	cals := []quota.Calendar{{}, {}, mustCalendar(t, "America/New_York", 15), mustCalendar(t, "Australia/Sydney", 28)}
	starts := append([]string{"2031-03-15T03:58:00Z", "2031-10-28T12:50:00Z"}, propertyStarts...)
	seen := map[string]int{}
	for s := range schedules {
		w := wrap(newTwin(t, c, r))
		p := randomPlan(rng, cals)
		now := at(t, starts[rng.IntN(len(starts))]).Add(-time.Duration(rng.Int64N(int64(10 * time.Minute)))).Truncate(time.Microsecond)
		// one schedule in three is about money: a plan that bills (the
		// tier, its meters, a cap, maybe credit), kept, over days across a
		// month's end
		money := s%3 == 2
		if money {
			p = moneyPlan(rng, cals)
			now = now.Add(-time.Duration(2*24+rng.IntN(24)) * time.Hour)
		}
		w.log("schedule %d money=%t", s, money)
		for range steps {
			if money {
				now = now.Add(time.Duration(rng.Int64N(int64(3 * time.Hour)))).Truncate(time.Microsecond)
			} else {
				now = now.Add(gap(rng)).Truncate(time.Microsecond)
			}
			open := []int{}
			for i, a := range w.admitted {
				if !a.settled {
					open = append(open, i)
				}
			}
			switch x := rng.IntN(100); {
			case x < 4 && !money:
				cal := p.cal
				p = randomPlan(rng, cals)
				if rng.IntN(3) > 0 {
					p.cal = cal // calendar changes are rarer
				}
				seen["plan"]++
			case x < 7:
				w.grant([]string{"day", "month"}[rng.IntN(2)], 1+rng.Int64N(20), now)
				seen["grant"]++
			case x < 9:
				w.reset(p.cal, now, rng.IntN(4) == 0)
				seen["reset"]++
			case x < 12:
				w.peek(p.limits, p.cal, now)
			case x < 20 && len(open) > 0:
				i := open[rng.IntN(len(open))]
				if rng.IntN(2) == 0 {
					i = open[0] // the oldest: often of a month before
				}
				if w.admitted[i].rid != "" {
					actual := max(0, w.admitted[i].req.Cost+rng.Int64N(21)-10)
					if rng.IntN(3) == 0 {
						actual = rng.Int64N(60)
					}
					adm := limits.AdmissionOf(w.admitted[i].req, w.admitted[i].d)
					if actual > w.admitted[i].req.Cost && w.m.SpentBefore.Month == adm.Month && w.m.Spent.Month > adm.Month {
						seen["settle up of a month before the meters' spend"]++
					}
					w.settle(i, actual)
					seen["settle"]++
				} else {
					w.refund(i)
					seen["refund"]++
				}
			case x < 22 && len(w.keys) > 0:
				w.store(w.keys[rng.IntN(len(w.keys))], "fp")
			default:
				req := p.request([]string{"a", "a", "b", "c"}[rng.IntN(4)], randomCost(rng), now)
				req.DryRun = rng.IntN(12) == 0
				if rng.IntN(8) == 0 {
					req.IdempotencyKey = fmt.Sprintf("key-%d", rng.IntN(3))
					req.IdempotencyFingerprint = []string{"fp", "fp", "other"}[rng.IntN(3)]
					if rng.IntN(2) == 0 {
						req.IdempotencyLease = time.Minute
					}
				}
				if req.Prepaid != nil && rng.IntN(30) == 0 {
					req.Prepaid.PeriodID = prevPeriod(req.Prepaid.PeriodID) // stale
				}
				d := w.admit(req, rng.IntN(2) == 0)
				countOutcome(seen, req, d)
				if d.MeterOverageUnits > 0 {
					seen["meter overage"]++
				}
			}
		}
		testenv.DeleteKeys(c, r.Prefix()+":*{t:"+w.tenant+"}*")
	}
	t.Logf("outcomes: %v", seen)
}
