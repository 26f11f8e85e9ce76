package pgdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
)

// TestPlanChangesMigrationDownAndUp: 000009 down drops the calendar, the
// pending change, the quota resets and the price history; up again gives
// every tenant anchor 1 in UTC and nothing pending, and every tier one
// price row from 1970 at its current prices.
func TestPlanChangesMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, db := migratedPool(t)
	store := catalogdb.NewStore(db)
	tenant, err := store.CreateTenantWith(ctx, "test", quota.Tenant{Name: "Acme", Tier: "pro", BillingAnchorDay: 15, TimeZone: "Asia/Tokyo"})
	if err != nil {
		t.Fatal(err)
	}
	if tenant.BillingAnchorDay != 15 || tenant.TimeZone != "Asia/Tokyo" || tenant.PendingChange != nil {
		t.Fatalf("created: %+v", tenant)
	}
	now := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	got, _, err := store.ChangeTenant(ctx, "test", tenant.ID, &quota.PlanRequest{Tier: "free"}, now, func(*quota.Tenant) error { return nil })
	// Anchor 15 in Tokyo: the period of Nov 20 ends Dec 15 00:00 JST.
	if err != nil || got.PendingChange == nil || !got.PendingChange.EffectiveAt.Equal(time.Date(2026, 12, 14, 15, 0, 0, 0, time.UTC)) {
		t.Fatalf("pending downgrade: %+v, %v", got.PendingChange, err)
	}
	if _, err := store.UpdateTier(ctx, "test", "pro", func(tr *quota.Tier) error { tr.PriceCents = 5500; return nil }); err != nil {
		t.Fatal(err)
	}

	m := migrator(t, url)
	if err := m.Migrate(8); err != nil {
		t.Fatalf("down to 8: %v", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'tenants'
		AND column_name IN ('billing_anchor_day', 'time_zone', 'pending_tier', 'pending_effective_at', 'pending_quota', 'pending_requested_at')`).
		Scan(&n); err != nil || n != 0 {
		t.Fatalf("after down: %d of the columns left (%v), want none", n, err)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_name IN ('tier_prices', 'quota_resets')`).
		Scan(&n); err != nil || n != 0 {
		t.Fatalf("after down: %d of the tables left (%v), want none", n, err)
	}
	if err := m.Up(); err != nil {
		t.Fatalf("up again: %v", err)
	}
	db.Reset() // pgx caches statement descriptions: the columns changed
	after, err := store.Tenant(ctx, tenant.ID)
	if err != nil || after.BillingAnchorDay != 1 || after.TimeZone != "UTC" || after.PendingChange != nil || after.Tier != "pro" {
		t.Fatalf("after up again: %+v, %v; want pro, anchor 1, UTC, nothing pending", after, err)
	}
	var price int64
	var from time.Time
	if err := db.QueryRow(ctx, `SELECT count(*), min(price_cents), min(valid_from) FROM tier_prices WHERE tier = 'pro'`).
		Scan(&n, &price, &from); err != nil || n != 1 || price != 5500 || from.Year() != 1970 {
		t.Fatalf("pro's price history after up again: %d rows, %d cents from %s (%v); want one, 5500, from 1970", n, price, from, err)
	}
}
