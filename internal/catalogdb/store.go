package catalogdb

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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

// CreateTenant creates a tenant on an existing tier with no overrides.
func (s *Store) CreateTenant(ctx context.Context, actor, name, tier string) (quota.Tenant, error) {
	return s.CreateTenantWith(ctx, actor, quota.Tenant{Name: name, Tier: tier})
}

func newWebhookSecret() ([]byte, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("postgres: webhook secret: %w", err)
	}
	return secret, nil
}

// IssueKey makes a new API key for tenantID, valid until expires (nil:
// until revoked), and returns it with its secret, which is not stored and
// cannot be shown again.
func (s *Store) IssueKey(ctx context.Context, actor, tenantID, name string, expires ...time.Time) (quota.IssuedKey, error) {
	if err := quota.CheckKeyName(name); err != nil {
		return quota.IssuedKey{}, err
	}
	k, err := apikey.New()
	if err != nil {
		return quota.IssuedKey{}, fmt.Errorf("postgres: new key: %w", err)
	}
	var exp *time.Time
	if len(expires) > 0 {
		exp = &expires[0]
	}
	var out quota.IssuedKey
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tenantTx(ctx, tx, tenantID, "FOR SHARE"); err != nil {
			return err
		}
		out, err = insertKey(ctx, tx, actor, tenantID, name, k, exp)
		return err
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

// CreateTier validates and inserts a tier. A duplicate slug or rank is a
// CodeConflict error naming the field.
func (s *Store) CreateTier(ctx context.Context, actor string, t quota.Tier) (quota.Tier, error) {
	if err := quota.CheckName("name", t.Name); err != nil {
		return quota.Tier{}, err
	}
	if err := t.Validate(); err != nil {
		return quota.Tier{}, err
	}
	var out quota.Tier
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO tiers (`+tierColumns+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
			RETURNING `+tierColumns,
			t.Slug, t.Name, t.Rank, t.PriceCents, t.BurstRate, t.Burst, t.BucketCapacity, t.BucketRefillPerSec,
			t.DailyQuota, t.MonthlyQuota, t.Overage, t.OveragePriceCentsPer1K, t.FailOpen, t.UpgradeURL, t.MaxOverageCents,
			meterQuotas(t), billing(t), t.TopUpURL).
			Scan(tierDest(&out)...)
		if c := uniqueViolation(err); c != "" {
			if c == "tiers_pkey" {
				return &quota.Error{Code: quota.CodeConflict, Field: "slug", Message: fmt.Sprintf("a tier %q exists", t.Slug)}
			}
			return rankTaken(t.Rank)
		}
		if err != nil {
			return fmt.Errorf("postgres: insert tier: %w", err)
		}
		if err := recordPriceTx(ctx, tx, out); err != nil {
			return err
		}
		return audit(ctx, tx, actor, "create", "tier", out.Slug, nil, out)
	})
	return out, err
}

// rankTaken is the error of a tier given a rank another tier has: a
// conflict with that tier, as a slug taken is.
func rankTaken(rank int) error {
	return &quota.Error{Code: quota.CodeConflict, Field: "rank", Message: fmt.Sprintf("another tier has rank %d; ranks are unique", rank)}
}

// uniqueViolation returns the constraint name of a unique violation, or "".
func uniqueViolation(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return pe.ConstraintName
	}
	return ""
}

// TouchKeys records when keys were last used (prefix to time); a key's
// last_used_at only moves forward.
func (s *Store) TouchKeys(ctx context.Context, used map[string]time.Time) error {
	if len(used) == 0 {
		return nil
	}
	prefixes := make([]string, 0, len(used))
	times := make([]time.Time, 0, len(used))
	for p, t := range used {
		prefixes = append(prefixes, p)
		times = append(times, t)
	}
	_, err := s.db.Exec(ctx, `UPDATE api_keys k SET last_used_at = greatest(k.last_used_at, u.at)
		FROM unnest($1::text[], $2::timestamptz[]) AS u(prefix, at) WHERE k.prefix = u.prefix`, prefixes, times)
	if err != nil {
		return fmt.Errorf("postgres: touch keys: %w", err)
	}
	return nil
}
