package postgres

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/apikey"
	"github.com/tollgate/tollgate/internal/quota"
)

// Store reads and writes tiers, tenants and API keys. Public methods open the
// transaction; unexported helpers take a pgx.Tx.
type Store struct {
	db *pgxpool.Pool
}

// NewStore returns a Store on db.
func NewStore(db *pgxpool.Pool) *Store { return &Store{db: db} }

// CreateTenant creates a tenant on an existing tier, recording its tier
// history and an audit entry by actor.
func (s *Store) CreateTenant(ctx context.Context, actor, name, tier string) (quota.Tenant, error) {
	if name == "" || len(name) > quota.MaxNameLen {
		return quota.Tenant{}, quota.FieldError("name", "must be 1 to %d characters", quota.MaxNameLen)
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return quota.Tenant{}, fmt.Errorf("postgres: webhook secret: %w", err)
	}
	var t quota.Tenant
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			INSERT INTO tenants (name, tier, webhook_secret) VALUES ($1, $2, $3)
			RETURNING `+tenantColumns, name, tier, secret).
			Scan(tenantDest(&t)...)
		if isForeignKeyViolation(err) {
			return quota.FieldError("tier", "no tier %q", tier)
		}
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

// IssueKey makes a new API key for tenantID and returns it with its secret,
// which is not stored and cannot be shown again.
func (s *Store) IssueKey(ctx context.Context, actor, tenantID, name string) (quota.IssuedKey, error) {
	if len(name) > quota.MaxNameLen {
		return quota.IssuedKey{}, quota.FieldError("name", "must be at most %d characters", quota.MaxNameLen)
	}
	k, err := apikey.New()
	if err != nil {
		return quota.IssuedKey{}, fmt.Errorf("postgres: new key: %w", err)
	}
	out := quota.IssuedKey{Secret: k.Secret}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			INSERT INTO api_keys (tenant_id, prefix, secret_sha256, name) VALUES ($1, $2, $3, $4)
			RETURNING id, tenant_id, prefix, name, created_at`,
			tenantID, k.Prefix, k.Hash[:], name).
			Scan(&out.ID, &out.TenantID, &out.Prefix, &out.Name, &out.CreatedAt)
		if isForeignKeyViolation(err) {
			return quota.Errorf(quota.CodeNotFound, "no tenant %q", tenantID)
		}
		if err != nil {
			return fmt.Errorf("postgres: insert key: %w", err)
		}
		return audit(ctx, tx, actor, "create", "api_key", out.ID, nil, out.APIKey)
	})
	return out, err
}

// audit records one admin change in the change's own transaction.
func audit(ctx context.Context, tx pgx.Tx, actor, action, entity, id string, before, after any) error {
	enc := func(v any) ([]byte, error) {
		if v == nil {
			return nil, nil
		}
		return json.Marshal(v)
	}
	b, err := enc(before)
	if err != nil {
		return fmt.Errorf("postgres: audit: %w", err)
	}
	a, err := enc(after)
	if err != nil {
		return fmt.Errorf("postgres: audit: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO audit_log (actor, action, entity, entity_id, before, after) VALUES ($1, $2, $3, $4, $5, $6)`,
		actor, action, entity, id, b, a); err != nil {
		return fmt.Errorf("postgres: audit: %w", err)
	}
	return nil
}

func isForeignKeyViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23503"
}

// Exec runs one statement; tests use it to change rows behind the cache.
func (s *Store) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return s.db.Exec(ctx, sql, args...)
}

// CreateTier validates and inserts a tier. A duplicate slug or rank is a
// CodeConflict error.
func (s *Store) CreateTier(ctx context.Context, actor string, t quota.Tier) (quota.Tier, error) {
	if err := t.Validate(); err != nil {
		return quota.Tier{}, err
	}
	var out quota.Tier
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO tiers (`+tierColumns+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
			RETURNING `+tierColumns,
			t.Slug, t.Name, t.Rank, t.PriceCents, t.BurstRate, t.Burst, t.BucketCapacity, t.BucketRefillPerSec,
			t.DailyQuota, t.MonthlyQuota, t.Overage, t.OveragePriceCentsPer1K, t.FailOpen, t.UpgradeURL).
			Scan(tierDest(&out)...)
		if c := uniqueViolation(err); c != "" {
			if c == "tiers_pkey" {
				return &quota.Error{Code: quota.CodeConflict, Field: "slug", Message: fmt.Sprintf("a tier %q exists", t.Slug)}
			}
			return &quota.Error{Code: quota.CodeConflict, Field: "rank", Message: fmt.Sprintf("another tier has rank %d", t.Rank)}
		}
		if err != nil {
			return fmt.Errorf("postgres: insert tier: %w", err)
		}
		return audit(ctx, tx, actor, "create", "tier", out.Slug, nil, out)
	})
	return out, err
}

// uniqueViolation returns the constraint name of a unique violation, or "".
func uniqueViolation(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return pe.ConstraintName
	}
	return ""
}
