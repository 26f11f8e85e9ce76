// Package usage is the usage read model: a tenant's limits as they stand
// (read at admission without consuming anything) and this period's usage,
// recorded in the ledger plus still pending at admission, as /v1/usage, the
// admin summary, the tenant dashboard and the console all show it. It joins
// the two sides of usage in one place, so that every view adds them the same
// way.
//
// It only reads: it never counts, refunds or bills.
package usage

import (
	"context"
	"sort"
	"time"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/quota"
)

// counters is the admission side (*quotaredis.Store): the limits and the
// policies as they stand, and the usage counted but not yet recorded.
type counters interface {
	PeekIn(ctx context.Context, tenantID string, cal quota.Calendar, limits quota.Limits, now time.Time) (quota.Decision, error)
	PeekPolicies(ctx context.Context, req quota.Request) ([]quota.PolicyState, error)
	PeekMeterQuotas(ctx context.Context, tenantID string, cal quota.Calendar, qs []quota.MeterQuota, now time.Time) ([]quota.LimitState, error)
	PeekSpendCap(ctx context.Context, req quota.Request, now time.Time) (quota.LimitState, bool, error)
	PrepaidDrawn(ctx context.Context, tenantID string, pp quota.Prepaid) (int64, error)
	Pending(ctx context.Context, tenantID string) ([]quota.PendingRow, error)
	AnswerUsage(ctx context.Context, tenantID string) (quota.AnswerUsage, error)
	PendingMany(ctx context.Context, ids []string) (map[string][]quota.PendingRow, error)
}

// ledger is the recorded side (*billing.Ledger).
type ledger interface {
	EachUsage(ctx context.Context, tenantID string, from, to time.Time, granularity, meter string, fn func(billing.UsageRow) error) error
	TenantTotals(ctx context.Context, ids []string, from, to time.Time) (map[string]billing.Totals, error)
}

// Reader reads usage. It is safe for concurrent use.
type Reader struct {
	counters counters
	ledger   ledger
	now      func() time.Time
	prepaid  func(ctx context.Context, p catalog.Principal, now time.Time) (*quota.Prepaid, error)
}

// WithPrepaid sets where For reads a prepaid tenant's balance
// (catalog.Catalog.Prepaid); without it, For shows no credit row.
func (r *Reader) WithPrepaid(f func(ctx context.Context, p catalog.Principal, now time.Time) (*quota.Prepaid, error)) *Reader {
	r.prepaid = f
	return r
}

// NewReader returns a Reader over the admission counters c and the ledger l;
// now is the clock of MonthTotals (For reads the admission side's clock).
func NewReader(c counters, l ledger, now func() time.Time) *Reader {
	return &Reader{counters: c, ledger: l, now: now}
}

// Limit is one limit as /v1/usage and /v1/check show it.
type Limit struct {
	Name          quota.LimitName `json:"name"`
	Limit         int64           `json:"limit"`
	Remaining     int64           `json:"remaining"`
	Reset         string          `json:"reset"`
	WindowSeconds int64           `json:"window_seconds"`
}

// Limits are the limits of d as /v1/usage and /v1/check show them.
func Limits(d quota.Decision) []Limit {
	out := make([]Limit, 0, len(d.Limits))
	for _, l := range d.Limits {
		out = append(out, Limit{Name: l.Name, Limit: l.Limit, Remaining: l.Remaining,
			Reset: quota.ResetTime(l.Reset).Format(time.RFC3339), WindowSeconds: quota.WindowSeconds(l.Window)})
	}
	return out
}

// Day is one day of a report. ShadowRefused counts the requests a shadow
// policy would have refused (admitted or not), Degraded those answered with
// a degrade policy's fallback (not admitted, not charged, not in Rejected).
type Day struct {
	Date          string `json:"date"`
	Units         int64  `json:"units"`
	Requests      int64  `json:"requests"`
	Rejected      int64  `json:"rejected"`
	ShadowRefused int64  `json:"shadow_refused"`
	Degraded      int64  `json:"degraded"`
}

// Meter is one meter's usage this month in a report, counted as Day's.
type Meter struct {
	Meter         string `json:"meter"`
	Units         int64  `json:"units"`
	Requests      int64  `json:"requests"`
	Rejected      int64  `json:"rejected"`
	ShadowRefused int64  `json:"shadow_refused"`
	Degraded      int64  `json:"degraded"`
}

// counts is what a day or a meter of a report sums.
type counts struct {
	units, requests, rejected, shadowRefused, degraded int64
}

func (d *Day) add(c counts) {
	d.Units, d.Requests, d.Rejected = d.Units+c.units, d.Requests+c.requests, d.Rejected+c.rejected
	d.ShadowRefused, d.Degraded = d.ShadowRefused+c.shadowRefused, d.Degraded+c.degraded
}

func (m *Meter) add(c counts) {
	m.Units, m.Requests, m.Rejected = m.Units+c.units, m.Requests+c.requests, m.Rejected+c.rejected
	m.ShadowRefused, m.Degraded = m.ShadowRefused+c.shadowRefused, m.Degraded+c.degraded
}

// Report is a tenant's usage: the body of GET /v1/usage and of the admin's
// GET /admin/v1/tenants/{id}/summary, and what both dashboards show.
type Report struct {
	TenantID string  `json:"tenant_id"`
	Tier     string  `json:"tier"`
	Limits   []Limit `json:"limits"`
	Daily    []Day   `json:"daily"`
	Meters   []Meter `json:"meters"`
	// Policies are the tenant's policies with their state (Reader.Policies);
	// For leaves the list empty for its caller to fill.
	Policies []Policy       `json:"policies"`
	Upgrade  *quota.Upgrade `json:"upgrade"`
	// Idempotency is the room the tenant's idempotency records hold, of
	// their limits (quota.AnswerLimits).
	Idempotency IdempotencyRoom `json:"idempotency"`

	// monthStart and periodEnd bound the billing period of Daily and
	// Meters (by the admission side's time), whose dates are local to loc
	monthStart, periodEnd time.Time
	loc                   *time.Location
	today                 string // the (local) date the limits were read on
}

// IdempotencyRoom is the room of a tenant's idempotency records as
// /v1/usage shows it: the records (stored answers and first requests in
// flight) and their bytes (a request in flight holds the largest answer's).
type IdempotencyRoom struct {
	Answers Room `json:"answers"`
	Bytes   Room `json:"bytes"`
}

// Room is what is used of a limit.
type Room struct {
	Used  int64 `json:"used"`
	Limit int64 `json:"limit"`
}

// MonthStart is the start of the billing period of Daily and Meters (for
// the default calendar, the UTC month's).
func (u Report) MonthStart() time.Time { return u.monthStart }

// Period is the billing period of Daily and Meters, [start, end), and the
// zone its dates (Day.Date) are local to.
func (u Report) Period() (start, end time.Time, loc *time.Location) {
	loc = u.loc
	if loc == nil {
		loc = time.UTC
	}
	return u.monthStart, u.periodEnd, loc
}

// PeriodDates are the local dates (YYYY-MM-DD) of the billing period, in
// order: the days of Daily's rows.
func (u Report) PeriodDates() []string {
	start, end, loc := u.Period()
	if !end.After(start) {
		return nil
	}
	s, last := start.In(loc), end.Add(-time.Nanosecond).In(loc)
	d := time.Date(s.Year(), s.Month(), s.Day(), 0, 0, 0, 0, time.UTC)
	stop := time.Date(last.Year(), last.Month(), last.Day(), 0, 0, 0, 0, time.UTC)
	var out []string
	for ; !d.After(stop); d = d.AddDate(0, 0, 1) {
		out = append(out, d.Format(time.DateOnly))
	}
	return out
}

// Today is today's row of Daily (zero when nothing was used today).
func (u Report) Today() Day {
	for _, d := range u.Daily {
		if d.Date == u.today {
			return d
		}
	}
	return Day{Date: u.today}
}

// Month sums the daily rows: the month's usage so far.
func (u Report) Month() billing.Totals {
	var t billing.Totals
	for _, d := range u.Daily {
		t.Units += d.Units
		t.Requests += d.Requests
		t.Rejected += d.Rejected
	}
	return t
}

// Limit returns the named limit and whether it is active.
func (u Report) Limit(name quota.LimitName) (Limit, bool) {
	for _, l := range u.Limits {
		if l.Name == name {
			return l, true
		}
	}
	return Limit{}, false
}

// For is the usage of p's tenant: its limits as they stand, and this month's
// usage per day and per meter, recorded plus still pending.
func (r *Reader) For(ctx context.Context, p catalog.Principal) (Report, error) {
	// (the limits in the tenant's billing calendar; the daily rows below
	// are the ledger's UTC days)
	d, err := r.counters.PeekIn(ctx, p.Tenant.ID, p.Calendar, p.Limits, time.Time{})
	if err != nil {
		return Report{}, err
	}
	// the meter quotas' rows after the tier-wide ones, read at the same time
	mq, err := r.counters.PeekMeterQuotas(ctx, p.Tenant.ID, p.Calendar, p.Tier.MeterQuotas, d.Now)
	if err != nil {
		return Report{}, err
	}
	d.Limits = append(d.Limits, mq...)
	// the spend cap, in cents, last
	sc, ok, err := r.counters.PeekSpendCap(ctx, quota.Request{TenantID: p.Tenant.ID, Calendar: p.Calendar, Limits: p.Limits,
		Overage: p.Tier.Overage, OveragePriceCentsPer1K: p.Tier.OveragePriceCentsPer1K, MeterQuotas: p.Tier.MeterQuotas}, d.Now)
	if err != nil {
		return Report{}, err
	}
	if ok {
		d.Limits = append(d.Limits, sc)
	}
	// a prepaid tenant's credit, in cents, after it
	if p.Tier.IsPrepaid() && r.prepaid != nil {
		cl, err := r.credit(ctx, p, d.Now)
		if err != nil {
			return Report{}, err
		}
		d.Limits = append(d.Limits, cl)
	}
	// The billing period's usage, per local date of the tenant's calendar:
	// the ledger's UTC days for the default one, else its hours, each
	// dated by its start (in a :30 or :45 zone an hour across midnight
	// counts for the day it starts in, as invoices count it).
	from, to := p.Calendar.Period(d.Now)
	loc, granularity := time.UTC, "day"
	if !p.Calendar.IsDefault() && p.Calendar.Zone != nil {
		loc, granularity = p.Calendar.Zone, "hour"
	}
	days := map[string]*Day{}
	meters := map[string]*Meter{}
	add := func(t time.Time, meter string, c counts) {
		k := t.In(loc).Format(time.DateOnly)
		dj := days[k]
		if dj == nil {
			dj = &Day{Date: k}
			days[k] = dj
		}
		mj := meters[meter]
		if mj == nil {
			mj = &Meter{Meter: meter}
			meters[meter] = mj
		}
		dj.add(c)
		mj.add(c)
	}
	if err := r.ledger.EachUsage(ctx, p.Tenant.ID, from, to, granularity, "", func(row billing.UsageRow) error {
		add(row.PeriodStart, row.Meter, counts{row.Units, row.Requests, row.Rejected, row.ShadowRefused, row.Degraded})
		return nil
	}); err != nil {
		return Report{}, err
	}
	pending, err := r.counters.Pending(ctx, p.Tenant.ID)
	if err != nil {
		return Report{}, err
	}
	room, err := r.counters.AnswerUsage(ctx, p.Tenant.ID)
	if err != nil {
		return Report{}, err
	}
	for _, row := range pending {
		if !row.Hour.Before(from) && row.Hour.Before(to) {
			add(row.Hour, row.Meter, counts{row.Units, row.Requests, row.Rejected, row.ShadowRefused, row.Degraded})
		}
	}
	u := Report{TenantID: p.Tenant.ID, Tier: p.Tier.Slug, Limits: Limits(d), Upgrade: p.Upgrade(), monthStart: from,
		periodEnd: to, loc: loc, today: d.Now.In(loc).Format(time.DateOnly),
		Daily: make([]Day, 0, len(days)), Meters: make([]Meter, 0, len(meters)), Policies: []Policy{},
		Idempotency: IdempotencyRoom{Answers: Room{room.Answers, room.Limits.Answers}, Bytes: Room{room.Bytes, room.Limits.Bytes}}}
	for _, dj := range days {
		u.Daily = append(u.Daily, *dj)
	}
	sort.Slice(u.Daily, func(i, j int) bool { return u.Daily[i].Date < u.Daily[j].Date })
	for _, mj := range meters {
		u.Meters = append(u.Meters, *mj)
	}
	sort.Slice(u.Meters, func(i, j int) bool { return u.Meters[i].Meter < u.Meters[j].Meter })
	return u, nil
}

// MonthTotals returns the usage this month (by the reader's clock) of each
// tenant of ids, recorded plus pending: for each tenant the same sum as its
// report's daily rows, in one ledger query and one admission round trip.
func (r *Reader) MonthTotals(ctx context.Context, ids []string) (map[string]billing.Totals, error) {
	out := map[string]billing.Totals{}
	if len(ids) == 0 {
		return out, nil
	}
	from := quota.MonthStart(r.now())
	to := from.AddDate(0, 1, 0)
	recorded, err := r.ledger.TenantTotals(ctx, ids, from, to)
	if err != nil {
		return nil, err
	}
	pending, err := r.counters.PendingMany(ctx, ids)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		t := recorded[id]
		for _, row := range pending[id] {
			if !row.Hour.Before(from) && row.Hour.Before(to) {
				t.Units, t.Requests, t.Rejected = t.Units+row.Units, t.Requests+row.Requests, t.Rejected+row.Rejected
			}
		}
		out[id] = t
	}
	return out, nil
}

// credit is a prepaid tenant's quota.LimitCredit row at now: Limit the
// credit its current period's invoice may draw, in cents; Remaining what
// its admissions may still draw, in cents, rounded down (the credit less
// what the admissions of this period, and of the previous one while its
// invoice is a draft, drew, and less what older drafts hold); Reset the
// period's end.
func (r *Reader) credit(ctx context.Context, p catalog.Principal, now time.Time) (quota.LimitState, error) {
	pp, err := r.prepaid(ctx, p, now)
	if err != nil {
		return quota.LimitState{}, err
	}
	drawn, err := r.counters.PrepaidDrawn(ctx, p.Tenant.ID, *pp)
	if err != nil {
		return quota.LimitState{}, err
	}
	start, end := p.Calendar.Period(now)
	return quota.LimitState{Name: quota.LimitCredit, Limit: pp.CreditCents,
		Remaining: max(0, pp.BalanceMillicents-drawn) / 1000, Reset: end, Window: end.Sub(start)}, nil
}
