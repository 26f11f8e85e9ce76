package ratelimit

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

// mustCalendar returns the calendar of anchor in zone.
func mustCalendar(tb testing.TB, zone string, anchor int) quota.Calendar {
	tb.Helper()
	loc, err := quota.LoadZone(zone)
	if err != nil {
		tb.Fatalf("LoadZone(%q): %v", zone, err)
	}
	return quota.Calendar{AnchorDay: anchor, Zone: loc}
}

// wantPeriods checks d's daily and monthly resets and windows against cal
// at d's time.
func wantPeriods(tb testing.TB, cal quota.Calendar, d quota.Decision) {
	tb.Helper()
	ds, de := cal.Day(d.Now)
	ps, pe := cal.Period(d.Now)
	if l := limitOf(tb, d, quota.LimitDaily); !l.Reset.Equal(de) || l.Window != de.Sub(ds) {
		tb.Errorf("%s at %s: daily reset %s window %s, want %s %s", cal.Zone, d.Now, l.Reset, l.Window, de, de.Sub(ds))
	}
	if l := limitOf(tb, d, quota.LimitMonthly); !l.Reset.Equal(pe) || l.Window != pe.Sub(ps) {
		tb.Errorf("%s at %s: monthly reset %s window %s, want %s %s", cal.Zone, d.Now, l.Reset, l.Window, pe, pe.Sub(ps))
	}
}

// TestCalendarNewYork: a tenant in America/New_York with anchor 15. Its
// daily quota resets at local midnight, on the 23-hour and 25-hour days
// too, and its monthly quota at local midnight of the 15th.
func TestCalendarNewYork(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]redis.UniversalClient{"server": testenv.Redis(t), "cluster": testenv.Cluster(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testCalendarNewYork(t, c)
		})
	}
}

func testCalendarNewYork(t *testing.T, c redis.UniversalClient) {
	r, _ := mustRunner(t, c)
	cal := mustCalendar(t, "America/New_York", 15)
	ny := cal.Zone
	tenant := newTenant()
	req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Calendar: cal,
		Limits: quota.Limits{DailyQuota: i64(2), MonthlyQuota: i64(5)}}
	admit := func(at time.Time, want bool) quota.Decision {
		t.Helper()
		req.Now = at
		d := mustAdmit(t, r, req)
		if d.Allowed != want {
			t.Fatalf("at %s: allowed %v, want %v: %s", at.In(ny), d.Allowed, want, fmtDecision(d))
		}
		wantPeriods(t, cal, d)
		return d
	}

	// Saturday 2026-03-07, 24 hours; Sunday 2026-03-08 has 23 (02:00 EST
	// is 03:00 EDT)
	admit(time.Date(2026, 3, 7, 22, 0, 0, 0, ny), true)
	admit(time.Date(2026, 3, 7, 23, 0, 0, 0, ny), true)
	d := admit(time.Date(2026, 3, 7, 23, 30, 0, 0, ny), false) // UTC 04:30 on the 8th: still the 7th here
	if d.RetryAfter != 30*time.Minute || d.Violated[0] != quota.LimitDaily {
		t.Errorf("refusal at 23:30: %s, want daily, retry 30m", fmtDecision(d))
	}
	if l := limitOf(t, d, quota.LimitDaily); l.Window != 24*time.Hour {
		t.Errorf("2026-03-07's window %s, want 24h", l.Window)
	}
	d = admit(time.Date(2026, 3, 8, 0, 0, 0, 0, ny), true)
	if l := limitOf(t, d, quota.LimitDaily); l.Window != 23*time.Hour || !l.Reset.Equal(time.Date(2026, 3, 9, 0, 0, 0, 0, ny)) || l.Remaining != 1 {
		t.Errorf("2026-03-08: %+v, want 23h to 2026-03-09 00:00 EDT, 1 left", l)
	}
	// monthly: 3 used since 2026-02-15; the period ends 2026-03-15 00:00 EDT
	if l := limitOf(t, d, quota.LimitMonthly); l.Remaining != 2 || !l.Reset.Equal(time.Date(2026, 3, 15, 0, 0, 0, 0, ny)) {
		t.Errorf("monthly on 2026-03-08: %+v, want 2 left, reset 2026-03-15 00:00 EDT", l)
	}
	admit(time.Date(2026, 3, 10, 12, 0, 0, 0, ny), true)
	admit(time.Date(2026, 3, 14, 23, 0, 0, 0, ny), true)
	d = admit(time.Date(2026, 3, 14, 23, 59, 0, 0, ny), false)
	if d.RetryAfter != time.Minute || len(d.Violated) != 1 || d.Violated[0] != quota.LimitMonthly {
		t.Errorf("refusal at 2026-03-14 23:59: %s, want monthly, retry 1m", fmtDecision(d))
	}
	d = admit(time.Date(2026, 3, 15, 0, 0, 1, 0, ny), true) // a new period
	if l := limitOf(t, d, quota.LimitMonthly); l.Remaining != 4 || !l.Reset.Equal(time.Date(2026, 4, 15, 0, 0, 0, 0, ny)) || l.Window != 31*24*time.Hour {
		t.Errorf("monthly on 2026-03-15: %+v, want 4 left to 2026-04-15 00:00 EDT, 31 days", l)
	}

	// Sunday 2026-11-01 has 25 hours (02:00 EDT is 01:00 EST)
	admit(time.Date(2026, 11, 1, 0, 30, 0, 0, ny), true)
	admit(time.Date(2026, 11, 1, 23, 0, 0, 0, ny), true)
	d = admit(time.Date(2026, 11, 1, 23, 59, 0, 0, ny), false)
	if l := limitOf(t, d, quota.LimitDaily); l.Window != 25*time.Hour || d.RetryAfter != time.Minute {
		t.Errorf("2026-11-01: %+v retry %s, want a 25h window, retry 1m", l, d.RetryAfter)
	}
	admit(time.Date(2026, 11, 2, 0, 0, 0, 0, ny), true)
}

// TestCalendarKathmandu: +5:45, anchor 1: the day turns at 18:15 UTC, the
// month at 18:15 UTC of the last day of the month before.
func TestCalendarKathmandu(t *testing.T) {
	t.Parallel()
	r, _ := mustRunner(t, testenv.Redis(t))
	cal := mustCalendar(t, "Asia/Kathmandu", 1)
	req := quota.Request{TenantID: newTenant(), Meter: "demo", Cost: 2, Calendar: cal,
		Limits: quota.Limits{DailyQuota: i64(2), MonthlyQuota: i64(4)}}
	at := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		now   string
		allow bool
		retry time.Duration
	}{
		{"2026-05-30T18:00:00Z", true, 0},                              // 2026-05-30 23:45 local
		{"2026-05-30T18:14:59Z", false, time.Second},                   // daily, 1 s before local midnight
		{"2026-05-30T18:15:00Z", true, 0},                              // 2026-05-31
		{"2026-05-31T18:14:00Z", false, time.Minute},                   // monthly (4 used), 1 min before 2026-06-01 local
		{"2026-05-31T18:15:00Z", true, 0},                              // June
		{"2026-06-01T00:00:00Z", false, 18*time.Hour + 15*time.Minute}, // daily again
	} {
		req.Now = at(tc.now)
		d := mustAdmit(t, r, req)
		if d.Allowed != tc.allow || (!d.Allowed && d.RetryAfter != tc.retry) {
			t.Errorf("at %s: %s, want allowed %v retry %s", tc.now, fmtDecision(d), tc.allow, tc.retry)
		}
		wantPeriods(t, cal, d)
	}
}

// TestCalendarGrant: a grant for the current period of an anchored
// calendar lands in the anchored month; a recorded grant names it by its
// first local date.
func TestCalendarGrant(t *testing.T) {
	t.Parallel()
	r, _ := mustRunner(t, testenv.Redis(t))
	ctx := context.Background()
	cal := mustCalendar(t, "America/New_York", 15)
	ny := cal.Zone
	tenant := newTenant()
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, ny) // in the period from 2026-02-15
	req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 3, Calendar: cal, Now: now,
		Limits: quota.Limits{MonthlyQuota: i64(3)}}
	mustAdmit(t, r, req)
	if d := mustAdmit(t, r, req); d.Allowed {
		t.Fatalf("over the monthly quota: %s", fmtDecision(d))
	}
	// a recorded grant for the UTC month (2026-03-01) is not the current
	// period's; one for 2026-02-15 is
	if ok, err := r.grant(ctx, tenant, cal, "g-utc", "month", time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), 3, now); err != nil || ok {
		t.Fatalf("grant for 2026-03-01: %v %v, want not applied", ok, err)
	}
	if ok, err := r.grant(ctx, tenant, cal, "g-1", "month", time.Date(2026, 2, 15, 0, 0, 0, 0, time.UTC), 3, now); err != nil || !ok {
		t.Fatalf("grant for 2026-02-15: %v %v, want applied", ok, err)
	}
	d := mustAdmit(t, r, req)
	if !d.Allowed || limitOf(t, d, quota.LimitMonthly).Limit != 6 {
		t.Fatalf("after the grant: %s, want allowed with limit 6", fmtDecision(d))
	}
	// the grant ends with the period (2026-03-15 00:00 EDT)
	req.Now = time.Date(2026, 3, 15, 0, 0, 0, 0, ny)
	if d := mustAdmit(t, r, req); !d.Allowed || limitOf(t, d, quota.LimitMonthly).Limit != 3 {
		t.Fatalf("in the next period: %s, want allowed with limit 3", fmtDecision(d))
	}
	// a day grant without an id, for the local day
	req.Limits = quota.Limits{DailyQuota: i64(3)}
	req.Now = time.Date(2026, 3, 15, 23, 0, 0, 0, ny) // 03:00 UTC on the 16th
	mustAdmit(t, r, req)
	if d := mustAdmit(t, r, req); d.Allowed {
		t.Fatalf("daily quota spent: %s", fmtDecision(d))
	}
	if _, err := r.grant(ctx, tenant, cal, "", "day", time.Time{}, 3, req.Now); err != nil {
		t.Fatal(err)
	}
	if d := mustAdmit(t, r, req); !d.Allowed {
		t.Fatalf("after a day grant: %s", fmtDecision(d))
	}
}

// TestCalendarProperty admits at random instants (explicit times, moving
// forward) for tenants of random zones and anchors, and holds every
// decision to a model of the calendar's quotas: allowed iff the local
// day's and the period's units leave room, resets and windows those of
// quota.Calendar, a refusal's retry the end of the refusing period.
func TestCalendarProperty(t *testing.T) {
	t.Parallel()
	zones := []string{"America/New_York", "America/Los_Angeles", "America/Santiago", "America/St_Johns",
		"Europe/London", "Europe/Berlin", "Asia/Kathmandu", "Asia/Kolkata", "Asia/Tehran", "Australia/Lord_Howe",
		"Pacific/Apia", "Pacific/Chatham", "Pacific/Kiritimati", "Pacific/Pago_Pago", "Africa/Casablanca", "UTC"}
	r, _ := mustRunner(t, testenv.Redis(t))
	rng := rand.New(rand.NewPCG(15, 2))
	for range 24 {
		cal := mustCalendar(t, zones[rng.IntN(len(zones))], 1+rng.IntN(28))
		dq, mq := int64(2+rng.IntN(4)), int64(5+rng.IntN(10))
		req := quota.Request{TenantID: newTenant(), Meter: "demo", Calendar: cal,
			Limits: quota.Limits{DailyQuota: i64(dq), MonthlyQuota: i64(mq)}}
		now := time.Date(2000+rng.IntN(40), time.Month(1+rng.IntN(12)), 1+rng.IntN(28), 0, 0, 0, 0, time.UTC).
			Add(time.Duration(rng.Int64N(int64(24 * time.Hour))))
		days, months := map[int64]int64{}, map[int]int64{}
		for range 60 {
			// steps of seconds to days, often near a day's end
			switch rng.IntN(4) {
			case 0:
				_, end := cal.Day(now)
				now = end.Add(-time.Duration(rng.IntN(3)) * time.Second)
			case 1:
				now = now.Add(time.Duration(rng.Int64N(int64(3 * time.Hour))))
			case 2:
				now = now.Add(time.Duration(rng.Int64N(int64(4 * 24 * time.Hour))))
			default:
				_, end := cal.Period(now)
				now = end.Add(-time.Duration(rng.IntN(2)) * time.Second)
			}
			now = now.Truncate(time.Microsecond)
			req.Now, req.Cost = now, int64(1+rng.IntN(3))
			d := mustAdmit(t, r, req)
			day, month := cal.DayID(now), cal.PeriodID(now)
			_, de := cal.Day(now)
			_, pe := cal.Period(now)
			dayOK, monthOK := days[day]+req.Cost <= dq, months[month]+req.Cost <= mq
			if d.Allowed != (dayOK && monthOK) {
				t.Fatalf("%s anchor %d at %s (%s): %s, want allowed %v (day %d used %d, period %d used %d)",
					cal.Zone, cal.AnchorDay, now, now.In(cal.Zone), fmtDecision(d), dayOK && monthOK, day, days[day], month, months[month])
			}
			wantPeriods(t, cal, d)
			if d.Allowed {
				days[day] += req.Cost
				months[month] += req.Cost
				continue
			}
			var want time.Duration
			if !dayOK {
				want = de.Sub(now)
			}
			if !monthOK {
				want = max(want, pe.Sub(now))
			}
			if !dayOK && req.Cost > dq {
				want = -time.Microsecond // never
			}
			if d.RetryAfter != want {
				t.Fatalf("%s anchor %d at %s: retry %s, want %s", cal.Zone, cal.AnchorDay, now, d.RetryAfter, want)
			}
		}
	}
}

// TestCalendarClockSkew: boundaries made for a day far from Redis's clock
// are answered "CALENDAR <now>", and the runner calls once more with the
// boundaries of that now.
func TestCalendarClockSkew(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	cal := mustCalendar(t, "Asia/Kathmandu", 7)
	// a cached entry that claims today but encodes a day of 2001
	stale := makeBounds(cal, time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC))
	now := time.Now().Unix()
	stale.from, stale.until = now-3600, now+3600
	calCache.Store(calKey{zone: cal.Zone.String(), anchor: 7}, stale)
	req := quota.Request{TenantID: newTenant(), Meter: "demo", Cost: 1, Calendar: cal,
		Limits: quota.Limits{DailyQuota: i64(5), MonthlyQuota: i64(50)}}
	d := mustAdmit(t, r, req)
	if !d.Allowed || limitOf(t, d, quota.LimitDaily).Remaining != 4 {
		t.Fatalf("%s, want allowed, 4 left", fmtDecision(d))
	}
	wantPeriods(t, cal, d)
	// the function itself: an error naming its now, nothing written
	keys := r.keys(req.TenantID, "")
	err := r.Call(context.Background(), redisfn.FnAdmit, keys, 0, "admit", 1, "demo", "block",
		0, 0, 0, 0, 5, 50, "", 0, -1, 0, "", "", "", stale.arg).Err()
	if at := calendarNow(err); at <= 0 || time.Since(time.UnixMicro(at)).Abs() > time.Minute {
		t.Fatalf("script with stale boundaries: %v, want CALENDAR <now>", err)
	}
	if d := mustAdmit(t, r, req); limitOf(t, d, quota.LimitDaily).Remaining != 3 {
		t.Fatalf("%s, want 3 left", fmtDecision(d))
	}
}

// TestCalendarRefundAndPeek: a refund gives back to the local day and
// period it was admitted in; Peek and PeekMeterQuotas report them.
func TestCalendarRefundAndPeek(t *testing.T) {
	t.Parallel()
	r, _ := mustRunner(t, testenv.Redis(t))
	ctx := context.Background()
	cal := mustCalendar(t, "America/Los_Angeles", 20)
	la := cal.Zone
	now := time.Date(2026, 6, 30, 20, 0, 0, 0, la) // 03:00 UTC on July 1st
	lim := quota.Limits{DailyQuota: i64(10), MonthlyQuota: i64(100)}
	mq := []quota.MeterQuota{{Meter: "demo", DailyQuota: i64(7), MonthlyQuota: i64(70)}}
	req := quota.Request{TenantID: newTenant(), Meter: "demo", Cost: 4, Calendar: cal, Now: now, Limits: lim, MeterQuotas: mq}
	d := mustAdmit(t, r, req)
	if !d.Allowed {
		t.Fatal(fmtDecision(d))
	}
	if err := r.RefundIn(ctx, req.TenantID, "demo", cal, 3, 0, d.Now); err != nil {
		t.Fatal(err)
	}
	p, err := r.PeekIn(ctx, req.TenantID, cal, lim, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if l := limitOf(t, p, quota.LimitDaily); l.Remaining != 9 {
		t.Errorf("daily after the refund: %+v, want 9 left", l)
	}
	if l := limitOf(t, p, quota.LimitMonthly); l.Remaining != 99 {
		t.Errorf("monthly after the refund: %+v, want 99 left", l)
	}
	wantPeriods(t, cal, p)
	rows, err := r.PeekMeterQuotas(ctx, req.TenantID, cal, mq, now.Add(time.Minute))
	if err != nil || len(rows) != 2 {
		t.Fatalf("PeekMeterQuotas: %v %v", rows, err)
	}
	ds, de := cal.Day(now)
	ps, pe := cal.Period(now)
	if rows[0].Remaining != 3 || !rows[0].Reset.Equal(de) || rows[0].Window != de.Sub(ds) {
		t.Errorf("meter daily: %+v, want 3 left to %s", rows[0], de)
	}
	if rows[1].Remaining != 66 || !rows[1].Reset.Equal(pe) || rows[1].Window != pe.Sub(ps) {
		t.Errorf("meter monthly: %+v, want 66 left to %s", rows[1], pe)
	}
}

// TestCalendarDefaultIsUTC: the default calendar, under any of its names,
// sends nothing and answers as before.
func TestCalendarDefaultIsUTC(t *testing.T) {
	for _, cal := range []quota.Calendar{{}, {AnchorDay: 1}, mustCalendar(t, "Etc/UTC", 1)} {
		if b := boundsOf(cal, time.Now()); b != nil {
			t.Errorf("boundsOf(%v) = %q, want nil", cal, b.arg)
		}
	}
}

// TestCalendarWithPolicies: the policy variant of admit.lua takes the
// calendar in ARGV[20] and the policies from ARGV[21]: a tenant policy and
// the local day's quota decide together.
func TestCalendarWithPolicies(t *testing.T) {
	t.Parallel()
	r, _ := mustRunner(t, testenv.Redis(t))
	cal := mustCalendar(t, "America/New_York", 1)
	pol := fixedWindow("per-hour", 2, quota.ScopeTenant, quota.RefuseReject)
	tenant := newTenant()
	late := time.Date(2026, 3, 7, 22, 30, 0, 0, cal.Zone) // 03:30 UTC on the 8th
	for i, tc := range []struct {
		now     time.Time
		allow   bool
		refuser quota.LimitName
	}{
		{late, true, ""},
		{late.Add(time.Minute), true, ""},
		{late.Add(2 * time.Minute), false, "per-hour"},        // the policy (2 in 03:00-04:00 UTC)
		{late.Add(31 * time.Minute), true, ""},                // 23:01 local, the policy's next hour
		{late.Add(45 * time.Minute), false, quota.LimitDaily}, // the local day's 3 units
		{late.Add(91 * time.Minute), true, ""},                // 2026-03-08 00:01 local
	} {
		req := policyReq(tenant, tc.now, i, 3, pol)
		req.Calendar = cal
		d := mustAdmit(t, r, req)
		if d.Allowed != tc.allow || (!tc.allow && (len(d.Violated) != 1 || d.Violated[0] != tc.refuser)) {
			t.Fatalf("at %s: %s, want allowed %v refused by %q", tc.now.In(cal.Zone), fmtDecision(d), tc.allow, tc.refuser)
		}
		wantDaily(t, cal, d)
	}
}

// wantDaily checks d's daily reset and window against cal at d's time.
func wantDaily(tb testing.TB, cal quota.Calendar, d quota.Decision) {
	tb.Helper()
	ds, de := cal.Day(d.Now)
	if l := limitOf(tb, d, quota.LimitDaily); !l.Reset.Equal(de) || l.Window != de.Sub(ds) {
		tb.Errorf("at %s: daily reset %s window %s, want %s %s", d.Now, l.Reset, l.Window, de, de.Sub(ds))
	}
}

// TestCalendarChange: a tenant whose calendar changes mid-period keeps the
// counters whose id is still the current one and starts the others
// again; a move back to the default calendar finds the UTC month's end (a
// calendar's state keeps no cached month end).
func TestCalendarChange(t *testing.T) {
	t.Parallel()
	r, _ := mustRunner(t, testenv.Redis(t))
	ny15 := mustCalendar(t, "America/New_York", 15)
	ny := ny15.Zone
	tenant := newTenant()
	now := time.Date(2026, 3, 20, 12, 0, 0, 0, ny)
	admit := func(cal quota.Calendar, wantLeft int64) {
		t.Helper()
		req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Calendar: cal, Now: now,
			Limits: quota.Limits{DailyQuota: i64(100), MonthlyQuota: i64(10)}}
		d := mustAdmit(t, r, req)
		if l := limitOf(t, d, quota.LimitMonthly); !d.Allowed || l.Remaining != wantLeft {
			t.Fatalf("%v at %s: %s, want allowed with %d left", cal, now, fmtDecision(d), wantLeft)
		}
		wantPeriods(t, cal, d)
	}
	admit(ny15, 9)
	admit(ny15, 8)
	admit(quota.Calendar{}, 7) // the UTC month 202603: the same id
	admit(ny15, 6)
	admit(mustCalendar(t, "America/New_York", 25), 9) // the period from 2026-02-25: another id
	admit(ny15, 9)                                    // and back: 202603 again, from 0
	now = time.Date(2026, 4, 2, 12, 0, 0, 0, ny)
	admit(quota.Calendar{}, 9) // April in UTC
	admit(ny15, 9)             // New York's 202603 again: the state held 202604
}

// TestCalendarSettle: a settle reservation names the admission's local day
// and billing month, so that its refund reaches them (here the local day
// and month have begun while UTC's have not).
func TestCalendarSettle(t *testing.T) {
	t.Parallel()
	r, _ := mustRunner(t, testenv.Redis(t))
	ctx := context.Background()
	cal := mustCalendar(t, "Asia/Kathmandu", 1)
	now := time.Date(2031, 5, 31, 18, 30, 0, 0, time.UTC) // 2031-06-01 00:15 local
	lim := quota.Limits{DailyQuota: i64(100), MonthlyQuota: i64(100)}
	req := quota.Request{TenantID: newTenant(), Meter: "gen", Cost: 10, Calendar: cal, Now: now, Limits: lim}
	d := mustAdmit(t, r, req)
	if err := r.Reserve(ctx, "cal-1", req, d); err != nil {
		t.Fatal(err)
	}
	if s, err := r.Settle(ctx, req.TenantID, "cal-1", 4); err != nil || s.Status != quota.SettleApplied || s.Delta != -6 {
		t.Fatalf("settle: %+v %v", s, err)
	}
	p, err := r.PeekIn(ctx, req.TenantID, cal, lim, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []quota.LimitName{quota.LimitDaily, quota.LimitMonthly} {
		if l := limitOf(t, p, name); l.Remaining != 96 {
			t.Errorf("%s after the settle: %+v, want 96 left", name, l)
		}
	}
}

// TestCalendarRestore: a repair restores the counters of the record's
// calendar's day and month.
func TestCalendarRestore(t *testing.T) {
	t.Parallel()
	r, _ := mustRunner(t, testenv.Redis(t))
	ctx := context.Background()
	cal := mustCalendar(t, "America/New_York", 15)
	tenant := newTenant()
	at := time.Now()
	if err := r.Restore(ctx, at, []quota.Recorded{{TenantID: tenant, DayUnits: 5, MonthUnits: 7, Calendar: cal}}); err != nil {
		t.Fatal(err)
	}
	lim := quota.Limits{DailyQuota: i64(10), MonthlyQuota: i64(10)}
	p, err := r.PeekIn(ctx, tenant, cal, lim, at)
	if err != nil {
		t.Fatal(err)
	}
	if d, m := limitOf(t, p, quota.LimitDaily), limitOf(t, p, quota.LimitMonthly); d.Remaining != 5 || m.Remaining != 3 {
		t.Errorf("after the repair: daily %+v, monthly %+v, want 5 and 3 left", d, m)
	}
	wantPeriods(t, cal, p)
	// and the next admission, in the calendar, counts on from there
	d := mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Calendar: cal, Now: at, Limits: lim})
	if l := limitOf(t, d, quota.LimitMonthly); !d.Allowed || l.Remaining != 2 {
		t.Errorf("admission after the repair: %s, want 2 left", fmtDecision(d))
	}
}
