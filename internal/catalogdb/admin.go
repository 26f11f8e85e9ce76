package catalogdb

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/apikey"
	"github.com/tollgate/tollgate/internal/quota"
)

// cursor is what an opaque cursor holds: the sort key of the last item.
type cursor struct {
	At time.Time `json:"a,omitzero"`
	ID string    `json:"i"`
	N  int64     `json:"n,omitempty"`
}

func encodeCursor(c cursor) string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	var c cursor
	if s == "" {
		return c, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || json.Unmarshal(b, &c) != nil || c.ID == "" {
		return c, quota.FieldError("cursor", "not a cursor of this list")
	}
	return c, nil
}

// pageOf trims rows fetched with limit+1 to limit and returns the next cursor.
func pageOf[T any](rows []T, limit int, key func(T) cursor) ([]T, *string) {
	if len(rows) <= limit {
		return rows, nil
	}
	rows = rows[:limit]
	next := encodeCursor(key(rows[limit-1]))
	return rows, &next
}

// ListTiers returns tiers by rank.
func (s *Store) ListTiers(ctx context.Context, p quota.Page) ([]quota.Tier, *string, error) {
	c, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, nil, err
	}
	after := int64(-1)
	if c.ID != "" {
		after = c.N
	}
	rows, err := s.db.Query(ctx, `SELECT `+tierColumns+` FROM tiers WHERE rank > $1 ORDER BY rank LIMIT $2`, after, p.Limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list tiers: %w", err)
	}
	tiers, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (quota.Tier, error) {
		var t quota.Tier
		return t, row.Scan(tierDest(&t)...)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list tiers: %w", err)
	}
	items, next := pageOf(tiers, p.Limit, func(t quota.Tier) cursor { return cursor{ID: t.Slug, N: int64(t.Rank)} })
	return items, next, nil
}

// Tier returns one tier or a CodeNotFound error.
func (s *Store) Tier(ctx context.Context, slug string) (quota.Tier, error) {
	return tierTx(ctx, s.db, slug, "")
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func tierTx(ctx context.Context, q querier, slug, lock string) (quota.Tier, error) {
	var t quota.Tier
	err := q.QueryRow(ctx, `SELECT `+tierColumns+` FROM tiers WHERE slug = $1 `+lock, slug).Scan(tierDest(&t)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, quota.Errorf(quota.CodeNotFound, "no tier %q", slug)
	}
	if err != nil {
		return t, fmt.Errorf("postgres: tier: %w", err)
	}
	return t, nil
}

// UpdateTier applies change to the tier under a row lock, validates the
// result and stores it with an audit entry. A change that would make the
// effective limits of one of the tier's tenants invalid (see
// quota.CheckTierLimits) is a CodeConflict error naming them, as is a rank
// another tier has. A change that changes nothing writes nothing.
func (s *Store) UpdateTier(ctx context.Context, actor, slug string, change func(*quota.Tier) error) (quota.Tier, error) {
	var out quota.Tier
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		before, err := tierTx(ctx, tx, slug, "FOR UPDATE")
		if err != nil {
			return err
		}
		after := before
		if err := change(&after); err != nil {
			return err
		}
		after.Slug = before.Slug
		if err := checkRename(before.Name, after.Name); err != nil {
			return err
		}
		if err := after.Validate(); err != nil {
			return err
		}
		if reflect.DeepEqual(after, before) {
			out = before
			return nil // nothing changes: nothing to write or audit
		}
		overriding, err := overridingTenantsTx(ctx, tx, slug)
		if err != nil {
			return err
		}
		if err := quota.CheckTierLimits(after, overriding); err != nil {
			return err
		}
		err = tx.QueryRow(ctx, `UPDATE tiers SET name = $2, rank = $3, price_cents = $4, burst_rate = $5, burst = $6,
			bucket_capacity = $7, bucket_refill_per_sec = $8, daily_quota = $9, monthly_quota = $10, overage = $11,
			overage_price_cents_per_1k = $12, fail_open = $13, upgrade_url = $14, max_overage_cents = $15,
			meter_quotas = $16, billing = $17, top_up_url = $18, updated_at = now()
			WHERE slug = $1 RETURNING `+tierColumns,
			slug, after.Name, after.Rank, after.PriceCents, after.BurstRate, after.Burst, after.BucketCapacity,
			after.BucketRefillPerSec, after.DailyQuota, after.MonthlyQuota, after.Overage, after.OveragePriceCentsPer1K,
			after.FailOpen, after.UpgradeURL, after.MaxOverageCents, meterQuotas(after), billing(after), after.TopUpURL).Scan(tierDest(&out)...)
		if uniqueViolation(err) != "" {
			return rankTaken(after.Rank)
		}
		if err != nil {
			return fmt.Errorf("postgres: update tier: %w", err)
		}
		if err := recordPriceTx(ctx, tx, out); err != nil {
			return err
		}
		return audit(ctx, tx, actor, "update", "tier", slug, before, out)
	})
	return out, err
}

// checkRename checks a name set by a change (quota.CheckName). A name
// stored before names were checked stays as it is until it is changed: a
// tenant named "Acme " can still be suspended, a tier repriced.
func checkRename(before, after string) error {
	if after == before {
		return nil
	}
	return quota.CheckName("name", after)
}

// overridingTenantsTx returns the tier's tenants that override a limit,
// oldest first; the others have the tier's limits, validated with the tier.
// The tier's row lock keeps the set stable: a tenant change takes it shared
// before it validates overrides against the tier.
func overridingTenantsTx(ctx context.Context, tx pgx.Tx, slug string) ([]quota.Tenant, error) {
	rows, err := tx.Query(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE tier = $1 AND overrides <> '{}'::jsonb
		ORDER BY created_at, id`, slug)
	if err != nil {
		return nil, fmt.Errorf("postgres: tenants overriding tier: %w", err)
	}
	ts, err := collectTenants(rows)
	if err != nil {
		return nil, fmt.Errorf("postgres: tenants overriding tier: %w", err)
	}
	return ts, nil
}

// DeleteTier deletes a tier no tenant uses or used (invoices need the
// history); otherwise it is a CodeConflict error.
func (s *Store) DeleteTier(ctx context.Context, actor, slug string) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		before, err := tierTx(ctx, tx, slug, "FOR UPDATE")
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM tiers WHERE slug = $1`, slug)
		if isForeignKeyViolation(err) {
			return quota.Errorf(quota.CodeConflict, "tenants use or used tier %q; move them and keep it for their invoices", slug)
		}
		if err != nil {
			return fmt.Errorf("postgres: delete tier: %w", err)
		}
		return audit(ctx, tx, actor, "delete", "tier", slug, before, nil)
	})
}

// ListTenants returns tenants, oldest first.
func (s *Store) ListTenants(ctx context.Context, f quota.TenantFilter, p quota.Page) ([]quota.Tenant, *string, error) {
	c, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT `+tenantColumns+` FROM tenants
		WHERE ($1 = '' OR name ILIKE '%' || replace(replace(replace($1, '\', '\\'), '%', '\%'), '_', '\_') || '%' OR id::text = $1)
		  AND ($2 = '' OR tier = $2)
		  AND ($3 = '' OR (created_at, id::text) > ($4, $3))
		ORDER BY created_at, id LIMIT $5`, f.Query, f.Tier, c.ID, c.At, p.Limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list tenants: %w", err)
	}
	ts, err := collectTenants(rows)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list tenants: %w", err)
	}
	items, next := pageOf(ts, p.Limit, func(t quota.Tenant) cursor { return cursor{At: t.CreatedAt, ID: t.ID} })
	return items, next, nil
}

// CreateTenantWith creates a tenant with its name, tier, overrides and
// webhook URL, recording its tier history and an audit entry.
func (s *Store) CreateTenantWith(ctx context.Context, actor string, in quota.Tenant) (quota.Tenant, error) {
	if err := quota.CheckName("name", in.Name); err != nil {
		return quota.Tenant{}, err
	}
	if in.BillingAnchorDay == 0 {
		in.BillingAnchorDay = quota.DefaultAnchorDay
	}
	if in.TimeZone == "" {
		in.TimeZone = quota.DefaultTimeZone
	}
	if err := quota.CheckCalendar(in.BillingAnchorDay, in.TimeZone); err != nil {
		return quota.Tenant{}, err
	}
	secret, err := newWebhookSecret()
	if err != nil {
		return quota.Tenant{}, err
	}
	var t quota.Tenant
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		tier, err := tierTx(ctx, tx, in.Tier, "FOR SHARE")
		if quota.ErrorCode(err) == quota.CodeNotFound {
			return quota.FieldError("tier", "no tier %q", in.Tier)
		}
		if err != nil {
			return err
		}
		if err := tier.CheckOverrides(in.Overrides); err != nil {
			return quota.OverridesError(err)
		}
		err = tx.QueryRow(ctx, `
			INSERT INTO tenants (name, tier, overrides, webhook_url, webhook_secret, billing_anchor_day, time_zone)
			VALUES ($1, $2, $3, $4, $5, $6, $7)
			RETURNING `+tenantColumns, in.Name, in.Tier, in.Overrides, in.WebhookURL, secret, in.BillingAnchorDay, in.TimeZone).
			Scan(tenantDest(&t)...)
		if err != nil {
			return fmt.Errorf("postgres: insert tenant: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO tenant_tier_history (tenant_id, tier, valid_from) VALUES ($1, $2, $3)`,
			t.ID, t.Tier, t.CreatedAt); err != nil {
			return fmt.Errorf("postgres: insert tier history: %w", err)
		}
		return audit(ctx, tx, actor, "create", "tenant", t.ID, nil, t)
	})
	return t, err
}

func tenantTx(ctx context.Context, q querier, id, lock string) (quota.Tenant, error) {
	var t quota.Tenant
	err := q.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id::text = $1 `+lock, id).Scan(tenantDest(&t)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, quota.Errorf(quota.CodeNotFound, "no tenant %q", id)
	}
	if err != nil {
		return t, fmt.Errorf("postgres: tenant: %w", err)
	}
	return t, nil
}

// UpdateTenant applies change under a row lock. A tier change (change
// setting Tier) applies at once: it closes the tenant's tier history at the
// change, opens the new tier's and drops any pending change. For tier
// changes as the admin API asks them (effective, quota), see ChangeTenant.
func (s *Store) UpdateTenant(ctx context.Context, actor, id string, change func(*quota.Tenant) error) (quota.Tenant, error) {
	out, _, err := s.ChangeTenant(ctx, actor, id, nil, time.Time{}, change)
	return out, err
}

// ChangeTenant applies change under a row lock, then, when plan is not
// nil, the tier change it asks for, at now: at once (as UpdateTenant), or
// recorded as the tenant's pending change, effective at the start of its
// next billing period, when plan says next_period or, saying nothing,
// moves to a lower rank (see quota.PlanRequest.EffectiveFor). A plan to
// the tier the tenant is on drops its pending change. An immediate change
// with quota reset records a quota reset at the change's time, returned
// for the caller to apply to the live counters after the commit.
func (s *Store) ChangeTenant(ctx context.Context, actor, id string, plan *quota.PlanRequest, now time.Time,
	change func(*quota.Tenant) error) (quota.Tenant, *quota.CounterReset, error) {
	if plan != nil {
		if err := plan.Validate(); err != nil {
			return quota.Tenant{}, nil, err
		}
	}
	var out quota.Tenant
	var reset *quota.CounterReset
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		reset = nil
		before, err := tenantTx(ctx, tx, id, "FOR UPDATE")
		if err != nil {
			return err
		}
		after := before
		if err := change(&after); err != nil {
			return err
		}
		if err := checkRename(before.Name, after.Name); err != nil {
			return err
		}
		if after.Status != quota.StatusActive && after.Status != quota.StatusSuspended {
			return quota.FieldError("status", `must be "active" or "suspended"`)
		}
		if err := quota.CheckCalendar(after.BillingAnchorDay, after.TimeZone); err != nil {
			return err
		}
		if plan == nil && reflect.DeepEqual(after, before) {
			out = before
			return nil // nothing changes: nothing to write or audit
		}
		wantReset := false
		if plan != nil {
			if wantReset, err = planTx(ctx, tx, before, &after, *plan, now); err != nil {
				return err
			}
		}
		tier, err := tierTx(ctx, tx, after.Tier, "FOR SHARE")
		if quota.ErrorCode(err) == quota.CodeNotFound {
			return quota.FieldError("tier", "no tier %q", after.Tier)
		}
		if err != nil {
			return err
		}
		if err := tier.CheckOverrides(after.Overrides); err != nil {
			return quota.OverridesError(err)
		}
		if after.Tier != before.Tier {
			after.PendingChange = nil // a change made now supersedes the one planned
		}
		if out, err = writeTenantTx(ctx, tx, before.ID, after); err != nil {
			return err
		}
		if out.Tier != before.Tier {
			if err := moveTierTx(ctx, tx, out.ID, out.Tier, out.UpdatedAt); err != nil {
				return err
			}
			if wantReset {
				if reset, err = recordResetTx(ctx, tx, out, out.UpdatedAt); err != nil {
					return err
				}
			}
		}
		return audit(ctx, tx, actor, "update", "tenant", out.ID, before, out)
	})
	if err != nil {
		return quota.Tenant{}, nil, err
	}
	return out, reset, nil
}

// DeleteTenant deletes a tenant with its keys, grants, usage and draft
// invoices. A tenant with a final invoice cannot be deleted (CodeConflict):
// suspend it instead.
func (s *Store) DeleteTenant(ctx context.Context, actor, id string) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		before, err := tenantTx(ctx, tx, id, "FOR UPDATE")
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM invoices WHERE tenant_id = $1 AND status = 'draft'`, before.ID); err != nil {
			return fmt.Errorf("postgres: delete draft invoices: %w", err)
		}
		_, err = tx.Exec(ctx, `DELETE FROM tenants WHERE id = $1`, before.ID)
		if isForeignKeyViolation(err) {
			return quota.Errorf(quota.CodeConflict, "tenant %s has final invoices; suspend it instead", id)
		}
		if err != nil {
			return fmt.Errorf("postgres: delete tenant: %w", err)
		}
		return audit(ctx, tx, actor, "delete", "tenant", before.ID, before, nil)
	})
}

// ListKeys returns a tenant's keys (never their secrets), oldest first.
func (s *Store) ListKeys(ctx context.Context, tenantID string, p quota.Page) ([]quota.APIKey, *string, error) {
	if _, err := tenantTx(ctx, s.db, tenantID, ""); err != nil {
		return nil, nil, err
	}
	c, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT `+keyColumns+` FROM api_keys k WHERE k.tenant_id = $1
		AND ($2 = '' OR (k.created_at, k.id::text) > ($3, $2)) ORDER BY k.created_at, k.id LIMIT $4`,
		tenantID, c.ID, c.At, p.Limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (quota.APIKey, error) {
		var k quota.APIKey
		return k, row.Scan(keyDest(&k)...)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list keys: %w", err)
	}
	items, next := pageOf(keys, p.Limit, func(k quota.APIKey) cursor { return cursor{At: k.CreatedAt, ID: k.ID} })
	return items, next, nil
}

// Key returns one API key (never its secret), or a CodeNotFound error.
func (s *Store) Key(ctx context.Context, id string) (quota.APIKey, error) {
	return keyTx(ctx, s.db, id, "")
}

func keyTx(ctx context.Context, q querier, id, lock string) (quota.APIKey, error) {
	var k quota.APIKey
	err := q.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys k WHERE k.id::text = $1 `+lock, id).Scan(keyDest(&k)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return k, quota.Errorf(quota.CodeNotFound, "no key %q", id)
	}
	if err != nil {
		return k, fmt.Errorf("postgres: key: %w", err)
	}
	return k, nil
}

// RevokeKey revokes a key at once; revoking a revoked key changes nothing.
func (s *Store) RevokeKey(ctx context.Context, actor, id string) (quota.APIKey, error) {
	var out quota.APIKey
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		before, err := keyTx(ctx, tx, id, "FOR UPDATE")
		if err != nil {
			return err
		}
		if before.RevokedAt != nil {
			out = before
			return nil
		}
		if err := tx.QueryRow(ctx, `UPDATE api_keys k SET revoked_at = now() WHERE id = $1 RETURNING `+keyColumns, before.ID).
			Scan(keyDest(&out)...); err != nil {
			return fmt.Errorf("postgres: revoke key: %w", err)
		}
		return audit(ctx, tx, actor, "update", "api_key", out.ID, before, out)
	})
	return out, err
}

// RotateKey issues a new key for the old key's tenant and lets the old one
// expire after grace (at once when grace is 0). It returns both.
func (s *Store) RotateKey(ctx context.Context, actor, id, name string, grace time.Duration) (quota.IssuedKey, quota.APIKey, error) {
	var fresh quota.IssuedKey
	var old quota.APIKey
	if err := quota.CheckKeyName(name); err != nil {
		return fresh, old, err
	}
	k, err := apikey.New()
	if err != nil {
		return fresh, old, fmt.Errorf("postgres: new key: %w", err)
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		before, err := keyTx(ctx, tx, id, "FOR UPDATE")
		if err != nil {
			return err
		}
		if before.RevokedAt != nil {
			return quota.Errorf(quota.CodeConflict, "key %s is revoked", id)
		}
		if name == "" {
			name = before.Name
		}
		if err := tx.QueryRow(ctx, `UPDATE api_keys k SET expires_at = LEAST(coalesce(expires_at, 'infinity'), now() + $2)
			WHERE id = $1 RETURNING `+keyColumns, before.ID, grace).Scan(keyDest(&old)...); err != nil {
			return fmt.Errorf("postgres: expire old key: %w", err)
		}
		if err := audit(ctx, tx, actor, "update", "api_key", old.ID, before, old); err != nil {
			return err
		}
		fresh, err = insertKey(ctx, tx, actor, before.TenantID, name, k, nil)
		return err
	})
	return fresh, old, err
}

func insertKey(ctx context.Context, tx pgx.Tx, actor, tenantID, name string, k apikey.Key, expires *time.Time) (quota.IssuedKey, error) {
	out := quota.IssuedKey{Secret: k.Secret}
	err := tx.QueryRow(ctx, `
		INSERT INTO api_keys (tenant_id, prefix, secret_sha256, name, expires_at) VALUES ($1, $2, $3, $4, $5)
		RETURNING id, tenant_id, prefix, name, created_at, last_used_at, revoked_at, expires_at`,
		tenantID, k.Prefix, k.Hash[:], name, expires).Scan(keyDest(&out.APIKey)...)
	if isForeignKeyViolation(err) {
		return out, quota.Errorf(quota.CodeNotFound, "no tenant %q", tenantID)
	}
	if err != nil {
		return out, fmt.Errorf("postgres: insert key: %w", err)
	}
	return out, audit(ctx, tx, actor, "create", "api_key", out.ID, nil, out.APIKey)
}

const grantColumns = `id, tenant_id, period, to_char(period_start, 'YYYY-MM-DD'), units, created_at, applied_at IS NOT NULL`

func grantDest(g *quota.Grant) []any {
	return []any{&g.ID, &g.TenantID, &g.Period, &g.PeriodStart, &g.Units, &g.CreatedAt, &g.Applied}
}

func collectGrants(rows pgx.Rows) ([]quota.Grant, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (quota.Grant, error) {
		var g quota.Grant
		return g, row.Scan(grantDest(&g)...)
	})
}

// CreateGrant records a grant of units for the tenant's period ("day" or
// "month") starting at start, not yet applied.
func (s *Store) CreateGrant(ctx context.Context, actor, tenantID, period string, start time.Time, units int64) (quota.Grant, error) {
	g, _, err := s.CreateGrantIdempotent(ctx, actor, tenantID, "", period, start, units)
	return g, err
}

// CreateGrantIdempotent is CreateGrant under an idempotency key (the admin's
// Idempotency-Key; "" for none): it records at most one grant per tenant and
// key. A repeat with the same period and units returns the grant first
// recorded, with created false, and records nothing; with another period or
// units it is a CodeMismatch error.
func (s *Store) CreateGrantIdempotent(ctx context.Context, actor, tenantID, key, period string, start time.Time, units int64) (g quota.Grant, created bool, err error) {
	var idem *string
	if key != "" {
		idem = &key
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tenantTx(ctx, tx, tenantID, "FOR SHARE"); err != nil {
			return err
		}
		// A concurrent insert with the same key makes this one wait for its
		// commit, then do nothing: the select below finds its grant.
		err := tx.QueryRow(ctx, `INSERT INTO grants (tenant_id, period, period_start, units, idempotency_key)
			VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
			RETURNING `+grantColumns, tenantID, period, start, units, idem).Scan(grantDest(&g)...)
		if err == nil {
			created = true
			return audit(ctx, tx, actor, "create", "grant", g.ID, nil, g)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("postgres: insert grant: %w", err)
		}
		err = tx.QueryRow(ctx, `SELECT `+grantColumns+` FROM grants WHERE tenant_id = $1 AND idempotency_key = $2`,
			tenantID, key).Scan(grantDest(&g)...)
		if err != nil {
			return fmt.Errorf("postgres: grant by idempotency key: %w", err)
		}
		if g.Period != period || g.Units != units {
			return &quota.Error{Code: quota.CodeMismatch, Field: "Idempotency-Key", Message: fmt.Sprintf(
				"the key was used for a grant of %d units for a %s (%s); use a new key for another grant", g.Units, g.Period, g.ID)}
		}
		return nil
	})
	return g, created, err
}

// MarkGrantApplied records that the grant id is in the tenant's live
// counter; marking it twice is no harm.
func (s *Store) MarkGrantApplied(ctx context.Context, id string) error {
	if _, err := s.db.Exec(ctx, `UPDATE grants SET applied_at = now() WHERE id = $1 AND applied_at IS NULL`, id); err != nil {
		return fmt.Errorf("postgres: mark grant applied: %w", err)
	}
	return nil
}

// UnappliedGrants returns the grants not applied yet whose period may be
// the current one of their tenant's calendar, at UTC day dayStart and UTC
// month monthStart: day grants of the dates around dayStart, month grants
// since the previous month, newest first, at most 1,000 of them.
func (s *Store) UnappliedGrants(ctx context.Context, dayStart, monthStart time.Time) ([]quota.Grant, error) {
	// A grant's period start is the first local date of its period in the
	// tenant's billing calendar (catalog.Grants), which may be a day either
	// side of the UTC date and, with an anchor, any day since the previous
	// UTC month's start: those are taken, newest first, and the live
	// counter tells which are current (the others are left, and age out of
	// the range). The range lets the partial index of unapplied grants
	// serve.
	rows, err := s.db.Query(ctx, `SELECT `+grantColumns+` FROM grants
		WHERE applied_at IS NULL AND period_start BETWEEN $2::date AND $3::date
		  AND (period = 'day' AND period_start BETWEEN $1::date - 1 AND $1::date + 1 OR period = 'month')
		ORDER BY created_at DESC, id LIMIT 1000`, dayStart, monthStart.AddDate(0, -1, 0), dayStart.AddDate(0, 0, 1))
	if err != nil {
		return nil, fmt.Errorf("postgres: unapplied grants: %w", err)
	}
	grants, err := collectGrants(rows)
	if err != nil {
		return nil, fmt.Errorf("postgres: unapplied grants: %w", err)
	}
	return grants, nil
}

// Grant returns one of a tenant's grants, or a CodeNotFound error.
func (s *Store) Grant(ctx context.Context, tenantID, id string) (quota.Grant, error) {
	var g quota.Grant
	err := s.db.QueryRow(ctx, `SELECT `+grantColumns+` FROM grants WHERE tenant_id::text = $1 AND id::text = $2`,
		tenantID, id).Scan(grantDest(&g)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return g, quota.Errorf(quota.CodeNotFound, "no grant %q of tenant %q", id, tenantID)
	}
	if err != nil {
		return g, fmt.Errorf("postgres: grant: %w", err)
	}
	return g, nil
}

// ListGrants returns a tenant's grants, newest first.
func (s *Store) ListGrants(ctx context.Context, tenantID string, p quota.Page) ([]quota.Grant, *string, error) {
	if _, err := tenantTx(ctx, s.db, tenantID, ""); err != nil {
		return nil, nil, err
	}
	c, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT `+grantColumns+`
		FROM grants WHERE tenant_id = $1 AND ($2 = '' OR (created_at, id::text) < ($3, $2))
		ORDER BY created_at DESC, id DESC LIMIT $4`, tenantID, c.ID, c.At, p.Limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list grants: %w", err)
	}
	gs, err := collectGrants(rows)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list grants: %w", err)
	}
	items, next := pageOf(gs, p.Limit, func(g quota.Grant) cursor { return cursor{At: g.CreatedAt, ID: g.ID} })
	return items, next, nil
}

// AuditSettlement records a settlement in the audit log (entity
// "settlement", its request id), by actor (quota.SettleByService or
// quota.SettleByUpstream). The settlement itself was applied in Redis
// before: its entry follows, in a transaction of its own.
func (s *Store) AuditSettlement(ctx context.Context, actor string, r quota.SettlementRecord) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		return audit(ctx, tx, actor, "create", "settlement", r.RequestID, nil, r)
	})
}

// ListAudit returns audit entries, newest first, optionally of one entity.
func (s *Store) ListAudit(ctx context.Context, entity, entityID string, p quota.Page) ([]quota.AuditEntry, *string, error) {
	c, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, nil, err
	}
	before := int64(1) << 62
	if c.ID != "" {
		before = c.N
	}
	rows, err := s.db.Query(ctx, `SELECT id, at, actor, action, entity, entity_id, coalesce(before, 'null'), coalesce(after, 'null')
		FROM audit_log WHERE ($1 = '' OR entity = $1) AND ($2 = '' OR entity_id = $2) AND id < $3
		ORDER BY id DESC LIMIT $4`, entity, entityID, before, p.Limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list audit: %w", err)
	}
	es, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (quota.AuditEntry, error) {
		var e quota.AuditEntry
		return e, row.Scan(&e.ID, &e.At, &e.Actor, &e.Action, &e.Entity, &e.EntityID, &e.Before, &e.After)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list audit: %w", err)
	}
	items, next := pageOf(es, p.Limit, func(e quota.AuditEntry) cursor { return cursor{ID: "a", N: e.ID} })
	return items, next, nil
}
