package billing

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/quota"
)

// The invoice of a batch of tenants, generated in one transaction: what
// Invoicer.Run, Refresh and Generate write (invoice.go) and the rating
// inputs they read from the ledger (Rate, invoice_rate.go, prices them).

// ratedTenant is what generateTx gathers for one tenant.
type ratedTenant struct {
	id, invoiceID string
	created       time.Time
	cal           quota.Calendar
	final         bool // the invoice becomes final now
	overrides     quota.Overrides
	current       TierSegment // the tenant's current tier, if history is missing
	in            RatingInput
	oldLines      []InvoiceLine
	lines         []InvoiceLine // rated (the prepaid balance's)
	oldTotal      int64
	oldStart      time.Time // the period stored on the invoice
	oldEnd        time.Time
	credits       creditPool
}

// generateTx regenerates the invoices labelled label of the tenants ids
// (sorted ascending), each over its own billing period of that label (see
// labelOf), for the tenants that existed during their period and whose
// period has started, in a handful of statements for the whole batch: the
// statements take each tenant's bounds, so tenants of every calendar share
// them. It first creates missing invoices and locks the draft ones in
// tenant order, so that two workers regenerating the same invoices take
// turns (and each reads the data committed before it) instead of
// deadlocking. Final invoices are left alone; drafts whose lines and
// period did not change are not rewritten; each draft becomes final once
// its own period is closable. Finalizing draws the tenants' credits (see
// CreditEntry), in the same transaction. A draft of a tenant the label no
// longer gives a started period it existed in (its calendar changed) is
// deleted.
func (i *Invoicer) generateTx(ctx context.Context, tx pgx.Tx, now, label time.Time, ids []string) error {
	bts, err := i.billedTenants(ctx, tx, ids)
	if err != nil {
		return err
	}
	return i.generateTenantsTx(ctx, tx, now, label, bts)
}

// generateTenantsTx is generateTx on tenants already read (sorted by id).
func (i *Invoicer) generateTenantsTx(ctx context.Context, tx pgx.Tx, now, label time.Time, bts []billedTenant) error {
	type bounds struct {
		start, end time.Time
		cal        quota.Calendar
	}
	period := make(map[string]bounds, len(bts))
	var keep, drop []string
	var starts, ends []time.Time
	for _, b := range bts {
		start, end := periodOf(b.cal, label)
		if !b.created.Before(end) || start.After(now) {
			drop = append(drop, b.id)
			continue
		}
		period[b.id] = bounds{start, end, b.cal}
		keep, starts, ends = append(keep, b.id), append(starts, start), append(ends, end)
	}
	if len(drop) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM invoices WHERE tenant_id = ANY($1::uuid[]) AND period = $2 AND status = 'draft'`,
			drop, label); err != nil {
			return fmt.Errorf("billing: delete invoices: %w", err)
		}
	}
	if len(keep) == 0 {
		return nil
	}

	if _, err := tx.Exec(ctx, `
		INSERT INTO invoices (tenant_id, period, period_start, period_end, created_at, updated_at)
		SELECT v.id, $2, v.s, v.e, $5, $5 FROM unnest($1::uuid[], $3::timestamptz[], $4::timestamptz[]) AS v(id, s, e)
		ORDER BY v.id
		ON CONFLICT (tenant_id, period) DO NOTHING`, keep, label, starts, ends, now); err != nil {
		return fmt.Errorf("billing: insert invoices: %w", err)
	}

	rows, err := tx.Query(ctx, `
		SELECT i.id::text, t.id::text, i.total_cents, i.period_start, i.period_end, t.created_at, t.overrides,
		       tr.slug, tr.name, tr.price_cents, tr.monthly_quota, tr.overage, tr.overage_price_cents_per_1k, tr.billing
		FROM invoices i JOIN tenants t ON t.id = i.tenant_id JOIN tiers tr ON tr.slug = t.tier
		WHERE i.tenant_id = ANY($1::uuid[]) AND i.period = $2 AND i.status = 'draft'
		ORDER BY i.tenant_id FOR UPDATE OF i`, customPlan, keep, label)
	if err != nil {
		return fmt.Errorf("billing: lock invoices: %w", err)
	}
	var ts []*ratedTenant
	byID := map[string]*ratedTenant{}
	for rows.Next() {
		t := &ratedTenant{}
		c := &t.current
		if err := rows.Scan(&t.invoiceID, &t.id, &t.oldTotal, &t.oldStart, &t.oldEnd, &t.created, &t.overrides,
			&c.Tier, &c.Name, &c.PriceCents, &c.MonthlyQuota, &c.Overage, &c.OveragePriceCentsPer1K, &c.Billing); err != nil {
			rows.Close()
			return fmt.Errorf("billing: lock invoices: %w", err)
		}
		p := period[t.id]
		t.cal = p.cal
		t.in = RatingInput{Start: p.start, End: p.end, Zone: p.cal.Zone}
		t.final = i.closable(now, p.end)
		ts = append(ts, t)
		byID[t.id] = t
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("billing: lock invoices: %w", err)
	}
	if len(ts) == 0 {
		return nil
	}
	if err := loadRatingInputs(ctx, tx, ts, byID); err != nil {
		return err
	}
	if err := loadInvoiceLines(ctx, tx, ts); err != nil {
		return err
	}
	// Credits: the finalized tenants' rows locked (in tenant order, after
	// every invoice lock), the drafts' read without locks, as before.
	var finals, drafts []*ratedTenant
	for _, t := range ts {
		if t.final {
			finals = append(finals, t)
		} else {
			drafts = append(drafts, t)
		}
	}
	if err := loadCredits(ctx, tx, finals, byID, true); err != nil {
		return err
	}
	if err := loadCredits(ctx, tx, drafts, byID, false); err != nil {
		return err
	}

	// Rate, and keep only the invoices that change.
	var (
		invIDs       []string
		totals       []int64
		statuses     []string
		finalizedAt  []*time.Time
		pStarts      []time.Time
		pEnds        []time.Time
		lines        [][]any  // invoice_lines rows, for COPY
		drawInvoices []string // the invoice of each of draws
		draws        []creditDraw
	)
	for _, t := range ts {
		start, end := t.in.Start, t.in.End
		got := t.rate()
		drawn := t.credits.draw(TotalCents(got), end)
		for _, d := range drawn {
			got = append(got, creditLine(d))
		}
		total := TotalCents(got)
		if !t.final && total == t.oldTotal && slices.Equal(got, t.oldLines) && start.Equal(t.oldStart) && end.Equal(t.oldEnd) {
			continue
		}
		status, fin := "draft", (*time.Time)(nil)
		if t.final {
			status, fin = "final", &now
			for _, d := range drawn {
				drawInvoices = append(drawInvoices, t.invoiceID)
				draws = append(draws, d)
			}
		}
		invIDs = append(invIDs, t.invoiceID)
		totals = append(totals, total)
		statuses = append(statuses, status)
		finalizedAt = append(finalizedAt, fin)
		pStarts, pEnds = append(pStarts, start), append(pEnds, end)
		for n, l := range got {
			lines = append(lines, []any{t.invoiceID, int32(n + 1), l.Kind, l.Description, l.Quantity, l.AmountCents})
		}
	}
	if len(invIDs) == 0 {
		return nil
	}

	if _, err := tx.Exec(ctx, `
		UPDATE invoices i SET total_cents = v.total, status = v.status, finalized_at = v.finalized_at,
		       period_start = v.s, period_end = v.e, updated_at = $7
		FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::timestamptz[], $5::timestamptz[], $6::timestamptz[])
		     AS v(id, total, status, finalized_at, s, e)
		WHERE i.id = v.id`,
		customPlan, invIDs, totals, statuses, finalizedAt, pStarts, pEnds, now); err != nil {
		return fmt.Errorf("billing: update invoices: %w", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM invoice_lines WHERE invoice_id = ANY($1::uuid[])`, customPlan, invIDs); err != nil {
		return fmt.Errorf("billing: delete invoice lines: %w", err)
	}
	// The lines by COPY: a batch writes a thousand or more.
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"invoice_lines"},
		[]string{"invoice_id", "line_no", "kind", "description", "quantity", "amount_cents"},
		pgx.CopyFromRows(lines)); err != nil {
		return fmt.Errorf("billing: insert invoice lines: %w", err)
	}
	return recordDraws(ctx, tx, now, drawInvoices, draws)
}

// rate returns the lines of t's invoice before credits: its rating input
// with the segments clipped to its lifetime (the current tier since its
// creation when it has no tier history) and its overrides applied, rated.
func (t *ratedTenant) rate() []InvoiceLine {
	start, end := t.in.Start, t.in.End
	t.in.Segments = clipToLifetime(t.in.Segments, t.created, start, end)
	if len(t.in.Segments) == 0 { // no history: the current tier since creation
		c := t.current
		c.From, c.To = t.created, end
		t.in.Segments = clipToLifetime([]TierSegment{c}, t.created, start, end)
	}
	for k := range t.in.Segments {
		s := &t.in.Segments[k]
		s.MonthlyQuota = t.overrides.Apply(quota.Limits{MonthlyQuota: s.MonthlyQuota}).MonthlyQuota
	}
	return Rate(t.in)
}

// loadRatingInputs fills the rating inputs of the tenants ts (also indexed
// by id), each for its period [in.Start, in.End). Every statement takes the tenants' bounds as arrays beside
// their ids, so one batch needs the same statements whatever its calendars.
//
// Usage is kept in hourly UTC buckets (usage.hour): a bucket counts in the
// period that contains its start. A period starting at a whole hour, as in
// every zone whose offset is whole hours (nearly all), takes exactly its
// buckets; where the offset has 30 or 45 minutes (India +5:30,
// Asia/Kathmandu +5:45, Pacific/Chatham +12:45), the bucket the boundary
// cuts counts entirely in the period before: up to the first 45 minutes
// of a period's usage land on the invoice of the period before (admission
// in Redis counts the exact periods; the ledger cannot split an hour).
//
// Usage is read from usage_ledger: the hourly rows, and the months whose
// detail the retention dropped (Partitions) as one row at the month's
// first instant, so a period that month's first instant falls in gets the
// whole month.
//
// The statements that join the batch's arrays (unnest) run with plans made
// for their arguments (customPlan).
func loadRatingInputs(ctx context.Context, tx pgx.Tx, ts []*ratedTenant, byID map[string]*ratedTenant) error {
	ids := make([]string, len(ts))
	starts := make([]time.Time, len(ts))
	ends := make([]time.Time, len(ts))
	dayFrom := make([]time.Time, len(ts)) // the periods' first and next local dates, for grants
	dayTo := make([]time.Time, len(ts))
	// The batch's overall bounds, [first, last), repeat the filters on the
	// plain columns so that the planner scans the indexes by tenant and
	// time, as for one shared period; the join then keeps each tenant's.
	first, last := ts[0].in.Start, ts[0].in.End
	for k, t := range ts {
		ids[k] = t.id
		starts[k], ends[k] = t.in.Start, t.in.End
		dayFrom[k], dayTo[k] = localDate(t.cal, t.in.Start), localDate(t.cal, t.in.End)
		first, last = minTime(first, t.in.Start), maxTime(last, t.in.End)
	}

	// One row per stretch of a tier at one price: the tier history split
	// where the tier's price history changes (a stretch the price history
	// does not cover at all keeps the tier's current prices).
	var tenantID string
	var s TierSegment
	rows, err := tx.Query(ctx, `
		SELECT h.tenant_id::text, tr.slug, tr.name, coalesce(p.price_cents, tr.price_cents), tr.monthly_quota, tr.overage,
		       coalesce(p.overage_price_cents_per_1k, tr.overage_price_cents_per_1k),
		       greatest(h.valid_from, coalesce(p.valid_from, h.valid_from)),
		       least(coalesce(h.valid_to, b.pe), coalesce(p.valid_to, b.pe), b.pe), tr.meter_quotas, tr.billing
		FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[]) AS b(tenant_id, ps, pe)
		JOIN tenant_tier_history h ON h.tenant_id = b.tenant_id
		JOIN tiers tr ON tr.slug = h.tier
		LEFT JOIN tier_prices p ON p.tier = h.tier
		  AND p.valid_from < least(coalesce(h.valid_to, b.pe), b.pe) AND (p.valid_to IS NULL OR p.valid_to > greatest(h.valid_from, b.ps))
		WHERE h.tenant_id = ANY($1::uuid[]) AND h.valid_from < $5 AND (h.valid_to IS NULL OR h.valid_to > $4)
		  AND h.valid_from < b.pe AND (h.valid_to IS NULL OR h.valid_to > b.ps)
		ORDER BY h.tenant_id, 8`, customPlan, ids, starts, ends, first, last)
	if err != nil {
		return fmt.Errorf("billing: tier history: %w", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&tenantID, &s.Tier, &s.Name, &s.PriceCents, &s.MonthlyQuota, &s.Overage,
		&s.OveragePriceCentsPer1K, &s.From, &s.To, &s.MeterQuotas, &s.Billing}, func() error {
		t := byID[tenantID]
		t.in.Segments = append(t.in.Segments, s)
		s.MeterQuotas = nil // (a scan into the same slice would overwrite this one's)
		return nil
	})
	if err != nil {
		return fmt.Errorf("billing: tier history: %w", err)
	}

	// The period's units and overage units, and each meter's units past
	// its meter quota (usage.meter_overage_units), in one pass over the
	// usage: a row per tenant (meter NULL) with its totals, then a row per
	// meter of it.
	var meter *string
	var units, overage, meterOverage int64
	rows, err = tx.Query(ctx, `
		SELECT u.tenant_id::text, u.meter, sum(u.units)::bigint, sum(u.overage_units)::bigint, sum(u.meter_overage_units)::bigint
		FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[]) AS b(tenant_id, ps, pe)
		JOIN usage_ledger u ON u.tenant_id = b.tenant_id AND u.hour >= b.ps AND u.hour < b.pe
		WHERE u.tenant_id = ANY($1::uuid[]) AND u.hour >= $4 AND u.hour < $5
		GROUP BY GROUPING SETS ((u.tenant_id), (u.tenant_id, u.meter))
		ORDER BY u.tenant_id, u.meter NULLS FIRST`, customPlan, ids, starts, ends, first, last)
	if err != nil {
		return fmt.Errorf("billing: usage: %w", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&tenantID, &meter, &units, &overage, &meterOverage}, func() error {
		t := byID[tenantID]
		if meter == nil {
			t.in.Units, t.in.OverageUnits = units, overage
		} else if meterOverage > 0 {
			t.in.MeterOverage = append(t.in.MeterOverage, MeterOverage{Meter: *meter, Units: meterOverage})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("billing: usage: %w", err)
	}

	var g InvoiceGrant
	rows, err = tx.Query(ctx, `
		SELECT g.tenant_id::text, g.period, g.period_start, g.units
		FROM unnest($1::uuid[], $2::date[], $3::date[]) AS b(tenant_id, df, dt)
		JOIN grants g ON g.tenant_id = b.tenant_id
		  AND ((g.period = 'month' AND g.period_start = b.df) OR (g.period = 'day' AND g.period_start >= b.df AND g.period_start < b.dt))
		WHERE g.tenant_id = ANY($1::uuid[])
		ORDER BY g.tenant_id, g.period_start, g.period DESC, g.created_at, g.id`, customPlan, ids, dayFrom, dayTo)
	if err != nil {
		return fmt.Errorf("billing: grants: %w", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&tenantID, &g.Period, &g.PeriodStart, &g.Units}, func() error {
		t := byID[tenantID]
		t.in.Grants = append(t.in.Grants, g)
		return nil
	})
	if err != nil {
		return fmt.Errorf("billing: grants: %w", err)
	}

	return nil
}

// loadInvoiceLines reads the current lines of the invoices of ts.
func loadInvoiceLines(ctx context.Context, tx pgx.Tx, ts []*ratedTenant) error {
	invIDs := make([]string, len(ts))
	byInvoice := make(map[string]*ratedTenant, len(ts))
	for k, t := range ts {
		invIDs[k] = t.invoiceID
		byInvoice[t.invoiceID] = t
	}
	var invoiceID string
	var l InvoiceLine
	rows, err := tx.Query(ctx, `
		SELECT invoice_id::text, kind, description, quantity, amount_cents FROM invoice_lines
		WHERE invoice_id = ANY($1::uuid[]) ORDER BY invoice_id, line_no`, customPlan, invIDs)
	if err != nil {
		return fmt.Errorf("billing: invoice lines: %w", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&invoiceID, &l.Kind, &l.Description, &l.Quantity, &l.AmountCents}, func() error {
		t := byInvoice[invoiceID]
		t.oldLines = append(t.oldLines, l)
		return nil
	})
	if err != nil {
		return fmt.Errorf("billing: invoice lines: %w", err)
	}
	return nil
}

// clipToLifetime clips segments to [start, end) and to the tenant's life from
// created, dropping what is left empty.
func clipToLifetime(segs []TierSegment, created, start, end time.Time) []TierSegment {
	from := start
	if created.After(from) {
		from = created
	}
	out := segs[:0]
	for _, s := range segs {
		if s.From.Before(from) {
			s.From = from
		}
		if s.To.After(end) {
			s.To = end
		}
		if s.To.After(s.From) {
			out = append(out, s)
		}
	}
	return out
}
