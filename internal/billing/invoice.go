package billing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/quota"
)

// Invoicer keeps every tenant's invoice of its current billing period
// current as a draft, and finalizes each past period's once its grace is
// over. A final invoice never changes again.
//
// Billing calendars (issue 15, point 2; see anchors.go):
//
//   - Each invoice covers the tenant's billing period (quota.Calendar:
//     local midnight of the anchor day in its zone to that of the next
//     month), stored as period_start and period_end. invoices.period is a
//     label, the first of the month of the period's first local date (the
//     month admission's period id and a month grant name); so (tenant,
//     label) stays unique and ?period=YYYY-MM lists a label. For the default
//     calendar (anchor 1 in UTC) label and period are the UTC month, and
//     every invoice is what it was before calendars.
//   - Every rating statement takes the tenants' bounds as arrays beside
//     their ids, so a batch of any mix of calendars costs what a batch of
//     default tenants does: no grouping by period, no extra statements.
//   - The subscription is prorated over the period's seconds: a period
//     across a DST change, an hour shorter or longer, costs the full price
//     when whole, and a part of it its share of the period's true length.
//   - Usage is in hourly UTC buckets, each counted in the period its start
//     is in (see loadRatingInputs): exact where offsets are whole hours;
//     with a :30 or :45 offset up to the first 45 minutes of a period land
//     on the invoice before. Grants count by their local dates: a month
//     grant on its period's first local date, day grants on the dates in
//     the period. Credits are those valid at the period's end.
//   - Timing is per tenant: the sweep and Refresh regenerate each tenant's
//     invoice of the period containing now (an anchored tenant's label is
//     the previous month's until its anchor day); a draft becomes final
//     when its own period's end plus the grace has passed and
//     FlushedThrough has reached that end. The default calendar's months
//     still close as one (closeMonth, with the closedThrough shortcut,
//     which only says that pass is done: anchored drafts of the label it
//     leaves open close later in closeDue, found by their stored
//     period_end, never by the shortcut). A tenant whose period of a label
//     has not started, or who did not live in it, has no invoice of it.
//   - A calendar change reshapes the drafts (their bounds are recomputed
//     on each regeneration), never a final invoice: a change in the middle
//     of a period may leave a stretch between the last final invoice and
//     the new calendar's period unbilled, or billed twice (not handled).
//
// Rating choices, where the contract is silent:
//
//   - Subscription: one line per stretch of the month the tenant spent on a
//     tier (tenant_tier_history, clipped to the month and to the tenant's
//     lifetime, so a tenant created mid-month pays from its created_at). The
//     amount is the tier's price prorated by seconds, rounded half up to the
//     cent; the lines of a month with several tiers may therefore add up to a
//     cent more or less than an exact split.
//   - Prices: each tier's prices have a history (tier_prices: a tier
//     create or a price change opens a row at its transaction's time). A
//     tier's stretch is split where its price changed, and each part is
//     prorated at the price in force then: a price change mid-month gives
//     two subscription lines, the old price up to the change and the new
//     one from it. So a change reprices a draft only from the change on,
//     and a final invoice, never regenerated, keeps its prices. A stretch
//     the history does not cover (a tier written around the store) takes
//     the tier's current price.
//   - Overage: usage.overage_units (recorded by the admission engine for bill
//     tiers past quota plus grants) are billed at the overage price in force
//     at the end of the month (from the price history) of the tier in force
//     then, rounded up to the cent.
//     If that tier does not bill overage (a downgrade to a block tier), the
//     overage price in force at the end of the latest billing tier's stretch
//     is used instead, so a downgrade on the last day cannot wipe out the
//     month's overage charges. Whether a tier bills overage has no history:
//     its current setting is used.
//   - Included: the month's units with the monthly quota of the tier in force
//     at month end, after the tenant's overrides (overrides have no history
//     either: the current ones are used).
//   - Grants are listed at amount 0: shown, not charged.
//   - Credits: prepaid credit valid at the month's end (granted before it,
//     not expired before it) is drawn, oldest expiring first, as negative
//     "Credit: <reason>" lines after the others, never below a total of
//     zero; drafts show the draws they would make, finalization records
//     them, exactly once (see CreditEntry). A prepaid tenant's balance is
//     computed by the same rating and the same draws (Ledger.Prepaid).
//
// Run is one idempotent step of the worker; Generate recomputes one invoice.
type Invoicer struct {
	// TenantsPerRun bounds the tenants one Run regenerates, to keep a worker
	// cycle short; 0 means DefaultTenantsPerRun. Set it before the first Run.
	TenantsPerRun int

	db    *pgxpool.Pool
	now   func() time.Time
	grace time.Duration
	batch int // tenants per transaction

	mu sync.Mutex // one Run at a time; guards the fields below
	// sweepMonth and sweepAfter let a Run stopped by its budget or its
	// context resume the current month's sweep where it stopped.
	sweepMonth time.Time
	sweepAfter string
	// closedThrough is the latest month this Invoicer has seen fully final;
	// closing is skipped until the next month ends.
	closedThrough time.Time

	// FullSweepEvery spaces the current month's sweeps over every tenant:
	// zero sweeps (within the budget) on every Run. Between sweeps the
	// worker keeps drafts current with Refresh, for the tenants whose usage
	// it just flushed, so that a cycle's work grows with the active tenants;
	// the sweeps catch what Refresh does not see (tier changes, grants).
	FullSweepEvery time.Duration
	sweepStarted   time.Time

	// FlushedThrough, when set, holds finalization back until no usage
	// counted before the month's end can still be waiting in Redis: a month
	// is finalized only once it returns a time at or after the month's end.
	// NewCycle sets it to its Reconciler's FlushedThrough, so that a flush
	// that fails, or a batch stuck in flight, keeps the month's invoices
	// drafts however long the grace. Nil finalizes on the grace alone.
	FlushedThrough func() time.Time
}

// closable reports whether the month ending at end may be finalized at
// now: its grace has passed and all usage counted before end is in the
// ledger, as far as FlushedThrough knows.
func (i *Invoicer) closable(now, end time.Time) bool {
	return !now.Before(end.Add(i.grace)) && (i.FlushedThrough == nil || !i.FlushedThrough().Before(end))
}

// DefaultTenantsPerRun is the tenants one Run regenerates unless
// Invoicer.TenantsPerRun says otherwise: about a second of work.
const DefaultTenantsPerRun = 10_000

// invoiceBatch bounds the tenants, and so the rows, one transaction handles.
const invoiceBatch = 500

// customPlan, passed as a statement's first argument, has Postgres plan it
// for its arguments on every execution (an unnamed prepared statement)
// rather than reuse a generic plan, for the batch statements: a generic
// plan takes an unnest of the batch's arrays for 10 rows and joins it in a
// nested loop, rescanning it for each row (about 80 ms rather than 10 for
// the tier history of 500 tenants), and one made while a month's invoices
// were few keeps scanning them whole as they grow by thousands a second
// (faster than their statistics follow); a custom plan sees the tables'
// current sizes.
const customPlan = pgx.QueryExecModeCacheDescribe

// firstTenantID sorts before every tenant id: the start of a keyset sweep.
const firstTenantID = "00000000-0000-0000-0000-000000000000"

// NewInvoicer returns an Invoicer on db that reads the time from now and
// finalizes a month once now >= month end + grace (a negative grace is 0)
// and FlushedThrough, if set, has passed the month's end. The grace leaves
// late usage (refunds, settlements) time to arrive.
func NewInvoicer(db *pgxpool.Pool, now func() time.Time, grace time.Duration) *Invoicer {
	return &Invoicer{db: db, now: now, grace: max(grace, 0), batch: invoiceBatch}
}

// Run is one idempotent worker step. First it closes past months: once the
// previous month's end plus the grace has passed, and the usage counted
// before its end is flushed (FlushedThrough), every tenant that existed
// during it gets its invoice regenerated a last time and finalized; earlier
// months that still have drafts (a worker that was down) are closed the same
// way (for a tenant on another calendar, "finalized" once its own period
// of the month's label is over: see closeDue). Then it finalizes every
// draft whose own period's end plus the grace has passed (closeDue), and
// regenerates every tenant's draft of its billing period containing now
// (the current month's for the default calendar; see generateCurrent).
//
// Tenants are handled in keyset-paginated batches of 500, each in its own
// transaction, so memory stays bounded however many tenants there are; an
// invoice whose content did not change is not rewritten. One Run handles at
// most TenantsPerRun tenants (closing first, then the current month's
// sweep); the next Run carries on where it stopped, as it does after a Run
// cut short by its context. A draft is therefore at most
// (tenants / TenantsPerRun) cycles old. Last, it folds the months' invoice
// sums the writes to invoices left (compactInvoiceTotals).
func (i *Invoicer) Run(ctx context.Context) (err error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	defer func() {
		if cerr := compactInvoiceTotals(ctx, i.db); err == nil {
			err = cerr
		}
	}()
	now := i.now().UTC()
	cur := quota.MonthStart(now)
	prev := cur.AddDate(0, -1, 0)
	left := i.TenantsPerRun
	if left <= 0 {
		left = DefaultTenantsPerRun
	}

	if !i.closedThrough.Equal(prev) && i.closable(now, cur) {
		rows, err := i.db.Query(ctx, `SELECT DISTINCT period FROM invoices WHERE status = 'draft' AND period < $1 ORDER BY period`, prev)
		if err != nil {
			return fmt.Errorf("billing: open months: %w", err)
		}
		months, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
		if err != nil {
			return fmt.Errorf("billing: open months: %w", err)
		}
		for _, m := range append(months, prev) {
			done, err := i.closeMonth(ctx, now, m.UTC(), &left)
			if err != nil || !done {
				return err
			}
		}
		i.closedThrough = prev
	}
	if done, err := i.closeDue(ctx, now, &left); err != nil || !done {
		return err
	}

	if !i.sweepMonth.Equal(cur) {
		i.sweepMonth, i.sweepAfter = cur, firstTenantID
	}
	if i.sweepAfter == firstTenantID { // not in the middle of a sweep
		if !i.sweepStarted.IsZero() && now.Sub(i.sweepStarted) < i.FullSweepEvery {
			return nil
		}
		i.sweepStarted = now
	}
	end := cur.AddDate(0, 1, 0)
	for left > 0 {
		// ORDER BY tenants.id, the uuid: a bare "id" would name the text
		// column selected, which no index serves with the uuid cursor (each
		// batch filtered every tenant before the cursor).
		ids, err := i.tenantBatch(ctx, `SELECT id::text FROM tenants WHERE created_at < $1 AND id > $2::uuid ORDER BY tenants.id LIMIT $3`,
			end, i.sweepAfter, min(i.batch, left))
		if err != nil {
			return err
		}
		if len(ids) > 0 {
			if err := i.generateCurrent(ctx, now, ids); err != nil {
				return err
			}
			i.sweepAfter = ids[len(ids)-1]
		}
		if len(ids) < min(i.batch, left) {
			i.sweepAfter = firstTenantID // done: the next Run starts a new sweep
			return nil
		}
		left -= len(ids)
	}
	return nil
}

// Refresh regenerates the drafts of the given tenants' billing periods
// containing now (those the worker just flushed usage for), in batches;
// tenants that do not exist or were created after the current UTC month
// are skipped, final invoices untouched.
func (i *Invoicer) Refresh(ctx context.Context, tenantIDs []string) error {
	if len(tenantIDs) == 0 {
		return nil
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	now := i.now().UTC()
	cur := quota.MonthStart(now)
	for start := 0; start < len(tenantIDs); start += i.batch {
		ids, err := i.tenantBatch(ctx, `SELECT id::text FROM tenants WHERE id::text = ANY($1) AND created_at < $2 ORDER BY tenants.id`,
			tenantIDs[start:min(start+i.batch, len(tenantIDs))], cur.AddDate(0, 1, 0))
		if err != nil {
			return err
		}
		if len(ids) == 0 {
			continue
		}
		if err := i.generateCurrent(ctx, now, ids); err != nil {
			return err
		}
	}
	return nil
}

// closeMonth finalizes the invoice of every tenant created before the end of
// month whose invoice is not final yet, creating it when missing, within the
// budget of *left tenants. It reports whether the month is closed.
func (i *Invoicer) closeMonth(ctx context.Context, now, month time.Time, left *int) (bool, error) {
	after := firstTenantID
	for *left > 0 {
		limit := min(i.batch, *left)
		ids, err := i.tenantBatch(ctx, `
			SELECT t.id::text FROM tenants t
			WHERE t.created_at < $1 AND t.id > $2::uuid
			  -- One probe of invoices' (tenant_id, period) key per tenant, in
			  -- id order from the cursor: a correlated scalar subquery, which
			  -- the planner cannot turn into an anti-join over the month's
			  -- invoices (while a month closes, its final invoices grow by
			  -- thousands a second, faster than their statistics).
			  AND (SELECT i.status FROM invoices i WHERE i.tenant_id = t.id AND i.period = $4) IS DISTINCT FROM 'final'
			ORDER BY t.id LIMIT $3`, month.AddDate(0, 1, 0), after, limit, month)
		if err != nil {
			return false, err
		}
		if len(ids) > 0 {
			if err := pgx.BeginFunc(ctx, i.db, func(tx pgx.Tx) error { return i.generateTx(ctx, tx, now, month, ids) }); err != nil {
				return false, err
			}
			after = ids[len(ids)-1]
		}
		if len(ids) < limit {
			return true, nil
		}
		*left -= len(ids)
	}
	return false, nil
}

func (i *Invoicer) tenantBatch(ctx context.Context, sql string, args ...any) ([]string, error) {
	rows, err := i.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("billing: list tenants: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("billing: list tenants: %w", err)
	}
	return ids, nil
}

// Generate recomputes the tenant's invoice labelled with the month
// containing month (its billing period of that label: see labelOf) and
// returns it with its lines. The invoice is a draft until the period's end
// plus the grace (and FlushedThrough past the period's end), and final
// from then on; a final invoice is returned unchanged. An unknown tenant,
// or one created after the period, is a CodeNotFound error; a period that
// has not started is CodeInvalid.
func (i *Invoicer) Generate(ctx context.Context, tenantID string, month time.Time) (Invoice, error) {
	now := i.now().UTC()
	month = quota.MonthStart(month)
	if month.After(quota.MonthStart(now).AddDate(0, 1, 0)) { // a label may start before its month: see labelOf
		return Invoice{}, quota.Errorf(quota.CodeInvalid, "no invoice yet for %s", month.Format("2006-01"))
	}
	var inv Invoice
	err := pgx.BeginFunc(ctx, i.db, func(tx pgx.Tx) error {
		var id string
		err := tx.QueryRow(ctx, `SELECT id::text FROM tenants WHERE id::text = $1`, tenantID).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return quota.Errorf(quota.CodeNotFound, "no tenant %q", tenantID)
		}
		if err != nil {
			return fmt.Errorf("billing: tenant: %w", err)
		}
		ts, err := i.billedTenants(ctx, tx, []string{id})
		if err != nil {
			return err
		}
		if len(ts) == 0 {
			return quota.Errorf(quota.CodeNotFound, "no tenant %q", tenantID)
		}
		start, end := periodOf(ts[0].cal, month)
		if start.After(now) {
			return quota.Errorf(quota.CodeInvalid, "no invoice yet for %s", month.Format("2006-01"))
		}
		if !ts[0].created.Before(end) {
			return quota.Errorf(quota.CodeNotFound, "tenant %s did not exist in %s", id, month.Format("2006-01"))
		}
		if err := i.generateTx(ctx, tx, now, month, []string{id}); err != nil {
			return err
		}
		inv, err = scanInvoice(tx.QueryRow(ctx, invoiceSelect+` WHERE i.tenant_id = $1 AND i.period = $2`, id, month))
		if err != nil {
			return fmt.Errorf("billing: read invoice: %w", err)
		}
		return nil
	})
	return inv, err
}

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

// TierSegment is a stretch [From, To) of a month that a tenant spent on one
// tier, with what rating needs of the tier.
type TierSegment struct {
	Tier       string // slug
	Name       string
	PriceCents int64 // per full month
	// MonthlyQuota is the tenant's monthly quota on this tier (the tier's,
	// or the tenant's override); nil means unlimited.
	MonthlyQuota           *int64
	Overage                quota.Overage
	OveragePriceCentsPer1K int64
	From, To               time.Time
	// MeterQuotas are the tier's meter quotas (current settings: they have
	// no history), for rating the meters' overage.
	MeterQuotas []quota.MeterQuota
	// Billing is how the tier's tenants pay (its current setting: it has
	// no history either); the prepaid balance reads what admission drew.
	Billing quota.Billing
}

// InvoiceGrant is extra units granted for a day or for the month.
type InvoiceGrant struct {
	Period      string    // "day" or "month"
	PeriodStart time.Time // UTC midnight
	Units       int64
}

// RatingInput is everything Rate needs for one tenant's billing period.
type RatingInput struct {
	Start, End time.Time // the billing period, [Start, End)
	// Zone is the tenant's time zone, in which lines show dates (nil: UTC).
	Zone *time.Location
	// Segments are the tiers the tenant was on, clipped to the month and to
	// the tenant's lifetime, oldest first.
	Segments []TierSegment
	// Units and OverageUnits are the month's sums of usage.units and
	// usage.overage_units.
	Units, OverageUnits int64
	// Grants are the month's grant and the grants of its days.
	Grants []InvoiceGrant
	// MeterOverage are the month's units past meter quotas, per meter
	// (usage.meter_overage_units).
	MeterOverage []MeterOverage
}

// Rate returns the lines of a month's invoice: one subscription line per tier
// segment, one included line, one overage line when there are overage units,
// and one line per grant. Amounts are whole cents, never negative: the
// subscription is price × segment seconds / month seconds rounded half up,
// the overage ceil(overage units × price per 1,000 / 1,000). Contiguous
// segments of the same tier at the same price count as one, with the later
// one's overage price and quota (those in force at its end). See Invoicer
// for which prices apply: a caller splits a tier's stretch where its price
// changed, and gives each part the prices in force in it.
func Rate(in RatingInput) []InvoiceLine {
	monthSecs := in.End.Unix() - in.Start.Unix()
	if monthSecs <= 0 {
		return nil
	}
	in.Segments = slices.Clone(in.Segments)
	slices.SortStableFunc(in.Segments, func(a, b TierSegment) int { return a.From.Compare(b.From) })
	var segs []TierSegment
	for _, s := range in.Segments {
		if s.From.Before(in.Start) {
			s.From = in.Start
		}
		if s.To.After(in.End) {
			s.To = in.End
		}
		if !s.To.After(s.From) {
			continue
		}
		if n := len(segs); n > 0 && segs[n-1].To.Equal(s.From) && segs[n-1].Tier == s.Tier && segs[n-1].PriceCents == s.PriceCents {
			// one line; what is in force at its end (an overage price
			// changed alone) is the later part's
			from := segs[n-1].From
			segs[n-1] = s
			segs[n-1].From = from
			continue
		}
		segs = append(segs, s)
	}

	var lines []InvoiceLine
	// A period across a DST change is an hour off whole days: its days are
	// rounded; proration still divides by its exact seconds.
	monthDays := (monthSecs + 43200) / 86400
	loc := in.Zone
	if loc == nil {
		loc = time.UTC
	}
	for _, s := range segs {
		secs := s.To.Unix() - s.From.Unix()
		lines = append(lines, InvoiceLine{
			Kind: "subscription",
			Description: fmt.Sprintf("%s plan, %s – %s (%s of %d days)",
				s.Name, lineDay(s.From, loc), lineDay(s.To, loc), lineDays(secs), monthDays),
			Quantity:    secs,
			AmountCents: mulDivCents(s.PriceCents, 2*secs, monthSecs, 2*monthSecs),
		})
	}

	included := InvoiceLine{Kind: "included", Description: "Usage", Quantity: max(in.Units, 0)}
	if len(segs) > 0 {
		last := segs[len(segs)-1]
		q := "unlimited units"
		if last.MonthlyQuota != nil {
			q = lineUnits(*last.MonthlyQuota) + " units"
		}
		included.Description = fmt.Sprintf("Usage, included in %s plan: %s per month", last.Name, q)
	}
	lines = append(lines, included)

	if in.OverageUnits > 0 {
		price, name := overageRate(segs)
		lines = append(lines, InvoiceLine{
			Kind:        "overage",
			Description: fmt.Sprintf("Overage: %s units at %s per 1,000 (%s plan)", lineUnits(in.OverageUnits), lineMoney(price), name),
			Quantity:    in.OverageUnits,
			AmountCents: mulDivCents(in.OverageUnits, price, 999, 1000),
		})
	}

	lines = append(lines, meterOverageLines(segs, in.MeterOverage)...)

	grants := slices.Clone(in.Grants)
	slices.SortStableFunc(grants, func(a, b InvoiceGrant) int {
		if c := a.PeriodStart.Compare(b.PeriodStart); c != 0 {
			return c
		}
		if a.Period == b.Period {
			return 0
		}
		if a.Period == "month" {
			return -1
		}
		return 1
	})
	for _, g := range grants {
		if g.Units <= 0 {
			continue
		}
		when := g.PeriodStart.UTC().Format("2006-01-02")
		if g.Period == "month" && g.PeriodStart.UTC().Day() == 1 {
			when = g.PeriodStart.UTC().Format("January 2006")
		} else if g.Period == "month" {
			when = "the period from " + when
		}
		lines = append(lines, InvoiceLine{
			Kind:        "grant",
			Description: fmt.Sprintf("Grant: %s extra units for %s (not charged)", lineUnits(g.Units), when),
			Quantity:    g.Units,
		})
	}
	return lines
}

// overageRate returns the price per 1,000 units that rates a period's
// tier overage, of the segments segs (in order), and its plan's name: the
// last segment's, or when its tier does not bill overage, the latest
// billing one's.
func overageRate(segs []TierSegment) (price int64, name string) {
	name = "no plan"
	for k := len(segs) - 1; k >= 0; k-- {
		if k == len(segs)-1 || segs[k].Overage == quota.OverageBill {
			price, name = segs[k].OveragePriceCentsPer1K, segs[k].Name
		}
		if segs[k].Overage == quota.OverageBill {
			break
		}
	}
	return price, name
}

// TotalCents returns the sum of the lines' amounts, saturating at the
// largest int64 rather than overflowing.
func TotalCents(lines []InvoiceLine) int64 {
	var total int64
	for _, l := range lines {
		if l.AmountCents > math.MaxInt64-total {
			return math.MaxInt64
		}
		total += l.AmountCents
	}
	return total
}

// mulDivCents returns (a×b + add) / d for non-negative a, b, add and positive d,
// through a 128-bit product so that nothing overflows, saturating at the
// largest int64. Rounding up is add = d-1; half up is add = d/2.
func mulDivCents(a, b, add, d int64) int64 {
	if a <= 0 || b <= 0 || d <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	var c uint64
	lo, c = bits.Add64(lo, uint64(max(add, 0)), 0)
	hi += c
	if hi >= uint64(d) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(d))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// lineDay shows a segment boundary: its local date in loc (the tenant's
// zone; UTC for the default calendar), with the local time of day when it
// is not midnight.
func lineDay(t time.Time, loc *time.Location) string {
	t = t.In(loc)
	if h, m, s := t.Clock(); h == 0 && m == 0 && s == 0 && t.Nanosecond() == 0 {
		return t.Format("2006-01-02")
	}
	return t.Format("2006-01-02 15:04")
}

// lineDays shows seconds as days with one decimal, rounded half up.
func lineDays(secs int64) string {
	tenths := (secs*10 + 43200) / 86400
	return fmt.Sprintf("%d.%d", tenths/10, tenths%10)
}

// lineMoney shows cents as dollars: 50 → "$0.50".
func lineMoney(c int64) string { return fmt.Sprintf("$%d.%02d", c/100, c%100) }

// lineUnits groups digits by thousands: 1234567 → "1,234,567".
func lineUnits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := len(s) > 0 && s[0] == '-'
	if neg {
		s = s[1:]
	}
	var out []byte
	for k := range len(s) {
		if k > 0 && (len(s)-k)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[k])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
