package billing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tollgate/tollgate/internal/quota"
)

// RecordOutage records the usage an API node admitted in process while
// Redis was away (a fail-open tier's), when Redis did not take it in time
// (internal/admission): its units and requests go into the ledger as a
// flushed batch's do, exactly once under the batch's id (usage_batches;
// the same transaction). No overage is counted here (only Redis holds the
// month's counters to count it against), and Redis' quota counters do not
// learn of these units unless the worker restores them from the ledger
// after a loss. A row of negative units (a refund or settlement of units
// recorded before) gives back its units and the overage it names, as the
// flush's corrections do. An error that wraps quota.ErrNotSent never
// reached Postgres.
func (l *Ledger) RecordOutage(ctx context.Context, b quota.OutageBatch) error {
	rows := make([]quota.PendingRow, len(b.Rows))
	for i, r := range b.Rows {
		rows[i] = quota.PendingRow{Hour: r.Hour, Meter: r.Meter, Units: r.Units, Requests: r.Requests}
		if r.Units < 0 {
			rows[i].Overage, rows[i].MeterOverage = -r.Overage, -r.MeterOverage
		}
	}
	rec := &Reconciler{db: l.db, now: time.Now, log: slog.New(slog.DiscardHandler)}
	err := pgx.BeginFunc(ctx, l.db, func(tx pgx.Tx) error {
		_, err := rec.record(ctx, tx, []quota.Batch{{TenantID: b.Request.TenantID, ID: b.ID, Rows: rows}})
		return err
	})
	if err != nil {
		var connect *pgconn.ConnectError
		if errors.As(err, &connect) || pgconn.SafeToRetry(err) {
			err = errors.Join(quota.ErrNotSent, err)
		}
		return fmt.Errorf("billing: record outage usage: %w", err)
	}
	return nil
}
