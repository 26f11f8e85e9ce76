package billing

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/quota"
)

// calendarRecords are what Repair restores for the tenants whose billing
// calendar is not the default (anchor 1, UTC): the units of their local
// day and billing period at now, from the ledger (and the period's
// overage units), and the applied grants of those periods (recorded under the period's first local date, as
// catalog.Grants records them). Usage rows are UTC hours: a day or period
// that starts off the hour (a :30 or :45 zone) misses the units of its
// first partial hour, which the restore's maximum with the pending usage
// may not make up: it repairs less, never more. The default-calendar
// tenants are Repair's own query's.
func (r *Reconciler) calendarRecords(ctx context.Context, now time.Time) ([]quota.Recorded, error) {
	rows, err := r.db.Query(ctx, `SELECT id::text, billing_anchor_day, time_zone FROM tenants
		WHERE billing_anchor_day <> 1 OR time_zone <> 'UTC' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("billing: repair: calendars: %w", err)
	}
	var (
		ids                  []string
		cals                 []quota.Calendar
		dStart, pStart, pEnd []time.Time
		dDate, pDate         []time.Time
		id, zone             string
		anchor               int
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &anchor, &zone}, func() error {
		t := quota.Tenant{BillingAnchorDay: anchor, TimeZone: zone}
		cal := t.Calendar()
		ds, _ := cal.Day(now)
		ps, pe := cal.Period(now)
		pid := cal.PeriodID(now)
		ids, cals = append(ids, id), append(cals, cal)
		dStart, pStart, pEnd = append(dStart, ds), append(pStart, ps), append(pEnd, pe)
		dDate = append(dDate, time.Unix(cal.DayID(now)*86400, 0).UTC())
		pDate = append(pDate, time.Date(pid/100, time.Month(pid%100), max(cal.AnchorDay, 1), 0, 0, 0, 0, time.UTC))
		return nil
	})
	if err != nil || len(ids) == 0 {
		if err != nil {
			err = fmt.Errorf("billing: repair: calendars: %w", err)
		}
		return nil, err
	}
	rows, err = r.db.Query(ctx, `
		SELECT b.ord::int,
		       coalesce((SELECT sum(u.units) FROM usage u WHERE u.tenant_id = b.id AND u.hour >= b.dstart AND u.hour < b.pend), 0)::bigint,
		       coalesce((SELECT sum(u.units) FROM usage u WHERE u.tenant_id = b.id AND u.hour >= b.pstart AND u.hour < b.pend), 0)::bigint,
		       coalesce((SELECT sum(u.overage_units) FROM usage u WHERE u.tenant_id = b.id AND u.hour >= b.pstart AND u.hour < b.pend), 0)::bigint,
		       coalesce((SELECT sum(g.units) FROM grants g WHERE g.tenant_id = b.id AND g.applied_at IS NOT NULL
		                 AND g.period = 'day' AND g.period_start = b.dday), 0)::bigint,
		       coalesce((SELECT sum(g.units) FROM grants g WHERE g.tenant_id = b.id AND g.applied_at IS NOT NULL
		                 AND g.period = 'month' AND g.period_start = b.pday), 0)::bigint
		FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::date[], $6::date[])
		     WITH ORDINALITY AS b(id, dstart, pstart, pend, dday, pday, ord)`,
		ids, dStart, pStart, pEnd, dDate, pDate)
	if err != nil {
		return nil, fmt.Errorf("billing: repair: calendars: %w", err)
	}
	var ord int
	var rec quota.Recorded
	var out []quota.Recorded
	_, err = pgx.ForEachRow(rows, []any{&ord, &rec.DayUnits, &rec.MonthUnits, &rec.MonthOverage, &rec.DayGrant, &rec.MonthGrant}, func() error {
		rec.TenantID, rec.Calendar = ids[ord-1], cals[ord-1]
		if rec.DayUnits != 0 || rec.MonthUnits != 0 || rec.MonthOverage != 0 || rec.DayGrant != 0 || rec.MonthGrant != 0 {
			out = append(out, rec)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("billing: repair: calendars: %w", err)
	}
	return out, nil
}

// meterRecords are the meters' units of the tenants whose tier has meter
// quotas (quota.MeterQuota), in each one's local day and billing period at
// now, with the month's units past the meter's quota and their cost at the
// quota's overage price of now (what admission counts against the spend
// cap), for Repair to give the meter quotas' counters back; by tenant id.
func (r *Reconciler) meterRecords(ctx context.Context, now time.Time) (map[string][]quota.MeterRecorded, error) {
	rows, err := r.db.Query(ctx, `SELECT DISTINCT t.id::text, t.billing_anchor_day, t.time_zone
		FROM tenants t JOIN tiers tr ON tr.slug = t.tier WHERE jsonb_array_length(tr.meter_quotas) > 0 ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("billing: repair: meters: %w", err)
	}
	var (
		ids                  []string
		dStart, pStart, pEnd []time.Time
		id, zone             string
		anchor               int
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &anchor, &zone}, func() error {
		cal := quota.Tenant{BillingAnchorDay: anchor, TimeZone: zone}.Calendar()
		ds, _ := cal.Day(now)
		ps, pe := cal.Period(now)
		ids, dStart, pStart, pEnd = append(ids, id), append(dStart, ds), append(pStart, ps), append(pEnd, pe)
		return nil
	})
	if err != nil || len(ids) == 0 {
		if err != nil {
			err = fmt.Errorf("billing: repair: meters: %w", err)
		}
		return nil, err
	}
	rows, err = r.db.Query(ctx, `
		SELECT b.id::text, m->>'meter',
		       coalesce(sum(u.units) FILTER (WHERE u.hour >= b.dstart), 0)::bigint,
		       coalesce(sum(u.units), 0)::bigint, coalesce(sum(u.meter_overage_units), 0)::bigint,
		       coalesce(sum(u.meter_overage_units) FILTER (WHERE m->>'overage' = 'bill'), 0)::bigint
		         * coalesce(max((m->>'overage_price_cents_per_1k')::bigint), 0)
		FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[]) AS b(id, dstart, pstart, pend)
		JOIN tenants t ON t.id = b.id JOIN tiers tr ON tr.slug = t.tier
		CROSS JOIN LATERAL jsonb_array_elements(tr.meter_quotas) AS m
		LEFT JOIN usage u ON u.tenant_id = b.id AND u.meter = m->>'meter' AND u.hour >= b.pstart AND u.hour < b.pend
		GROUP BY b.id, m->>'meter'`, ids, dStart, pStart, pEnd)
	if err != nil {
		return nil, fmt.Errorf("billing: repair: meters: %w", err)
	}
	out := map[string][]quota.MeterRecorded{}
	var m quota.MeterRecorded
	_, err = pgx.ForEachRow(rows, []any{&id, &m.Meter, &m.DayUnits, &m.MonthUnits, &m.MonthOverage, &m.OverageMillicents}, func() error {
		if m.MonthUnits != 0 {
			out[id] = append(out[id], m)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("billing: repair: meters: %w", err)
	}
	return out, nil
}

// prepaidRecords are the credit draws of the tenants on prepaid tiers by
// the ledger, in each one's billing period at now and the one before: the
// month's overage units at the tier's overage price and each meter's
// overage units at its quota's price, both of now (as admit.lua counts
// them), in millicents. Tenants without such units in either period are
// left out.
func (r *Reconciler) prepaidRecords(ctx context.Context, now time.Time) ([]quota.PrepaidRecorded, error) {
	rows, err := r.db.Query(ctx, `SELECT t.id::text, t.billing_anchor_day, t.time_zone
		FROM tenants t JOIN tiers tr ON tr.slug = t.tier WHERE tr.billing = 'prepaid' ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("billing: repair: prepaid: %w", err)
	}
	var (
		recs               []quota.PrepaidRecorded
		ids                []string
		pStart, pMid, pEnd []time.Time
		id, zone           string
		anchor             int
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &anchor, &zone}, func() error {
		cal := quota.Tenant{BillingAnchorDay: anchor, TimeZone: zone}.Calendar()
		ps, pe := cal.Period(now)
		pps, _ := cal.Period(ps.Add(-time.Nanosecond))
		recs = append(recs, quota.PrepaidRecorded{TenantID: id, Period: cal.PeriodID(now), Prev: cal.PeriodID(pps), Until: pe})
		ids, pStart, pMid, pEnd = append(ids, id), append(pStart, pps), append(pMid, ps), append(pEnd, pe)
		return nil
	})
	if err != nil || len(ids) == 0 {
		if err != nil {
			err = fmt.Errorf("billing: repair: prepaid: %w", err)
		}
		return nil, err
	}
	rows, err = r.db.Query(ctx, `
		SELECT b.id::text,
		       coalesce(sum(u.overage_units * tr.overage_price_cents_per_1k
		                    + u.meter_overage_units * coalesce(mp.price, 0)) FILTER (WHERE u.hour >= b.mid), 0)::bigint,
		       coalesce(sum(u.overage_units * tr.overage_price_cents_per_1k
		                    + u.meter_overage_units * coalesce(mp.price, 0)) FILTER (WHERE u.hour < b.mid), 0)::bigint
		FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[]) AS b(id, start, mid, pend)
		JOIN tenants t ON t.id = b.id JOIN tiers tr ON tr.slug = t.tier
		JOIN usage u ON u.tenant_id = b.id AND u.hour >= b.start AND u.hour < b.pend
		LEFT JOIN LATERAL (SELECT (m->>'overage_price_cents_per_1k')::bigint AS price
		                   FROM jsonb_array_elements(tr.meter_quotas) AS m
		                   WHERE m->>'meter' = u.meter AND m->>'overage' = 'bill') mp ON true
		GROUP BY b.id`, ids, pStart, pMid, pEnd)
	if err != nil {
		return nil, fmt.Errorf("billing: repair: prepaid: %w", err)
	}
	drawn := map[string][2]int64{}
	var cur, prev int64
	_, err = pgx.ForEachRow(rows, []any{&id, &cur, &prev}, func() error {
		drawn[id] = [2]int64{cur, prev}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("billing: repair: prepaid: %w", err)
	}
	out := recs[:0]
	for _, rec := range recs {
		if d, ok := drawn[rec.TenantID]; ok && (d[0] > 0 || d[1] > 0) {
			rec.Millicents, rec.PrevMillicents = d[0], d[1]
			out = append(out, rec)
		}
	}
	return out, nil
}
