package httpapi

import (
	"context"
	"sort"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/quota"
)

// LimitJSON is one limit as /v1/usage and /v1/check show it.
type LimitJSON struct {
	Name          quota.LimitName `json:"name"`
	Limit         int64           `json:"limit"`
	Remaining     int64           `json:"remaining"`
	Reset         string          `json:"reset"`
	WindowSeconds int64           `json:"window_seconds"`
}

func limitsJSON(d quota.Decision) []LimitJSON {
	out := make([]LimitJSON, 0, len(d.Limits))
	for _, l := range d.Limits {
		out = append(out, LimitJSON{Name: l.Name, Limit: l.Limit, Remaining: l.Remaining,
			Reset: resetTime(l.Reset).Format(time.RFC3339), WindowSeconds: windowSeconds(l.Window)})
	}
	return out
}

// DayJSON is one day of /v1/usage.
type DayJSON struct {
	Date     string `json:"date"`
	Units    int64  `json:"units"`
	Requests int64  `json:"requests"`
	Rejected int64  `json:"rejected"`
}

// MeterJSON is one meter's usage this month in /v1/usage.
type MeterJSON struct {
	Meter    string `json:"meter"`
	Units    int64  `json:"units"`
	Requests int64  `json:"requests"`
	Rejected int64  `json:"rejected"`
}

// UsageJSON is the body of GET /v1/usage (and of the admin's
// GET /admin/v1/tenants/{id}/summary).
type UsageJSON struct {
	TenantID string         `json:"tenant_id"`
	Tier     string         `json:"tier"`
	Limits   []LimitJSON    `json:"limits"`
	Daily    []DayJSON      `json:"daily"`
	Meters   []MeterJSON    `json:"meters"`
	Upgrade  *quota.Upgrade `json:"upgrade"`

	monthStart time.Time // the month of Daily and Meters, by Redis time
	today      string    // the date the limits were read on (Redis time)
}

// Today is today's row of Daily (zero when nothing was used today).
func (u UsageJSON) Today() DayJSON {
	for _, d := range u.Daily {
		if d.Date == u.today {
			return d
		}
	}
	return DayJSON{Date: u.today}
}

// Month sums the daily rows: the month's usage so far.
func (u UsageJSON) Month() billing.Totals {
	var t billing.Totals
	for _, d := range u.Daily {
		t.Units += d.Units
		t.Requests += d.Requests
		t.Rejected += d.Rejected
	}
	return t
}

// Limit returns the named limit and whether it is active.
func (u UsageJSON) Limit(name quota.LimitName) (LimitJSON, bool) {
	for _, l := range u.Limits {
		if l.Name == name {
			return l, true
		}
	}
	return LimitJSON{}, false
}

// usage answers the caller's own usage.
func (s *Server) usage(c *fiber.Ctx) error {
	u, err := s.usageFor(c.UserContext(), principalOf(c))
	if err != nil {
		return err
	}
	return c.JSON(u)
}

// usageFor is a tenant's usage as /v1/usage, the admin summary and both
// dashboards show it: its limits as they stand (read from Redis without
// consuming anything), and this month's usage per day and per meter, flushed
// (Postgres) plus still pending (Redis).
func (s *Server) usageFor(ctx context.Context, p catalog.Principal) (UsageJSON, error) {
	d, err := s.limits.Peek(ctx, p.Tenant.ID, p.Limits, time.Time{})
	if err != nil {
		return UsageJSON{}, err
	}
	from := quota.MonthStart(d.Now)
	to := from.AddDate(0, 1, 0)
	days := map[string]*DayJSON{}
	meters := map[string]*MeterJSON{}
	add := func(t time.Time, meter string, units, requests, rejected int64) {
		k := t.UTC().Format(time.DateOnly)
		dj := days[k]
		if dj == nil {
			dj = &DayJSON{Date: k}
			days[k] = dj
		}
		mj := meters[meter]
		if mj == nil {
			mj = &MeterJSON{Meter: meter}
			meters[meter] = mj
		}
		dj.Units, dj.Requests, dj.Rejected = dj.Units+units, dj.Requests+requests, dj.Rejected+rejected
		mj.Units, mj.Requests, mj.Rejected = mj.Units+units, mj.Requests+requests, mj.Rejected+rejected
	}
	if err := s.ledger.EachUsage(ctx, p.Tenant.ID, from, to, "day", "", func(r billing.UsageRow) error {
		add(r.PeriodStart, r.Meter, r.Units, r.Requests, r.Rejected)
		return nil
	}); err != nil {
		return UsageJSON{}, err
	}
	pending, err := s.limits.Pending(ctx, p.Tenant.ID)
	if err != nil {
		return UsageJSON{}, err
	}
	for _, r := range pending {
		if !r.Hour.Before(from) && r.Hour.Before(to) {
			add(r.Hour, r.Meter, r.Units, r.Requests, r.Rejected)
		}
	}
	u := UsageJSON{TenantID: p.Tenant.ID, Tier: p.Tier.Slug, Limits: limitsJSON(d), Upgrade: p.Upgrade, monthStart: from,
		today: d.Now.UTC().Format(time.DateOnly),
		Daily: make([]DayJSON, 0, len(days)), Meters: make([]MeterJSON, 0, len(meters))}
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

// monthTotals returns the usage this month (by the API node's clock) of each
// tenant of ids, flushed plus pending: for each tenant the same sum as its
// usageFor's daily rows, in one Postgres query and one Redis round trip.
func (s *Server) monthTotals(ctx context.Context, ids []string) (map[string]billing.Totals, error) {
	out := map[string]billing.Totals{}
	if len(ids) == 0 {
		return out, nil
	}
	from := quota.MonthStart(s.now())
	to := from.AddDate(0, 1, 0)
	flushed, err := s.ledger.TenantTotals(ctx, ids, from, to)
	if err != nil {
		return nil, err
	}
	pending, err := s.limits.PendingMany(ctx, ids)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		t := flushed[id]
		for _, r := range pending[id] {
			if !r.Hour.Before(from) && r.Hour.Before(to) {
				t.Units, t.Requests, t.Rejected = t.Units+r.Units, t.Requests+r.Requests, t.Rejected+r.Rejected
			}
		}
		out[id] = t
	}
	return out, nil
}

// invoices answers the caller's own invoices.
func (s *Server) invoices(c *fiber.Ctx) error {
	p := principalOf(c)
	items, err := s.ledger.TenantInvoices(c.UserContext(), p.Tenant.ID)
	if err != nil {
		return err
	}
	return c.JSON(fiber.Map{"items": items, "next_cursor": nil})
}

// CheckRequest is the body of POST /v1/check.
type CheckRequest struct {
	APIKey         string `json:"api_key"`
	TenantID       string `json:"tenant_id"`
	Meter          string `json:"meter"`
	Cost           *int64 `json:"cost"`
	DryRun         bool   `json:"dry_run"`
	IdempotencyKey string `json:"idempotency_key"`
}

// CheckResponse is the answer of POST /v1/check.
type CheckResponse struct {
	Allowed          bool              `json:"allowed"`
	Limits           []LimitJSON       `json:"limits"`
	ViolatedPolicies []quota.LimitName `json:"violated_policies"`
	RetryAfter       *int64            `json:"retry_after"`
	Upgrade          *quota.Upgrade    `json:"upgrade"`
	Degraded         bool              `json:"degraded"`
	Replayed         bool              `json:"replayed"`
}

// check meters for backends that do not proxy through Tollgate: the service
// names the tenant (by key or id), the meter and the cost; dry_run asks
// whether it would fit without consuming anything.
func (s *Server) check(c *fiber.Ctx) error {
	if err := s.bearerAuth(c, s.serviceFail, s.opts.ServiceToken, "tollgate-service", "service token"); err != nil {
		return err
	}
	var body CheckRequest
	if err := decodeJSON(c, &body); err != nil {
		return err
	}
	var p catalog.Principal
	var err error
	switch {
	case body.APIKey != "" && body.TenantID != "":
		return quota.FieldError("tenant_id", "give api_key or tenant_id, not both")
	case body.APIKey != "":
		if p, err = s.catalog.Resolve(c.UserContext(), body.APIKey); err != nil {
			return err
		}
	case body.TenantID != "":
		if !validUUID(body.TenantID) {
			return quota.FieldError("tenant_id", "must be a tenant id (UUID)")
		}
		if p, err = s.catalog.Principal(c.UserContext(), body.TenantID); err != nil {
			return err
		}
		if p.Tenant.Status == quota.StatusSuspended {
			return quota.Errorf(quota.CodeForbidden, "tenant suspended")
		}
	default:
		return quota.FieldError("api_key", "give api_key or tenant_id")
	}
	if !validMeter(body.Meter) {
		return quota.FieldError("meter", "must be 1 to 64 of a-z 0-9 _ . -")
	}
	cost := int64(1)
	if body.Cost != nil {
		cost = *body.Cost
	}
	if cost < 1 || cost > quota.MaxQuantity {
		return quota.FieldError("cost", "must be an integer between 1 and %d", quota.MaxQuantity)
	}
	if len(body.IdempotencyKey) > maxIdempotencyKey {
		return quota.FieldError("idempotency_key", "must be at most %d characters", maxIdempotencyKey)
	}
	// A check's answer is its decision: the key's record is complete at
	// once (no lease), and the fingerprint is what the check asked.
	d, err := s.gate.Admit(c.UserContext(), quota.Request{
		TenantID: p.Tenant.ID, Meter: body.Meter, Cost: cost, Limits: p.Limits, Overage: p.Tier.Overage,
		FailOpen: p.Tier.FailOpen, DryRun: body.DryRun, IdempotencyKey: body.IdempotencyKey,
		IdempotencyFingerprint: "check " + body.Meter + " " + strconv.FormatInt(cost, 10),
	})
	if err != nil {
		return err
	}
	if err := idemRefusal(d); err != nil {
		return err
	}
	setRateLimitHeaders(c, d)
	resp := CheckResponse{Allowed: d.Allowed, Limits: limitsJSON(d), ViolatedPolicies: d.Violated,
		Upgrade: p.Upgrade, Degraded: d.Degraded, Replayed: d.Replayed()}
	if resp.ViolatedPolicies == nil {
		resp.ViolatedPolicies = []quota.LimitName{}
	}
	if !d.Allowed && d.RetryAfter >= 0 {
		secs := max(1, ceilSeconds(d.RetryAfter))
		resp.RetryAfter = &secs
	}
	return c.JSON(resp)
}

func validMeter(m string) bool {
	if len(m) < 1 || len(m) > 64 {
		return false
	}
	for i := 0; i < len(m); i++ {
		b := m[i]
		if !(b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || (i > 0 && (b == '_' || b == '.' || b == '-'))) {
			return false
		}
	}
	return true
}

func validUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if s[i] != '-' {
				return false
			}
		case !(s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'f' || s[i] >= 'A' && s[i] <= 'F'):
			return false
		}
	}
	return true
}
