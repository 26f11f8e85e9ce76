package pgdb_test

import (
	"context"
	neturl "net/url"
	"testing"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/migrations"
)

func TestMigrateUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.NewDatabase(t)
	for i, step := range []func(string) error{pgdb.MigrateUp, pgdb.MigrateDown, pgdb.MigrateUp, pgdb.MigrateUp} {
		if err := step(url); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	db, err := pgdb.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := pgdb.SchemaCurrent(ctx, db); err != nil {
		t.Fatalf("SchemaCurrent after up/down/up: %v", err)
	}
	var tiers []string
	rows, err := db.Query(ctx, `SELECT slug FROM tiers ORDER BY rank`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		tiers = append(tiers, s)
	}
	if got, want := len(tiers), 3; got != want || tiers[0] != "free" || tiers[1] != "pro" || tiers[2] != "enterprise" {
		t.Fatalf("tiers = %v, want [free pro enterprise]", tiers)
	}

	if err := pgdb.MigrateDown(url); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public' AND table_name <> 'schema_migrations'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("after down to zero: %d tables left, want 0", n)
	}
	if err := pgdb.SchemaCurrent(ctx, db); err == nil {
		t.Fatal("SchemaCurrent after down: no error, want one")
	}
}

// TestConstraints checks that the schema itself refuses inconsistent data.
func TestConstraints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	store := catalogdb.NewStore(db)
	tenant, err := store.CreateTenant(ctx, "test", "acme", "free")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, sql string }{
		{"negative quota", `INSERT INTO tiers (slug, name, rank, price_cents, daily_quota) VALUES ('neg', 'Neg', 99, 0, -1)`},
		{"negative price", `INSERT INTO tiers (slug, name, rank, price_cents) VALUES ('neg', 'Neg', 99, -5)`},
		{"duplicate rank", `INSERT INTO tiers (slug, name, rank, price_cents) VALUES ('dup', 'Dup', 0, 0)`},
		{"bad slug", `INSERT INTO tiers (slug, name, rank, price_cents) VALUES ('Bad Slug', 'B', 98, 0)`},
		{"burst without rate", `INSERT INTO tiers (slug, name, rank, price_cents, burst) VALUES ('half', 'H', 97, 0, 5)`},
		{"bill without price", `INSERT INTO tiers (slug, name, rank, price_cents, overage) VALUES ('b', 'B', 96, 0, 'bill')`},
		{"unknown tier", `INSERT INTO tenants (name, tier, webhook_secret) VALUES ('x', 'nope', '\x000102030405060708090a0b0c0d0e0f1011121314151617')`},
		{"unknown status", `UPDATE tenants SET status = 'gone' WHERE id = '` + tenant.ID + `'`},
		{"negative usage", `INSERT INTO usage (tenant_id, hour, meter, units) VALUES ('` + tenant.ID + `', '2026-01-01T00:00:00Z', 'demo', -1)`},
		{"usage off the hour", `INSERT INTO usage (tenant_id, hour, meter, units) VALUES ('` + tenant.ID + `', '2026-01-01T00:30:00Z', 'demo', 1)`},
		{"overage above units", `INSERT INTO usage (tenant_id, hour, meter, units, overage_units) VALUES ('` + tenant.ID + `', '2026-01-01T00:00:00Z', 'demo', 1, 2)`},
		{"negative shadow refusals", `INSERT INTO usage (tenant_id, hour, meter, shadow_refused) VALUES ('` + tenant.ID + `', '2026-01-01T00:00:00Z', 'demo', -1)`},
		{"negative degraded", `INSERT INTO usage (tenant_id, hour, meter, degraded) VALUES ('` + tenant.ID + `', '2026-01-01T00:00:00Z', 'demo', -1)`},
		{"invoice mid-month", `INSERT INTO invoices (tenant_id, period) VALUES ('` + tenant.ID + `', '2026-01-15')`},
		{"final invoice without time", `INSERT INTO invoices (tenant_id, period, status) VALUES ('` + tenant.ID + `', '2026-01-01', 'final')`},
		{"alert at 50 %", `INSERT INTO alerts (tenant_id, period, threshold, units, quota) VALUES ('` + tenant.ID + `', '2026-01-01', 50, 1, 2)`},
		{"delete a used tier", `DELETE FROM tiers WHERE slug = 'free'`},
		{"negative spend cap", `INSERT INTO tiers (slug, name, rank, price_cents, overage, overage_price_cents_per_1k, max_overage_cents) VALUES ('c', 'C', 95, 0, 'bill', 1, -1)`},
		{"spend cap past 2^40", `INSERT INTO tiers (slug, name, rank, price_cents, overage, overage_price_cents_per_1k, max_overage_cents) VALUES ('c', 'C', 95, 0, 'bill', 1, 1099511627777)`},
		{"spend cap on a block tier", `INSERT INTO tiers (slug, name, rank, price_cents, max_overage_cents) VALUES ('c', 'C', 95, 0, 5)`},
	} {
		if _, err := db.Exec(ctx, tc.sql); err == nil {
			t.Errorf("%s: accepted, want a constraint violation", tc.name)
		}
	}
}

// TestSeededUpgradeHintsLinkToTheirTier checks the seeded tiers' upgrade
// URLs: the hint of each tier names the next one up and links to where that
// tier is bought.
func TestSeededUpgradeHintsLinkToTheirTier(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	tiers, err := catalogdb.NewStore(db).Tiers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"free": "https://tollgate.example/pricing?upgrade=pro",
		"pro":  "https://tollgate.example/contact-sales",
	}
	for _, tier := range tiers {
		up := quota.UpgradeFor(tier, tiers)
		w, ok := want[tier.Slug]
		switch {
		case !ok && up != nil:
			t.Errorf("%s: upgrade hint %+v, want none (top tier)", tier.Slug, up)
		case ok && (up == nil || up.URL != w):
			t.Errorf("%s: upgrade hint %+v, want URL %s", tier.Slug, up, w)
		}
	}
}

// TestSpendCapMigrationDownAndUp: 000008 down drops the tiers' spend caps
// (tenants' overrides keep theirs as JSON, which older versions ignore),
// and up again brings the column back, empty.
func TestSpendCapMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, db := migratedPool(t)
	store := catalogdb.NewStore(db)
	cents := int64(500)
	tier := quota.Tier{Slug: "capped", Name: "Capped", Rank: 50, Overage: quota.OverageBill, OveragePriceCentsPer1K: 10,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(1000)), MaxOverageCents: &cents}}
	if _, err := store.CreateTier(ctx, "test", tier); err != nil {
		t.Fatal(err)
	}
	m := migrator(t, url)
	if err := m.Migrate(7); err != nil {
		t.Fatalf("down to 7: %v", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'tiers' AND column_name = 'max_overage_cents'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after down: %d max_overage_cents columns (%v), want none", n, err)
	}
	if err := m.Up(); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if err := pgdb.SchemaCurrent(ctx, db); err != nil {
		t.Fatal(err)
	}
	got, err := store.Tier(ctx, "capped")
	if err != nil || got.MaxOverageCents != nil || got.Rank != 50 {
		t.Fatalf("after up again: %+v, %v; want the tier without a cap", got, err)
	}
}

// migratedPool returns a migrated database of the test's own: its URL and
// a pool on it, closed when the test ends.
func migratedPool(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := testenv.MigratedDatabase(t)
	db, err := pgdb.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return url, db
}

// migrator returns golang-migrate on the database at url, with the
// embedded migrations, to step a test's schema down and up.
func migrator(t *testing.T, url string) *migrate.Migrate {
	t.Helper()
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	u, _ := neturl.Parse(url)
	u.Scheme = "pgx5"
	m, err := migrate.NewWithSourceInstance("iofs", src, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestOpenRunsSessionsInUTC: a pool from Open runs in UTC even when the
// database's default time zone is another, unless the URL names one.
func TestOpenRunsSessionsInUTC(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, db := migratedPool(t)
	var name string
	if err := db.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `ALTER DATABASE `+name+` SET TimeZone = 'Pacific/Kiritimati'`); err != nil {
		t.Fatal(err)
	}
	zone := func(url string) string {
		t.Helper()
		p, err := pgdb.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var z string
		if err := p.QueryRow(ctx, `SHOW TimeZone`).Scan(&z); err != nil {
			t.Fatal(err)
		}
		return z
	}
	if z := zone(url); z != "UTC" {
		t.Fatalf("a session of Open: TimeZone %q, want UTC", z)
	}
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("timezone", "Asia/Tokyo")
	u.RawQuery = q.Encode()
	if z := zone(u.String()); z != "Asia/Tokyo" {
		t.Fatalf("a session of Open with the URL's timezone: %q, want Asia/Tokyo", z)
	}
}
