package billing

import (
	"context"
	"net/url"
	"testing"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/migrations"
)

// migratablePool returns a pool on a migrated database of the test's own,
// and golang-migrate on the same database with the embedded migrations, for
// the migration tests to step its schema down and up.
func migratablePool(t *testing.T) (*pgxpool.Pool, *migrate.Migrate) {
	t.Helper()
	dbURL := testenv.MigratedDatabase(t)
	db, err := pgdb.Open(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Scheme = "pgx5"
	m, err := migrate.NewWithSourceInstance("iofs", src, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return db, m
}
