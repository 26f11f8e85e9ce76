// Package pgdb opens Tollgate's Postgres pool and applies the embedded
// migrations with golang-migrate: the twin of internal/redisdb.
//
// It holds no query of any table of the product: it reads only the
// migration runner's own version (schema_migrations). The catalog's tables
// are internal/catalogdb's; usage, invoices and credits are
// internal/billing's, on the pool this package opens.
package pgdb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers pgx5://
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/migrations"
)

// Open connects a pool to the database at url and checks that it answers.
func Open(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse DATABASE_URL: %w", err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	// Sessions run in UTC, whatever the server's or the database's default:
	// a date and a timestamptz meet in SQL (a month's first day as a date
	// and as an instant) only through the session's time zone, and
	// Tollgate's months and days are UTC's. (A timezone the URL sets is
	// kept.)
	if _, set := cfg.ConnConfig.RuntimeParams["timezone"]; !set {
		cfg.ConnConfig.RuntimeParams["timezone"] = "UTC"
	}
	cfg.AfterConnect = registerUUID
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: ping %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

func newMigrate(dbURL string) (*migrate.Migrate, error) {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("postgres: migrations source: %w", err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse DATABASE_URL: %w", err)
	}
	u.Scheme = "pgx5"
	m, err := migrate.NewWithSourceInstance("iofs", src, u.String())
	if err != nil {
		return nil, fmt.Errorf("postgres: migrate: %w", err)
	}
	m.LockTimeout = time.Minute
	return m, nil
}

func closeMigrate(m *migrate.Migrate, err error) error {
	srcErr, dbErr := m.Close()
	return errors.Join(err, srcErr, dbErr)
}

// MigrateUp applies every embedded migration not yet applied. It takes
// golang-migrate's advisory lock, so several binaries starting at once are safe.
func MigrateUp(dbURL string) error {
	m, err := newMigrate(dbURL)
	if err != nil {
		return err
	}
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return closeMigrate(m, fmt.Errorf("postgres: migrate up: %w", err))
	}
	return closeMigrate(m, nil)
}

// MigrateDown reverts every migration. Tests use it; the binaries never do.
func MigrateDown(dbURL string) error {
	m, err := newMigrate(dbURL)
	if err != nil {
		return err
	}
	if err := m.Down(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return closeMigrate(m, fmt.Errorf("postgres: migrate down: %w", err))
	}
	return closeMigrate(m, nil)
}

var migrationName = regexp.MustCompile(`^(\d+)_.*\.up\.sql$`)

// LatestVersion is the version of the newest embedded migration.
func LatestVersion() uint {
	var latest uint
	entries, _ := fs.ReadDir(migrations.FS, ".")
	for _, e := range entries {
		if m := migrationName.FindStringSubmatch(e.Name()); m != nil {
			if v, err := strconv.ParseUint(m[1], 10, 32); err == nil && uint(v) > latest {
				latest = uint(v)
			}
		}
	}
	return latest
}

// SchemaCurrent reports an error unless the database's schema is at
// LatestVersion and not dirty.
func SchemaCurrent(ctx context.Context, db *pgxpool.Pool) error {
	var version int64
	var dirty bool
	err := db.QueryRow(ctx, `SELECT version, dirty FROM schema_migrations LIMIT 1`).Scan(&version, &dirty)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("postgres: no migration applied")
	}
	if err != nil {
		return fmt.Errorf("postgres: schema version: %w", err)
	}
	if dirty || version < 0 || uint64(version) != uint64(LatestVersion()) {
		return fmt.Errorf("postgres: schema at version %d (dirty %t), want %d", version, dirty, LatestVersion())
	}
	return nil
}

// OpenMigrated applies the embedded migrations and opens a pool: what every
// binary does at start.
func OpenMigrated(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	if err := MigrateUp(dbURL); err != nil {
		return nil, err
	}
	return Open(ctx, dbURL)
}
