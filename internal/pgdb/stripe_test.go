package pgdb_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/pgdb"
)

// TestStripeExportMigrationDownAndUp: 000015 down drops the export queue
// and the tenants' Stripe customer ids, and up brings both back, empty;
// the schema refuses an export that says exported without its Stripe
// invoice or time.
func TestStripeExportMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, db := migratedPool(t)
	tenant, err := catalogdb.NewStore(db).CreateTenant(ctx, "test", "acme", "free")
	if err != nil {
		t.Fatal(err)
	}
	var inv string
	if err := db.QueryRow(ctx, `INSERT INTO invoices (tenant_id, period, status, finalized_at) VALUES ($1, '2026-11-01', 'final', now())
		RETURNING id::text`, tenant.ID).Scan(&inv); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`INSERT INTO invoice_exports (invoice_id, status) VALUES ('` + inv + `', 'exported')`,
		`INSERT INTO invoice_exports (invoice_id, status, stripe_invoice_id) VALUES ('` + inv + `', 'exported', 'in_1')`,
		`INSERT INTO invoice_exports (invoice_id, status) VALUES ('` + inv + `', 'lost')`,
		`INSERT INTO invoice_exports (invoice_id, stripe_invoice_id) VALUES ('` + inv + `', 'in 1; drop')`,
		`UPDATE tenants SET stripe_customer_id = '' WHERE id = '` + tenant.ID + `'`,
	} {
		if _, err := db.Exec(ctx, sql); err == nil {
			t.Errorf("%s: accepted, want a constraint violation", sql)
		}
	}
	mustExec(t, db, `UPDATE tenants SET stripe_customer_id = 'cus_123' WHERE id = $1`, tenant.ID)
	mustExec(t, db, `INSERT INTO invoice_exports (invoice_id, status, stripe_invoice_id, exported_at) VALUES ($1, 'exported', 'in_1', now())`, inv)

	m := migrator(t, url)
	if err := m.Migrate(13); err != nil {
		t.Fatalf("down to 13: %v", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM information_schema.tables WHERE table_name = 'invoice_exports') +
		(SELECT count(*) FROM information_schema.columns WHERE table_name = 'tenants' AND column_name = 'stripe_customer_id')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after down: %d of the table and column left (%v), want none", n, err)
	}
	if err := m.Up(); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if err := pgdb.SchemaCurrent(ctx, db); err != nil {
		t.Fatal(err)
	}
	var cust *string
	if err := db.QueryRow(ctx, `SELECT stripe_customer_id, (SELECT count(*) FROM invoice_exports) FROM tenants WHERE id = $1`, tenant.ID).
		Scan(&cust, &n); err != nil || cust != nil || n != 0 {
		t.Fatalf("after up again: customer %v, %d exports (%v); want none", cust, n, err)
	}
}

func mustExec(tb testing.TB, db *pgxpool.Pool, sql string, args ...any) {
	tb.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}
