package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/postgres"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPrepaidBalance: the balance of a prepaid tenant is the credit valid
// at its period's end, less older drafts' charges; the previous period
// counts until its invoice is final.
func TestPrepaidBalance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	s := postgres.NewStore(db)
	tier := quota.Tier{Slug: "pp", Name: "PP", Rank: 4242, Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(0))},
		Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000, Billing: quota.BillingPrepaid, TopUpURL: "https://example.com/up",
		MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: quota.Ptr(int64(0)), Overage: quota.OverageBill, OveragePriceCentsPer1K: 5}}}
	tier, err := s.CreateTier(ctx, "test", tier)
	if err != nil {
		t.Fatal(err)
	}
	tn, err := s.CreateTenant(ctx, "test", "acme", "pp")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2031, 5, 15, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		cents   int64
		expires string
	}{{700, ""}, {200, "2031-06-01T00:00:00Z"}, {100, "2031-05-31T23:59:59Z"}} {
		var exp *time.Time
		if c.expires != "" {
			e, _ := time.Parse(time.RFC3339, c.expires)
			exp = &e
		}
		if _, err := db.Exec(ctx, `INSERT INTO credits (tenant_id, amount_cents, reason, expires_at, created_at) VALUES ($1, $2, 'r', $3, $4)`,
			tn.ID, c.cents, exp, now.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	p, err := s.Prepaid(ctx, tn.ID, tier, quota.Calendar{}, now)
	if err != nil {
		t.Fatal(err)
	}
	// 700 + 200 (valid at the end, 2031-06-01): 900 cents; lines: the
	// tier's and search's; April's invoice, not final yet, may draw the
	// 100 expiring on May 31 first
	want := quota.Prepaid{BalanceMillicents: 900_000, Lines: 2, CreditCents: 900, PeriodID: 203105, PrevID: 203104, ExpiringMillicents: 100_000,
		Until: time.Date(2031, 6, 1, 0, 0, 0, 0, time.UTC)}
	if p != want {
		t.Fatalf("Prepaid = %+v, want %+v", p, want)
	}
	// April final, March a draft of 150 cents of charges (and a credit line)
	if _, err := db.Exec(ctx, `
		WITH a AS (INSERT INTO invoices (tenant_id, period, status, finalized_at, period_start, period_end)
		           VALUES ($1, '2031-04-01', 'final', $2, '2031-04-01T00:00:00Z', '2031-05-01T00:00:00Z')),
		     m AS (INSERT INTO invoices (tenant_id, period, period_start, period_end, total_cents)
		           VALUES ($1, '2031-03-01', '2031-03-01T00:00:00Z', '2031-04-01T00:00:00Z', 0) RETURNING id)
		INSERT INTO invoice_lines (invoice_id, line_no, kind, description, quantity, amount_cents)
		SELECT m.id, v.n, v.kind, 'x', 1, v.amount FROM m, (VALUES (1, 'overage', 150), (2, 'credit', -150)) AS v(n, kind, amount)`,
		tn.ID, now); err != nil {
		t.Fatal(err)
	}
	if p, err = s.Prepaid(ctx, tn.ID, tier, quota.Calendar{}, now); err != nil {
		t.Fatal(err)
	}
	want.PrevID, want.ExpiringMillicents, want.HeldCents, want.BalanceMillicents = 0, 0, 150, (900-150)*1000
	if p != want {
		t.Fatalf("Prepaid = %+v, want %+v", p, want)
	}
}

// TestPrepaidMigrationDownAndUp: 000013 down takes the billing modes and
// the credit alerts away (a quota alert of the same tenant, period and
// threshold stays), and up again makes every tier postpaid.
func TestPrepaidMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, db := migratedPool(t)
	store := postgres.NewStore(db)
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
