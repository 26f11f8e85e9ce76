package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Prepaid returns what the admissions of the prepaid tenant tenantID on
// tier may draw on in the billing period of cal containing now (see
// quota.Prepaid): the credit its invoice may draw (created by now, not
// expired before the period's end, less what final invoices drew), less
// what invoices of periods before the previous one that are not final yet
// will draw (their drafts' charges), less the rounding the current and
// the previous period's invoices may add; and whether the previous
// period's invoice is final. One snapshot: a finalization that commits
// meanwhile is seen whole or not at all.
func (s *Store) Prepaid(ctx context.Context, tenantID string, tier quota.Tier, cal quota.Calendar, now time.Time) (quota.Prepaid, error) {
	start, end := cal.Period(now)
	prevStart, _ := cal.Period(start.Add(-time.Nanosecond))
	var credit, held int64
	var prevFinal bool
	err := s.db.QueryRow(ctx, `
		SELECT
			(SELECT coalesce(sum(amount_cents - drawn_cents), 0)::bigint FROM credits
			 WHERE tenant_id = $1 AND created_at <= $4 AND (expires_at IS NULL OR expires_at >= $3)),
			EXISTS (SELECT 1 FROM invoices WHERE tenant_id = $1 AND period_start = $5 AND status = 'final'),
			(SELECT coalesce(sum(l.amount_cents), 0)::bigint FROM invoices i JOIN invoice_lines l ON l.invoice_id = i.id
			 WHERE i.tenant_id = $1 AND i.status = 'draft' AND i.period_end <= $5 AND l.kind <> 'credit')`,
		tenantID, start, end, now, prevStart).Scan(&credit, &prevFinal, &held)
	if err != nil {
		return quota.Prepaid{}, fmt.Errorf("postgres: prepaid balance: %w", err)
	}
	p := quota.Prepaid{CreditCents: credit, HeldCents: held, PeriodID: cal.PeriodID(now), Until: end}
	// Each overage line of an invoice is rounded up to the cent: the
	// tier's and every billed meter quota's, in this period and, while
	// its invoice is a draft, the previous one. A sum of n lines' exact
	// millicents plus 999 for each line past the first is at most the
	// credit only when the lines rounded up are too.
	lines := int64(1 + len(slices.DeleteFunc(slices.Clone(tier.MeterQuotas), func(q quota.MeterQuota) bool { return !q.Bills() })))
	if !prevFinal {
		p.PrevID = cal.PeriodID(prevStart)
		lines *= 2
	}
	p.BalanceMillicents = (credit-held)*1000 - 999*(lines-1)
	return p, nil
}
