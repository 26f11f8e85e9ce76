package catalogdb

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/quota"
)

// planTx applies the tier change plan, asked at now, to after (the tenant
// being changed from before): it sets after.Tier for a change made now, or
// after.PendingChange for one at the next period, and reports whether the
// change now empties the tenant's counters (quota reset). The new tier
// must exist and accept the tenant's overrides either way, so that a
// pending change is valid when it was asked.
func planTx(ctx context.Context, tx pgx.Tx, before quota.Tenant, after *quota.Tenant, plan quota.PlanRequest, now time.Time) (bool, error) {
	to, err := tierTx(ctx, tx, plan.Tier, "FOR SHARE")
	if quota.ErrorCode(err) == quota.CodeNotFound {
		return false, quota.FieldError("tier", "no tier %q", plan.Tier)
	}
	if err != nil {
		return false, err
	}
	if err := to.CheckOverrides(after.Overrides); err != nil {
		return false, quota.OverridesError(err)
	}
	if plan.Tier == before.Tier {
		after.Tier, after.PendingChange = before.Tier, nil
		return false, nil
	}
	from, err := tierTx(ctx, tx, before.Tier, "")
	if err != nil {
		return false, err
	}
	if plan.EffectiveFor(from.Rank, to.Rank) == quota.EffectiveNow {
		after.Tier, after.PendingChange = plan.Tier, nil
		return plan.QuotaMode() == quota.QuotaReset, nil
	}
	after.Tier = before.Tier
	after.PendingChange = &quota.PendingChange{Tier: plan.Tier, EffectiveAt: after.NextPeriodStart(now).UTC(),
		Quota: plan.QuotaMode(), RequestedAt: now.UTC().Truncate(time.Microsecond)}
	return false, nil
}

// writeTenantTx stores every changeable column of t on the tenant id and
// returns the row as stored.
func writeTenantTx(ctx context.Context, tx pgx.Tx, id string, t quota.Tenant) (quota.Tenant, error) {
	var pTier, pQuota *string
	var pAt, pReq *time.Time
	if p := t.PendingChange; p != nil {
		q := string(p.Quota)
		pTier, pQuota, pAt, pReq = &p.Tier, &q, &p.EffectiveAt, &p.RequestedAt
	}
	var out quota.Tenant
	err := tx.QueryRow(ctx, `UPDATE tenants SET name = $2, tier = $3, status = $4, overrides = $5, webhook_url = $6,
		billing_anchor_day = $7, time_zone = $8, pending_tier = $9, pending_effective_at = $10, pending_quota = $11,
		pending_requested_at = $12, updated_at = clock_timestamp() WHERE id = $1 RETURNING `+tenantColumns,
		id, t.Name, t.Tier, t.Status, t.Overrides, t.WebhookURL, t.BillingAnchorDay, t.TimeZone,
		pTier, pAt, pQuota, pReq).Scan(tenantDest(&out)...)
	if isForeignKeyViolation(err) {
		return out, quota.FieldError("tier", "no tier %q", t.Tier)
	}
	if err != nil {
		return out, fmt.Errorf("postgres: update tenant: %w", err)
	}
	return out, nil
}

// moveTierTx closes the tenant's tier history at at and opens tier's there.
func moveTierTx(ctx context.Context, tx pgx.Tx, tenantID, tier string, at time.Time) error {
	tag, err := tx.Exec(ctx, `UPDATE tenant_tier_history SET valid_to = $2 WHERE tenant_id = $1 AND valid_to IS NULL AND valid_from < $2`,
		tenantID, at)
	if err != nil {
		return fmt.Errorf("postgres: close tier history: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("postgres: close tier history of tenant %s at %s: no open stretch before it", tenantID, at.Format(time.RFC3339Nano))
	}
	if _, err := tx.Exec(ctx, `INSERT INTO tenant_tier_history (tenant_id, tier, valid_from) VALUES ($1, $2, $3)`,
		tenantID, tier, at); err != nil {
		return fmt.Errorf("postgres: open tier history: %w", err)
	}
	return nil
}

// recordResetTx records a reset of the tenant t's counters at at, in its
// calendar.
func recordResetTx(ctx context.Context, tx pgx.Tx, t quota.Tenant, at time.Time) (*quota.CounterReset, error) {
	r := &quota.CounterReset{TenantID: t.ID, At: at, Calendar: t.Calendar()}
	if err := tx.QueryRow(ctx, `INSERT INTO quota_resets (tenant_id, at) VALUES ($1, $2) RETURNING id::text`, t.ID, at).
		Scan(&r.ID); err != nil {
		return nil, fmt.Errorf("postgres: record quota reset: %w", err)
	}
	return r, nil
}

// DuePlanChanges returns the tenants whose pending change is due at now
// (effective_at <= now), soonest first, at most limit of them.
func (s *Store) DuePlanChanges(ctx context.Context, now time.Time, limit int) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT id::text FROM tenants WHERE pending_tier IS NOT NULL AND pending_effective_at <= $1
		ORDER BY pending_effective_at, id LIMIT $2`, now, limit)
	if err != nil {
		return nil, fmt.Errorf("postgres: due plan changes: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("postgres: due plan changes: %w", err)
	}
	return ids, nil
}

// ApplyPlanChange applies the tenant's pending change if it is due at now,
// in one transaction under the tenant's row lock: the tier changes, its
// history closes and opens at the change's effective_at exactly (not at
// now, so that invoices prorate at the period boundary however late this
// runs), the pending change goes, and the change is audited by actor. With
// quota reset it records a reset at effective_at, returned for the caller
// to apply. applied is false, with nothing changed, when the tenant has no
// due pending change (another worker applied it, or it was cancelled): so
// a change is applied once however many workers try.
func (s *Store) ApplyPlanChange(ctx context.Context, actor, id string, now time.Time) (out quota.Tenant, reset *quota.CounterReset, applied bool, err error) {
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		out, reset, applied = quota.Tenant{}, nil, false
		before, err := tenantTx(ctx, tx, id, "FOR UPDATE")
		if err != nil {
			return err
		}
		p := before.PendingChange
		if p == nil || p.EffectiveAt.After(now) {
			out = before
			return nil
		}
		tier, err := tierTx(ctx, tx, p.Tier, "FOR SHARE")
		if err != nil {
			return err
		}
		if err := tier.CheckOverrides(before.Overrides); err != nil {
			return fmt.Errorf("postgres: pending change of tenant %s to tier %s: the tenant's overrides do not fit the tier (%w); "+
				"change them or cancel the pending change", id, p.Tier, quota.OverridesError(err))
		}
		after := before
		after.Tier, after.PendingChange = p.Tier, nil
		if out, err = writeTenantTx(ctx, tx, before.ID, after); err != nil {
			return err
		}
		if out.Tier != before.Tier {
			if err := moveTierTx(ctx, tx, out.ID, out.Tier, p.EffectiveAt); err != nil {
				return err
			}
			if p.Quota == quota.QuotaReset {
				if reset, err = recordResetTx(ctx, tx, out, p.EffectiveAt); err != nil {
					return err
				}
			}
		}
		applied = true
		return audit(ctx, tx, actor, "update", "tenant", out.ID, before, out)
	})
	return out, reset, applied, err
}

// UnappliedResets returns quota resets not applied to the live counters
// yet, oldest first, at most limit; those older than since are left: the
// day and month they empty are over (and counters start again at 0 anyway).
func (s *Store) UnappliedResets(ctx context.Context, since time.Time, limit int) ([]quota.CounterReset, error) {
	rows, err := s.db.Query(ctx, `SELECT r.id::text, r.tenant_id::text, r.at, t.billing_anchor_day, t.time_zone
		FROM quota_resets r JOIN tenants t ON t.id = r.tenant_id
		WHERE r.applied_at IS NULL AND r.at >= $1 ORDER BY r.at, r.id LIMIT $2`, since, limit)
	if err != nil {
		return nil, fmt.Errorf("postgres: unapplied quota resets: %w", err)
	}
	rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (quota.CounterReset, error) {
		var r quota.CounterReset
		var t quota.Tenant
		err := row.Scan(&r.ID, &r.TenantID, &r.At, &t.BillingAnchorDay, &t.TimeZone)
		r.Calendar = t.Calendar()
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: unapplied quota resets: %w", err)
	}
	return rs, nil
}

// MarkResetApplied records that the reset id is in the live counters;
// marking it twice is no harm.
func (s *Store) MarkResetApplied(ctx context.Context, id string) error {
	if _, err := s.db.Exec(ctx, `UPDATE quota_resets SET applied_at = now() WHERE id = $1 AND applied_at IS NULL`, id); err != nil {
		return fmt.Errorf("postgres: mark quota reset applied: %w", err)
	}
	return nil
}

// recordPriceTx starts the price history row of tier t at the
// transaction's time (closing the open one), when its prices differ from
// the open row's; a tier without history gets its first row, from the
// distant past, so that every stretch of its tenants' history has a price.
func recordPriceTx(ctx context.Context, tx pgx.Tx, t quota.Tier) error {
	// The change's time is the transaction's, or just after the open row's
	// start should a transaction that began earlier have opened it.
	_, err := tx.Exec(ctx, `
		WITH open AS (
			SELECT price_cents, overage_price_cents_per_1k, valid_from FROM tier_prices
			WHERE tier = $1 AND valid_to IS NULL FOR UPDATE
		), at AS (
			SELECT greatest(now(), (SELECT valid_from + interval '1 microsecond' FROM open)) AS at
		), closed AS (
			UPDATE tier_prices SET valid_to = (SELECT at FROM at)
			WHERE tier = $1 AND valid_to IS NULL AND (price_cents, overage_price_cents_per_1k) IS DISTINCT FROM ($2, $3)
			RETURNING 1
		)
		INSERT INTO tier_prices (tier, price_cents, overage_price_cents_per_1k, valid_from)
		SELECT $1, $2, $3, CASE WHEN EXISTS (SELECT 1 FROM closed) THEN (SELECT at FROM at) ELSE '1970-01-01T00:00:00Z'::timestamptz END
		WHERE NOT EXISTS (SELECT 1 FROM open) OR EXISTS (SELECT 1 FROM closed)`,
		t.Slug, t.PriceCents, t.OveragePriceCentsPer1K)
	if err != nil {
		return fmt.Errorf("postgres: price history: %w", err)
	}
	return nil
}
