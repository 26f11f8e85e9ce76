package catalog

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// grantStore is where grants are recorded (*catalogdb.Store): the record,
// made once per idempotency key, is what invoices and quota repairs read.
type grantStore interface {
	CreateGrantIdempotent(ctx context.Context, actor, tenantID, key, period string, start time.Time, units int64) (quota.Grant, bool, error)
	UnappliedGrants(ctx context.Context, dayStart, monthStart time.Time) ([]quota.Grant, error)
	MarkGrantApplied(ctx context.Context, id string) error
}

// counters applies a recorded grant to the tenant's live quota, once by its
// id (*ratelimit.Runner, in quotaredis.Store); false when the grant's period is not the current
// one there.
type counters interface {
	ApplyGrant(ctx context.Context, tenantID string, cal quota.Calendar, id, period string, start time.Time, units int64) (bool, error)
}

// Grants adds units to tenants' current day or month: recorded in the store
// (for invoices and quota repair), applied to the live counter (so that the
// remaining quota and the headers show it on the next request), and the
// tenant's refusals cached on every node lifted. The API, the console and the
// worker's grants step all grant through it, on its one clock.
type Grants struct {
	store    grantStore
	counters counters
	cat      *Catalog
	now      func() time.Time
	log      *slog.Logger
}

// NewGrants returns the grants of store applied to counters; cat publishes
// the room a grant makes.
func NewGrants(store grantStore, counters counters, cat *Catalog, now func() time.Time, log *slog.Logger) *Grants {
	return &Grants{store: store, counters: counters, cat: cat, now: now, log: log}
}

// Create grants units for the tenant's current period ("day" or "month" of
// its billing calendar: the grant's period start is the period's first
// local date).
// Redis failing is no error: the grant is recorded as not applied, and
// ApplyMissed (the worker's grants step) applies it. Under an idempotency key
// a repeat returns the grant first recorded (created false), applying it if
// it is not yet.
func (g *Grants) Create(ctx context.Context, actor, tenantID, key, period string, units int64) (gr quota.Grant, created bool, err error) {
	if err := CheckGrant(period, units); err != nil {
		return gr, false, err
	}
	cal, err := g.cat.Calendar(ctx, tenantID)
	if err != nil && quota.ErrorCode(err) != quota.CodeNotFound {
		return gr, false, err
	}
	start := periodDate(cal, period, g.now())
	gr, created, err = g.store.CreateGrantIdempotent(ctx, actor, tenantID, key, period, start, units)
	if err != nil || gr.Applied {
		return gr, created, err
	}
	if gr, err = g.apply(ctx, gr); err != nil {
		g.log.Warn("grant recorded but not applied; the worker's grants step will apply it",
			"tenant_id", gr.TenantID, "grant_id", gr.ID, "err", err)
		return gr, created, nil
	}
	return gr, created, nil
}

// periodDate is the first local date of cal's period ("day" or "month")
// containing now, as midnight UTC of that date (how a grant's period start
// is recorded): for the default calendar, the UTC day's or month's start.
func periodDate(cal quota.Calendar, period string, now time.Time) time.Time {
	id := cal.DayID(now)
	if period == "month" {
		pid := cal.PeriodID(now)
		return time.Date(pid/100, time.Month(pid%100), max(cal.AnchorDay, 1), 0, 0, 0, 0, time.UTC)
	}
	return time.Unix(id*86400, 0).UTC()
}

// CheckGrant returns a field error unless period is "day" or "month" and
// units is between 1 and quota.MaxQuantity.
func CheckGrant(period string, units int64) error {
	if period != "day" && period != "month" {
		return quota.FieldError("period", `must be "day" or "month"`)
	}
	if units < 1 || units > quota.MaxQuantity {
		return quota.FieldError("units", "must be an integer between 1 and %d", quota.MaxQuantity)
	}
	return nil
}

// ApplyMissed applies the grants of the current day and month that are not
// applied yet (the live counter failed when they were made) and returns
// them. It is the worker's grants step: idempotent, and safe beside the API
// and other workers applying the same grants (a grant is added once by its
// id). Each run takes at most the store's page of them; the rest wait for
// the next.
func (g *Grants) ApplyMissed(ctx context.Context) ([]quota.Grant, error) {
	now := g.now()
	missed, err := g.store.UnappliedGrants(ctx, quota.DayStart(now), quota.MonthStart(now))
	if err != nil {
		return nil, err
	}
	var done []quota.Grant
	for _, gr := range missed {
		gr, err := g.apply(ctx, gr)
		if err != nil {
			return done, err
		}
		if gr.Applied {
			done = append(done, gr)
		}
	}
	return done, nil
}

// apply adds gr to the live counter, marks it applied and lifts the tenant's
// cached refusals. Applying a grant twice adds it once, so one applied by
// another caller meanwhile is no harm. The grant returned says whether it is
// applied: not, with a nil error, when its period is not the live counter's
// current one (it ended, or that clock is not there yet).
func (g *Grants) apply(ctx context.Context, gr quota.Grant) (quota.Grant, error) {
	start, err := time.Parse(time.DateOnly, gr.PeriodStart)
	if err != nil {
		return gr, fmt.Errorf("catalog: grant %s: period start: %w", gr.ID, err)
	}
	cal, err := g.cat.Calendar(ctx, gr.TenantID)
	if err != nil && quota.ErrorCode(err) != quota.CodeNotFound {
		return gr, err
	}
	applied, err := g.counters.ApplyGrant(ctx, gr.TenantID, cal, gr.ID, gr.Period, start, gr.Units)
	if err != nil || !applied {
		return gr, err
	}
	if err := g.store.MarkGrantApplied(ctx, gr.ID); err != nil {
		return gr, err
	}
	gr.Applied = true
	// The grant is in the counter; clearing the deny caches may fail (it
	// is logged): they hold a refusal for at most its retry time.
	g.cat.invalidate(ctx, KindRoom, gr.TenantID)
	return gr, nil
}
