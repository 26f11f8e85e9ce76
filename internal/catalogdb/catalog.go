package catalogdb

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/quota"
)

// tenantColumns reads a tenant; its pending change, four nullable columns,
// comes as one JSON object (null when there is none), with UTC times.
const tenantColumns = `id, name, tier, status, overrides, webhook_url, billing_anchor_day, time_zone,
	CASE WHEN pending_tier IS NULL THEN NULL ELSE jsonb_build_object('tier', pending_tier,
		'effective_at', to_char(pending_effective_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
		'quota', pending_quota,
		'requested_at', to_char(pending_requested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')) END,
	created_at, updated_at`

func tenantDest(t *quota.Tenant) []any {
	return []any{&t.ID, &t.Name, &t.Tier, &t.Status, &t.Overrides, &t.WebhookURL, &t.BillingAnchorDay, &t.TimeZone,
		&t.PendingChange, &t.CreatedAt, &t.UpdatedAt}
}

// collectTenants reads rows of tenantColumns.
func collectTenants(rows pgx.Rows) ([]quota.Tenant, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (quota.Tenant, error) {
		var t quota.Tenant
		return t, row.Scan(tenantDest(&t)...)
	})
}

const tierColumns = `slug, name, rank, price_cents, burst_rate, burst, bucket_capacity, bucket_refill_per_sec,
	daily_quota, monthly_quota, overage, overage_price_cents_per_1k, fail_open, upgrade_url, max_overage_cents, meter_quotas,
	billing, top_up_url`

func tierDest(t *quota.Tier) []any {
	return []any{&t.Slug, &t.Name, &t.Rank, &t.PriceCents, &t.BurstRate, &t.Burst, &t.BucketCapacity,
		&t.BucketRefillPerSec, &t.DailyQuota, &t.MonthlyQuota, &t.Overage, &t.OveragePriceCentsPer1K,
		&t.FailOpen, &t.UpgradeURL, &t.MaxOverageCents, &t.MeterQuotas, &t.Billing, &t.TopUpURL}
}

// billing is t's billing mode as the column takes it: "" is postpaid.
func billing(t quota.Tier) quota.Billing {
	if t.Billing == "" {
		return quota.BillingPostpaid
	}
	return t.Billing
}

// meterQuotas is t's meter quotas as the column takes them: a JSON array,
// never null.
func meterQuotas(t quota.Tier) []quota.MeterQuota {
	if t.MeterQuotas == nil {
		return []quota.MeterQuota{}
	}
	return t.MeterQuotas
}

const keyColumns = `k.id, k.tenant_id, k.prefix, k.name, k.created_at, k.last_used_at, k.revoked_at, k.expires_at`

func keyDest(k *quota.APIKey) []any {
	return []any{&k.ID, &k.TenantID, &k.Prefix, &k.Name, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt, &k.ExpiresAt}
}

// KeyByPrefix returns the key with the given visible prefix, or a
// CodeNotFound error.
func (s *Store) KeyByPrefix(ctx context.Context, prefix string) (quota.KeyRecord, error) {
	var r quota.KeyRecord
	err := s.db.QueryRow(ctx, `SELECT `+keyColumns+`, k.secret_sha256 FROM api_keys k WHERE k.prefix = $1`, prefix).
		Scan(append(keyDest(&r.Key), &r.Hash)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, quota.Errorf(quota.CodeNotFound, "no key %q", prefix)
	}
	if err != nil {
		return r, fmt.Errorf("postgres: key by prefix: %w", err)
	}
	return r, nil
}

// KeysByPrefix returns the keys among prefixes that exist (for cache refresh).
func (s *Store) KeysByPrefix(ctx context.Context, prefixes []string) ([]quota.KeyRecord, error) {
	rows, err := s.db.Query(ctx, `SELECT `+keyColumns+`, k.secret_sha256 FROM api_keys k WHERE k.prefix = ANY($1)`, prefixes)
	if err != nil {
		return nil, fmt.Errorf("postgres: keys by prefix: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (quota.KeyRecord, error) {
		var r quota.KeyRecord
		err := row.Scan(append(keyDest(&r.Key), &r.Hash)...)
		return r, err
	})
}

// Tenant returns the tenant with id, or a CodeNotFound error.
func (s *Store) Tenant(ctx context.Context, id string) (quota.Tenant, error) {
	var t quota.Tenant
	err := s.db.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id::text = $1`, id).Scan(tenantDest(&t)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, quota.Errorf(quota.CodeNotFound, "no tenant %q", id)
	}
	if err != nil {
		return t, fmt.Errorf("postgres: tenant: %w", err)
	}
	return t, nil
}

// TenantsByID returns the tenants among ids that exist (for cache refresh).
func (s *Store) TenantsByID(ctx context.Context, ids []string) ([]quota.Tenant, error) {
	rows, err := s.db.Query(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id::text = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("postgres: tenants by id: %w", err)
	}
	return collectTenants(rows)
}

// Tiers returns every tier, by rank.
func (s *Store) Tiers(ctx context.Context) ([]quota.Tier, error) {
	rows, err := s.db.Query(ctx, `SELECT `+tierColumns+` FROM tiers ORDER BY rank`)
	if err != nil {
		return nil, fmt.Errorf("postgres: tiers: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (quota.Tier, error) {
		var t quota.Tier
		err := row.Scan(tierDest(&t)...)
		return t, err
	})
}
