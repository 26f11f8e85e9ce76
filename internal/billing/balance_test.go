package billing

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/postgres"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPrepaidBalance: the balance of a prepaid tenant is the credit its
// period's invoice may draw once the invoices not final before it drew
// theirs, as the invoicer will draw them: an older draft draws the credit
// that expires soonest first, and the previous period's invoice, while
// not final, first draws the credit that pays it but not this period's
// (ExpiringMillicents), which a credit granted after its end never does.
func TestPrepaidBalance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	tier, err := postgres.NewStore(db).CreateTier(ctx, "test", quota.Tier{Slug: "pp", Name: "PP", Rank: 4242, Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(0))},
		Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000, Billing: quota.BillingPrepaid, TopUpURL: "https://example.com/up",
		MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: quota.Ptr(int64(0)), Overage: quota.OverageBill, OveragePriceCentsPer1K: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	march := time.Date(2031, 3, 1, 0, 0, 0, 0, time.UTC)
	id := invTenant(t, db, "pp", march)
	now := time.Date(2031, 5, 15, 12, 0, 0, 0, time.UTC)
	credit := func(cents int64, expires string, created time.Time) {
		t.Helper()
		var exp *time.Time
		if expires != "" {
			e, _ := time.Parse(time.RFC3339, expires)
			exp = &e
		}
		invExec(t, db, `INSERT INTO credits (tenant_id, amount_cents, reason, expires_at, created_at) VALUES ($1, $2, 'r', $3, $4)`,
			id, cents, exp, created)
	}
	l := NewLedger(db)
	check := func(name string, want quota.Prepaid) {
		t.Helper()
		want.Lines, want.PeriodID, want.Until = 2, 203105, time.Date(2031, 6, 1, 0, 0, 0, 0, time.UTC) // the tier's line and search's
		got, err := l.Prepaid(ctx, id, tier, quota.Calendar{}, now)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s: Prepaid = %+v, want %+v", name, got, want)
		}
	}

	// 700 and 200 (valid at May's end, June 1) granted on May 15: May's
	// invoice may draw them, April's none; 100 expiring on May 31 pays
	// no invoice
	credit(700, "", now.Add(-time.Hour))
	credit(200, "2031-06-01T00:00:00Z", now.Add(-time.Hour))
	credit(100, "2031-05-31T23:59:59Z", now.Add(-time.Hour))
	check("granted in May", quota.Prepaid{BalanceMillicents: 900_000, CreditCents: 900, PrevID: 203104})

	// the same granted in March: April's invoice, not final yet, may
	// draw the 100 expiring on May 31 first
	invExec(t, db, `UPDATE credits SET created_at = $2 WHERE tenant_id = $1`, id, march.Add(time.Hour))
	check("granted in March", quota.Prepaid{BalanceMillicents: 900_000, CreditCents: 900, PrevID: 203104, ExpiringMillicents: 100_000})

	// March's invoice a draft of 150 cents of overage: it draws the 100
	// first, then 50 of the 200 that May's could draw
	invExec(t, db, `INSERT INTO invoices (tenant_id, period, period_start, period_end) VALUES ($1, '2031-03-01', '2031-03-01T00:00:00Z', '2031-04-01T00:00:00Z')`, id)
	invExec(t, db, `INSERT INTO usage (tenant_id, hour, meter, units, requests, overage_units) VALUES ($1, '2031-03-10T10:00:00Z', 'demo', 150, 150, 150)`, id)
	check("march a draft", quota.Prepaid{BalanceMillicents: 850_000, CreditCents: 900, PrevID: 203104, HeldCents: 50})

	// April final: its draws are out of the credit (none here)
	invExec(t, db, `INSERT INTO invoices (tenant_id, period, status, finalized_at, period_start, period_end)
		VALUES ($1, '2031-04-01', 'final', $2, '2031-04-01T00:00:00Z', '2031-05-01T00:00:00Z')`, id, now)
	check("april final", quota.Prepaid{BalanceMillicents: 850_000, CreditCents: 900, HeldCents: 50})

	// an unknown tenant
	if _, err := l.Prepaid(ctx, "00000000-0000-0000-0000-000000000001", tier, quota.Calendar{}, now); quota.ErrorCode(err) != quota.CodeNotFound {
		t.Fatalf("unknown tenant: %v, want CodeNotFound", err)
	}
}
