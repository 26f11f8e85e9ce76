package billing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/quota"
)

// Invoicer keeps every tenant's invoice of its current billing period
// current as a draft, and finalizes each past period's once its grace is
// over and the ledger holds all its usage (FlushedThrough). A final invoice
// never changes again. How invoices are rated and timed, and why, is in
// docs/architecture.md ("Invoices: rating and timing").
//
// Run is one idempotent step of the worker; Refresh regenerates the drafts
// of tenants whose usage was just flushed; Generate recomputes one invoice.
// One Run of an Invoicer runs at a time.
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
	// closedThrough is the latest month this Invoicer has seen fully final
	// (of the tenants it Owns, as its share was when that pass began:
	// closedGained); closing is skipped until the next month ends, or its
	// share grows. passGained is Gained when the pass under way began.
	closedThrough            time.Time
	closedGained, passGained uint64
	closing                  bool
	closedInPass             map[int64]bool // the months the pass under way closed, by Unix time
	// closeMonth and closeDue resume where a Run stopped them: the tenant
	// they reached, by month (or label), by Unix time.
	closeAfter, dueAfter map[int64]string

	// FullSweepEvery spaces the current month's sweeps over every tenant:
	// zero sweeps (within the budget) on every Run. Between sweeps the
	// worker keeps drafts current with Refresh, for the tenants whose usage
	// it just flushed, so that a cycle's work grows with the active tenants;
	// the sweeps catch what Refresh does not see (tier changes, grants).
	FullSweepEvery time.Duration
	sweepStarted   time.Time

	// Owns, when set, is this worker's share of the tenants
	// (worker.Shares.Owns): Run closes the months and sweeps the current
	// month's drafts of the tenants it owns only, so that workers split
	// the invoices as they split the flush, each running Run. A tenant
	// whose shard moves while the sweeps run may be left to the next sweep,
	// as its drafts are refreshed by every flush of its usage in the
	// meantime; one whose shard moves while a month closes is closed by
	// its new owner, whose share grew (Gained). Set it before the first
	// Run.
	Owns func(tenantID string) bool
	// Gained, when set with Owns, counts the shards this worker has taken
	// (worker.Shares.Gained): a month this Invoicer closed for the tenants
	// it owned is closed again, for those it owns now, once it changes.
	Gained func() uint64

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

	gained := uint64(0)
	if i.Gained != nil {
		gained = i.Gained()
	}
	if (!i.closedThrough.Equal(prev) || i.closedGained != gained) && i.closable(now, cur) {
		if !i.closing {
			i.closing, i.passGained, i.closedInPass = true, gained, map[int64]bool{}
		}
		rows, err := i.db.Query(ctx, `SELECT DISTINCT period FROM invoices WHERE status = 'draft' AND period < $1 ORDER BY period`, prev)
		if err != nil {
			return fmt.Errorf("billing: open months: %w", err)
		}
		months, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
		if err != nil {
			return fmt.Errorf("billing: open months: %w", err)
		}
		for _, m := range append(months, prev) {
			if i.closedInPass[m.Unix()] {
				continue // (closed by this pass; drafts of other workers' tenants keep it listed)
			}
			done, err := i.closeMonth(ctx, now, m.UTC(), &left)
			if err != nil || !done {
				return err
			}
			i.closedInPass[m.Unix()] = true
		}
		i.closedThrough, i.closedGained, i.closing = prev, i.passGained, false
	}
	if done, err := i.closeDue(ctx, now, &left); err != nil || !done {
		return err
	}
	return i.sweep(ctx, now, left)
}

// sweepListed bounds the tenants each part of one Run (closing a month,
// closing the due drafts, the sweep) lists, in TenantsPerRun, when Owns
// leaves some out: a worker that owns few tenants still ends its Run soon.
const sweepListed = 8

// owned returns the ids of tenants this Invoicer Owns (all without Owns).
func (i *Invoicer) owned(ids []string) []string {
	if i.Owns == nil {
		return ids
	}
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return !i.Owns(id) })
}

// sweep regenerates the current month's drafts of up to left tenants (those
// it Owns), from where the last call stopped; a new sweep starts once the
// last ended FullSweepEvery ago. i.mu is held.
func (i *Invoicer) sweep(ctx context.Context, now time.Time, left int) error {
	cur := quota.MonthStart(now)
	if !i.sweepMonth.Equal(cur) {
		i.sweepMonth, i.sweepAfter = cur, firstTenantID
	}
	if i.sweepAfter == firstTenantID { // not in the middle of a sweep
		if !i.sweepStarted.IsZero() && now.Sub(i.sweepStarted) < i.FullSweepEvery {
			return nil
		}
		i.sweepStarted = now
	}
	done, err := i.walk(ctx, &i.sweepAfter, &left, i.listTenants(ctx, cur.AddDate(0, 1, 0)), nil,
		func(ids []string) error { return i.generateCurrent(ctx, now, ids) })
	if done {
		i.sweepAfter = firstTenantID // the next call starts a new sweep
	}
	return err
}

// walk goes through the tenants in id order from *after, a page at a
// time (list), keeps those it Owns that keep retains (nil: all of them),
// and hands them to do in batches of min(i.batch, *left) tenants or more
// (fewer at the listing's end): with Owns, a batch gathers several pages,
// so that each transaction still carries a full batch. It stops once
// *left tenants were handed over, or sweepListed × *left were listed.
// *after moves past each page once do has handled it, *left falls by the
// tenants handed over. It reports whether the listing reached its end.
func (i *Invoicer) walk(ctx context.Context, after *string, left *int, list func(after string, limit int) ([]string, error),
	keep func(ids []string) ([]string, error), do func(ids []string) error) (bool, error) {
	listed := sweepListed * *left
	for *left > 0 && listed > 0 {
		want := min(i.batch, *left)
		cursor, end := *after, false
		var batch []string
		for len(batch) < want && listed > 0 && !end {
			ids, err := list(cursor, want)
			if err != nil {
				return false, err
			}
			listed -= len(ids)
			kept := i.owned(ids)
			if keep != nil && len(kept) > 0 {
				if kept, err = keep(kept); err != nil {
					return false, err
				}
			}
			batch = append(batch, kept...)
			if len(ids) > 0 {
				cursor = ids[len(ids)-1]
			}
			end = len(ids) < want
		}
		if len(batch) > 0 {
			if err := do(batch); err != nil {
				return false, err
			}
		}
		*after = cursor
		*left -= len(batch)
		if end {
			return true, nil
		}
	}
	return false, nil
}

// listTenants lists, for walk, the tenants created before end.
func (i *Invoicer) listTenants(ctx context.Context, end time.Time) func(after string, limit int) ([]string, error) {
	return func(after string, limit int) ([]string, error) {
		// ORDER BY tenants.id, the uuid: a bare "id" would name the text
		// column selected, which no index serves with the uuid cursor (each
		// batch filtered every tenant before the cursor).
		return i.tenantBatch(ctx, `SELECT id::text FROM tenants WHERE created_at < $1 AND id > $2::uuid ORDER BY tenants.id LIMIT $3`,
			end, after, limit)
	}
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

// closeMonth finalizes the invoice of every tenant it Owns created before
// the end of month whose invoice is not final yet, creating it when
// missing, within the budget of *left tenants, resuming where the last
// call stopped on that month. It reports whether the month is closed.
func (i *Invoicer) closeMonth(ctx context.Context, now, month time.Time, left *int) (bool, error) {
	after, ok := i.closeAfter[month.Unix()]
	if !ok {
		after = firstTenantID
	}
	// Of the tenants it owns, those whose invoice is not final yet.
	notFinal := func(ids []string) ([]string, error) {
		return i.tenantBatch(ctx, `
			SELECT t.id::text FROM unnest($1::uuid[]) AS t(id)
			  -- One probe of invoices' (tenant_id, period) key per tenant: a
			  -- correlated scalar subquery, which the planner cannot turn
			  -- into an anti-join over the month's invoices (while a month
			  -- closes, its final invoices grow by thousands a second,
			  -- faster than their statistics).
			WHERE (SELECT i.status FROM invoices i WHERE i.tenant_id = t.id AND i.period = $2) IS DISTINCT FROM 'final'
			ORDER BY t.id`, customPlan, ids, month)
	}
	done, err := i.walk(ctx, &after, left, i.listTenants(ctx, month.AddDate(0, 1, 0)), notFinal, func(ids []string) error {
		return pgx.BeginFunc(ctx, i.db, func(tx pgx.Tx) error { return i.generateTx(ctx, tx, now, month, ids) })
	})
	i.closeAfter = resumeAt(i.closeAfter, month, after, done)
	return done, err
}

// resumeAt records in cursors where a walk of month (or label) stopped:
// after, or nothing once it is done.
func resumeAt(cursors map[int64]string, month time.Time, after string, done bool) map[int64]string {
	if done {
		delete(cursors, month.Unix())
		return cursors
	}
	if cursors == nil {
		cursors = map[int64]string{}
	}
	cursors[month.Unix()] = after
	return cursors
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
