package billing

import (
	"context"
	"sync/atomic"
	"time"
)

// Cycle is the handoff between the flush of usage into the ledger and the
// invoices: the invoices step refreshes the drafts of the tenants the flush
// just recorded, and a month is finalized only once a flush has caught up
// with its end. Its Flush and Invoices are worker steps (func(ctx) error),
// run in that order each cycle, each idempotent; a failed one is retried on
// the next cycle. Repair (before Flush) and the alerts (after Invoices) hand
// nothing over in memory, so the worker runs them on the Reconciler and the
// Deliverer directly.
type Cycle struct {
	rec      *Reconciler
	invoices *Invoicer
	// lastFlush is when the last successful Flush ended, in Unix ns (0: none
	// yet); the worker's lag gauge reads it from the metrics handler.
	lastFlush atomic.Int64
}

// NewCycle returns the Cycle of rec's flushes and inv's invoices. It sets
// inv.FlushedThrough to rec.FlushedThrough: a month is finalized only after
// a flush that began after its end, swept the keyspace and completed with no
// batch of the month stuck, however long the grace.
func NewCycle(rec *Reconciler, inv *Invoicer) *Cycle {
	inv.FlushedThrough = rec.FlushedThrough
	return &Cycle{rec: rec, invoices: inv}
}

// Flush moves the usage pending in Redis into the ledger (Reconciler.Flush)
// and, once it succeeded, records the time for LastFlush.
func (c *Cycle) Flush(ctx context.Context) error {
	if err := c.rec.Flush(ctx); err != nil {
		return err
	}
	c.lastFlush.Store(c.rec.now().UnixNano())
	return nil
}

// Invoices refreshes the current month's drafts of the tenants flushed since
// the last call, then runs the invoicer (closing past months, and the full
// sweep of the current one every Invoicer.FullSweepEvery). Tenants whose
// refresh failed are not retried here: the next full sweep catches them.
//
// The prepaid tenants among those refreshed then get their low-balance
// alerts (RecordCreditAlerts), measured against the drafts just refreshed.
//
// With a Share on the Reconciler, each worker refreshes the tenants it
// flushed, and closes the months and sweeps the current month's drafts of
// those it owns (Invoicer.Owns); the FlushedThrough that gates the closing
// is the leader's everywhere, as only the leader sweeps the keyspace
// (Reconciler.FlushedThrough).
func (c *Cycle) Invoices(ctx context.Context) error {
	ids := c.rec.TakeFlushed()
	if err := c.invoices.Refresh(ctx, ids); err != nil {
		return err
	}
	if err := RecordCreditAlerts(ctx, c.invoices.db, ids, c.invoices.now()); err != nil {
		return err
	}
	return c.invoices.Run(ctx)
}

// LastFlush returns when the last successful Flush ended, zero before the
// first. It is safe to call concurrently with the steps.
func (c *Cycle) LastFlush() time.Time {
	if ns := c.lastFlush.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}
