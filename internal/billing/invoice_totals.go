package billing

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Each month's count of invoices and sum of their totals (the console's
// invoices page) are kept in invoice_period_totals by triggers on invoices
// (migration 000017): every statement that writes invoices adds one row
// per label it changed, with the change in count and in sum, in its own
// transaction, so the sums are exact whoever writes (the sweeps, Generate,
// a tier change deleting drafts) and concurrent writers never wait on a
// shared row. A label's figures are the sum of its rows.

// compactInvoiceTotals folds each label's rows of invoice_period_totals
// into one, so that reading a label's figures stays a few rows however
// many writes it had. It is one statement in a transaction of its own: the
// rows it deletes are those committed when it starts, and the one it adds
// is their sum, so a writer committing meanwhile is counted once, by its
// own rows; two compactions at once each fold the rows they deleted (the
// second waits for the first, then skips what it deleted).
func compactInvoiceTotals(ctx context.Context, db *pgxpool.Pool) error {
	if _, err := db.Exec(ctx, `
		WITH many AS (
			SELECT period FROM invoice_period_totals GROUP BY period HAVING count(*) > 1
		), folded AS (
			DELETE FROM invoice_period_totals t USING many WHERE t.period = many.period
			RETURNING t.period, t.invoices, t.total_cents
		)
		INSERT INTO invoice_period_totals (period, invoices, total_cents)
		SELECT period, sum(invoices), sum(total_cents) FROM folded GROUP BY period
		HAVING sum(invoices) <> 0 OR sum(total_cents) <> 0`); err != nil {
		return fmt.Errorf("billing: compact invoice totals: %w", err)
	}
	return nil
}
