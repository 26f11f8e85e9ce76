package billing

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/quota"
)

// Invoices and billing calendars (issue 15, point 2).
//
// A tenant's invoices follow its quota.Calendar: each covers one of its
// billing periods, from local midnight of the anchor day to that of the
// next month, as UTC instants (invoices.period_start, period_end). The
// invoice keeps a label, invoices.period: the first day of the month the
// period is named after, which is the month of the period's first local
// date (quota.Calendar.PeriodID, the id admission counts the month under
// and grants record). For the default calendar the label is the UTC month
// itself and the period that month, as before calendars. For anchor 1 east
// of UTC the period starts on the last UTC day of the month before its
// label (Pacific/Auckland's November starts 2026-10-31 11:00 UTC).

// labelOf returns the label of cal's period containing t: the first day,
// UTC midnight, of the month its anchor day is in.
func labelOf(cal quota.Calendar, t time.Time) time.Time {
	if cal.IsDefault() {
		return quota.MonthStart(t)
	}
	pid := cal.PeriodID(t)
	return time.Date(pid/100, time.Month(pid%100), 1, 0, 0, 0, 0, time.UTC)
}

// periodOf returns cal's billing period labelled label (any instant of the
// label's month), [start, end) as UTC instants. It is the period of an
// instant inside the anchor day, the local noon: never in a DST gap (they
// are an hour or two around midnight or 02:00), unlike the local midnight
// time.Date would be asked for, which it moves to an hour before or after
// depending on the zone (see quota.Calendar).
func periodOf(cal quota.Calendar, label time.Time) (start, end time.Time) {
	label = quota.MonthStart(label)
	if cal.IsDefault() {
		return label, label.AddDate(0, 1, 0)
	}
	loc := cal.Zone
	if loc == nil {
		loc = time.UTC
	}
	return cal.Period(time.Date(label.Year(), label.Month(), min(max(cal.AnchorDay, 1), quota.MaxAnchorDay), 12, 0, 0, 0, loc))
}

// localDate returns the local date of t in cal as midnight UTC of that
// date: how grants record the first date of their day or period.
func localDate(cal quota.Calendar, t time.Time) time.Time {
	return time.Unix(cal.DayID(t)*86400, 0).UTC()
}

// billedTenant is a tenant's calendar and lifetime, as invoicing reads them.
type billedTenant struct {
	id      string
	created time.Time
	cal     quota.Calendar
}

// billedTenants returns the tenants ids (sorted by id) that exist, with
// their calendars. A zone that does not load (the API validates it on
// every write) is an error rather than a guess: an invoice over the wrong
// period is worse than a late one.
func (i *Invoicer) billedTenants(ctx context.Context, tx pgx.Tx, ids []string) ([]billedTenant, error) {
	rows, err := tx.Query(ctx, `
		SELECT id::text, created_at, billing_anchor_day, time_zone FROM tenants
		WHERE id = ANY($1::uuid[]) ORDER BY tenants.id`, customPlan, ids)
	if err != nil {
		return nil, fmt.Errorf("billing: tenant calendars: %w", err)
	}
	var out []billedTenant
	var b billedTenant
	var zone string
	_, err = pgx.ForEachRow(rows, []any{&b.id, &b.created, &b.cal.AnchorDay, &zone}, func() error {
		loc, err := quota.LoadZone(zone)
		if err != nil {
			return fmt.Errorf("tenant %s: time zone %q: %w", b.id, zone, err)
		}
		b.cal.Zone = loc
		out = append(out, b)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("billing: tenant calendars: %w", err)
	}
	return out, nil
}

// generateCurrent regenerates, in one transaction, the draft of each
// tenant of ids (sorted) for its billing period containing now: the
// current UTC month's for the default calendar, the previous label's for
// a tenant anchored on the 15th early in a month. For an anchored tenant
// it also makes sure the invoice of its previous period exists: one
// created in the last minutes of a period, before any sweep saw it, would
// otherwise never be billed for them (the default calendar's closing
// creates those, as before). Labels are handled in ascending order, and
// tenants in id order within each, so that every caller locks invoices in
// one order.
func (i *Invoicer) generateCurrent(ctx context.Context, now time.Time, ids []string) error {
	return pgx.BeginFunc(ctx, i.db, func(tx pgx.Tx) error {
		ts, err := i.billedTenants(ctx, tx, ids)
		if err != nil {
			return err
		}
		byID := make(map[string]billedTenant, len(ts))
		cur := map[time.Time][]string{}
		type ensure struct {
			ids          []string
			starts, ends []time.Time
		}
		prev := map[time.Time]*ensure{}
		for _, t := range ts {
			byID[t.id] = t
			l := labelOf(t.cal, now)
			cur[l] = append(cur[l], t.id)
			if t.cal.IsDefault() {
				continue
			}
			start, _ := t.cal.Period(now)
			pl := labelOf(t.cal, start.Add(-time.Second))
			ps, pe := periodOf(t.cal, pl)
			if !t.created.Before(pe) {
				continue
			}
			e := prev[pl]
			if e == nil {
				e = &ensure{}
				prev[pl] = e
			}
			e.ids, e.starts, e.ends = append(e.ids, t.id), append(e.starts, ps), append(e.ends, pe)
		}
		var labels []time.Time
		for l := range cur {
			labels = append(labels, l)
		}
		for l := range prev {
			if _, ok := cur[l]; !ok {
				labels = append(labels, l)
			}
		}
		slices.SortFunc(labels, time.Time.Compare)
		for _, l := range labels {
			gen := cur[l]
			if e := prev[l]; e != nil {
				rows, err := tx.Query(ctx, `
					INSERT INTO invoices (tenant_id, period, period_start, period_end, created_at, updated_at)
					SELECT v.id, $2, v.s, v.e, $5, $5 FROM unnest($1::uuid[], $3::timestamptz[], $4::timestamptz[]) AS v(id, s, e)
					ORDER BY v.id
					ON CONFLICT (tenant_id, period) DO NOTHING RETURNING tenant_id::text`, e.ids, l, e.starts, e.ends, now)
				if err != nil {
					return fmt.Errorf("billing: insert previous invoices: %w", err)
				}
				added, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					return fmt.Errorf("billing: insert previous invoices: %w", err)
				}
				if len(added) > 0 {
					gen = append(gen, added...)
					slices.Sort(gen)
				}
			}
			if len(gen) == 0 {
				continue
			}
			bts := make([]billedTenant, len(gen))
			for k, id := range gen {
				bts[k] = byID[id]
			}
			if err := i.generateTenantsTx(ctx, tx, now, l, bts); err != nil {
				return err
			}
		}
		return nil
	})
}

// closeDue finalizes the drafts whose own period is closable at now (its
// end plus the grace has passed, and FlushedThrough has reached its end),
// found by the period end stored on them, label by label, of the tenants
// it Owns, within the budget *left, resuming where the last call stopped.
// This is how anchored tenants' invoices close, each when its period is
// over (the default calendar's close with their month, in
// closeMonth, as before; those are final by now). A draft whose period
// the tenant's calendar now puts elsewhere is regenerated over that period
// and stays a draft if it is not over. It reports whether it got through.
func (i *Invoicer) closeDue(ctx context.Context, now time.Time, left *int) (bool, error) {
	cutoff := now.Add(-i.grace)
	if i.FlushedThrough != nil {
		if f := i.FlushedThrough(); f.Before(cutoff) {
			cutoff = f
		}
	}
	rows, err := i.db.Query(ctx, `SELECT DISTINCT period FROM invoices WHERE status = 'draft' AND period_end <= $1 ORDER BY period`, cutoff)
	if err != nil {
		return false, fmt.Errorf("billing: due invoices: %w", err)
	}
	labels, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		return false, fmt.Errorf("billing: due invoices: %w", err)
	}
	for _, l := range labels {
		l = l.UTC()
		after, ok := i.dueAfter[l.Unix()]
		if !ok {
			after = firstTenantID
		}
		drafts := func(after string, limit int) ([]string, error) {
			return i.tenantBatch(ctx, `
				SELECT tenant_id::text FROM invoices
				WHERE status = 'draft' AND period = $1 AND period_end <= $2 AND tenant_id > $3::uuid
				ORDER BY invoices.tenant_id LIMIT $4`, l, cutoff, after, limit)
		}
		done, err := i.walk(ctx, &after, left, drafts, nil, func(ids []string) error {
			return pgx.BeginFunc(ctx, i.db, func(tx pgx.Tx) error { return i.generateTx(ctx, tx, now, l, ids) })
		})
		i.dueAfter = resumeAt(i.dueAfter, l, after, done)
		if err != nil || !done {
			return false, err
		}
	}
	return true, nil
}
