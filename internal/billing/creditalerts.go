package billing

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// RecordCreditAlerts writes the low-balance alerts of the prepaid tenants
// among ids at now (API.md "Plans (v2)", Credits), into the outbox that
// the Deliverer sends as signed credit.balance_low webhooks: threshold 80
// once the usage no invoice has drawn yet (the charges of the tenant's
// draft invoices, which the worker refreshes just before) reaches 80 % of
// its credit balance (the credit not expired at now, less what final
// invoices drew), 100 once it reaches all of it. Each threshold is sent
// once per top-up: an alert's period is the UTC date of the tenant's
// latest credit, so that a new credit arms both again (two credits on one
// UTC day count as one top-up). A tenant that never had credit gets none.
// Concurrent workers insert each alert once (ON CONFLICT DO NOTHING).
func RecordCreditAlerts(ctx context.Context, db *pgxpool.Pool, ids []string, now time.Time) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := db.Exec(ctx, `
		WITH t AS (
			SELECT tn.id FROM tenants tn JOIN tiers tr ON tr.slug = tn.tier
			WHERE tn.id = ANY($1::uuid[]) AND tr.billing = 'prepaid'
		), c AS (
			SELECT t.id,
			       coalesce(sum(cr.amount_cents - cr.drawn_cents) FILTER (WHERE cr.expires_at IS NULL OR cr.expires_at > $2), 0)::bigint AS credit,
			       max(cr.created_at) AS latest
			FROM t JOIN credits cr ON cr.tenant_id = t.id
			GROUP BY t.id
		), s AS (
			SELECT c.id, c.credit, c.latest,
			       coalesce((SELECT sum(l.amount_cents) FROM invoices i JOIN invoice_lines l ON l.invoice_id = i.id
			                 WHERE i.tenant_id = c.id AND i.status = 'draft' AND l.kind <> 'credit'), 0)::bigint AS spent
			FROM c
		)
		INSERT INTO alerts (tenant_id, kind, period, threshold, units, quota)
		SELECT s.id, 'credit', (s.latest AT TIME ZONE 'UTC')::date, th.pct, s.spent, s.credit
		FROM s CROSS JOIN (VALUES (80), (100)) AS th(pct)
		WHERE s.spent * 100 >= s.credit * th.pct
		ON CONFLICT (tenant_id, kind, period, meter, threshold) DO NOTHING`, ids, now)
	if err != nil {
		return fmt.Errorf("billing: record credit alerts: %w", err)
	}
	return nil
}
