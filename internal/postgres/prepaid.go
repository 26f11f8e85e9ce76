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
// will draw (their drafts' charges); the invoice lines a period's draws are
// rated on; whether the previous period's invoice is final, and if not, the
// credit it may draw that expires before this period ends. One snapshot: a finalization that commits
// meanwhile is seen whole or not at all.
func (s *Store) Prepaid(ctx context.Context, tenantID string, tier quota.Tier, cal quota.Calendar, now time.Time) (quota.Prepaid, error) {
	start, end := cal.Period(now)
	prevStart, _ := cal.Period(start.Add(-time.Nanosecond))
	var credit, expiring, held int64
	var prevFinal bool
	err := s.db.QueryRow(ctx, `
		SELECT
			(SELECT coalesce(sum(amount_cents - drawn_cents), 0)::bigint FROM credits
			 WHERE tenant_id = $1 AND created_at <= $3 AND (expires_at IS NULL OR expires_at >= $2)),
			(SELECT coalesce(sum(amount_cents - drawn_cents), 0)::bigint FROM credits
			 WHERE tenant_id = $1 AND created_at <= $3 AND expires_at >= $5 AND expires_at < $2),
			EXISTS (SELECT 1 FROM invoices WHERE tenant_id = $1 AND period_start = $4 AND status = 'final'),
			(SELECT coalesce(sum(l.amount_cents), 0)::bigint FROM invoices i JOIN invoice_lines l ON l.invoice_id = i.id
			 WHERE i.tenant_id = $1 AND i.status = 'draft' AND i.period_end <= $4 AND l.kind <> 'credit')`,
		tenantID, end, now, prevStart, start).Scan(&credit, &expiring, &prevFinal, &held)
	if err != nil {
		return quota.Prepaid{}, fmt.Errorf("postgres: prepaid balance: %w", err)
	}
	p := quota.Prepaid{CreditCents: credit, HeldCents: held, PeriodID: cal.PeriodID(now), Until: end,
		BalanceMillicents: (credit - held) * 1000,
		// the tier's overage line and each billed meter quota's
		Lines: 1 + len(slices.DeleteFunc(slices.Clone(tier.MeterQuotas), func(q quota.MeterQuota) bool { return !q.Bills() }))}
	if !prevFinal {
		p.PrevID, p.ExpiringMillicents = cal.PeriodID(prevStart), expiring*1000
	}
	return p, nil
}
