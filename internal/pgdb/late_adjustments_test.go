package pgdb_test

import (
	"context"
	"testing"
)

// TestLateAdjustmentsMigrationDownAndUp: 000014 down drops the late
// adjustments of final invoices and up creates the table again, whose
// checks refuse a credit above what the period charged.
func TestLateAdjustmentsMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, db := migratedPool(t)
	exists := func() bool {
		t.Helper()
		var ok bool
		if err := db.QueryRow(ctx, `SELECT to_regclass('invoice_late_adjustments') IS NOT NULL`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !exists() {
		t.Fatal("no invoice_late_adjustments after the migrations")
	}
	m := migrator(t, url)
	if err := m.Migrate(13); err != nil {
		t.Fatalf("down to 13: %v", err)
	}
	if exists() {
		t.Fatal("invoice_late_adjustments left after down")
	}
	if err := m.Up(); err != nil {
		t.Fatalf("up again: %v", err)
	}
	var tenant, invoice string
	if err := db.QueryRow(ctx, `INSERT INTO tenants (name, tier, webhook_secret) VALUES ('acme', 'pro', decode(md5('a') || md5('a'), 'hex'))
		RETURNING id::text`).Scan(&tenant); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `INSERT INTO invoices (tenant_id, period, status, finalized_at) VALUES ($1, '2026-11-01', 'final', now())
		RETURNING id::text`, tenant).Scan(&invoice); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO invoice_late_adjustments (invoice_id, base_cents, rerated_cents, credited_cents, created_at, updated_at)
		VALUES ($1, 100, 40, 101, now(), now())`, invoice); err == nil {
		t.Error("credited 101 cents of a period that charged 100: accepted")
	}
	if _, err := db.Exec(ctx, `INSERT INTO invoice_late_adjustments (invoice_id, base_cents, rerated_cents, credited_cents, created_at, updated_at)
		VALUES ($1, 100, 40, 60, now(), now())`, invoice); err != nil {
		t.Errorf("an adjustment within the checks: %v", err)
	}
}
