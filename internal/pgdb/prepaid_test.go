package pgdb_test

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
)

// TestPrepaidMigrationDownAndUp: 000013 down takes the billing modes and
// the credit alerts away (a quota alert of the same tenant, period and
// threshold stays), and up again makes every tier postpaid.
func TestPrepaidMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, db := migratedPool(t)
	store := catalogdb.NewStore(db)
	if _, err := store.CreateTier(ctx, "test", quota.Tier{Slug: "pp", Name: "PP", Rank: 4242, Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(0))},
		Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000, Billing: quota.BillingPrepaid, TopUpURL: "https://example.com/up"}); err != nil {
		t.Fatal(err)
	}
	tn, err := store.CreateTenant(ctx, "test", "acme", "pp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO alerts (tenant_id, kind, period, threshold, units, quota)
		VALUES ($1, 'quota', '2031-05-01', 80, 8, 10), ($1, 'credit', '2031-05-01', 80, 8, 10)`, tn.ID); err != nil {
		t.Fatalf("a quota and a credit alert of one period and threshold: %v", err)
	}
	m := migrator(t, url)
	if err := m.Migrate(12); err != nil {
		t.Fatalf("down to 12: %v", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM alerts WHERE tenant_id = $1`, tn.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("after down: %d alerts (%v), want the quota one", n, err)
	}
	if err := m.Up(); err != nil {
		t.Fatalf("up again: %v", err)
	}
	db.Reset() // pgx caches statement descriptions: the columns changed
	tier, err := store.Tier(ctx, "pp")
	if err != nil || tier.Billing != quota.BillingPostpaid || tier.TopUpURL != "" {
		t.Fatalf("after up again: %+v, %v; want postpaid without a top-up URL", tier, err)
	}
}
