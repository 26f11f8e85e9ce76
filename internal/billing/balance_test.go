package billing

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/catalogdb"
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
	tier, err := catalogdb.NewStore(db).CreateTier(ctx, "test", quota.Tier{Slug: "pp", Name: "PP", Rank: 4242, Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(0))},
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
	// invoice may draw them, April's none (so whatever April drew takes
	// nothing of them); 100 expiring on May 31 pays no invoice
	credit(700, "", now.Add(-time.Hour))
	credit(200, "2031-06-01T00:00:00Z", now.Add(-time.Hour))
	credit(100, "2031-05-31T23:59:59Z", now.Add(-time.Hour))
	check("granted in May", quota.Prepaid{BalanceMillicents: 900_000, CreditCents: 900, PrevID: 203104, ExpiringMillicents: unboundedMillicents})

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

// TestPrepaidsOfManyTenants: the balances of many tenants read at once,
// in the same statements, are each what it reads alone, whatever their
// calendars, moves, drafts and credits; one that does not exist gets a
// balance of nothing.
func TestPrepaidsOfManyTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	store := catalogdb.NewStore(db)
	tier, err := store.CreateTier(ctx, "test", payAsYouGoTier)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateTier(ctx, "test", postpaidTier); err != nil {
		t.Fatal(err)
	}
	march := time.Date(2031, 3, 1, 0, 0, 0, 0, time.UTC)
	now := time.Date(2031, 5, 15, 12, 0, 0, 0, time.UTC)
	ny := quota.Tenant{BillingAnchorDay: 15, TimeZone: "America/New_York"}.Calendar()
	var ofs []quota.PrepaidOf
	for k := range 6 {
		id := invTenant(t, db, "payg", march)
		cal := quota.Calendar{}
		switch k {
		case 1: // moved from the postpaid plan in the middle of this period, with overage on both
			invExec(t, db, `UPDATE tenant_tier_history SET tier = 'basic', valid_to = '2031-05-10T10:30:00Z' WHERE tenant_id = $1`, id)
			invExec(t, db, `INSERT INTO tenant_tier_history (tenant_id, tier, valid_from) VALUES ($1, 'payg', '2031-05-10T10:30:00Z')`, id)
		case 2: // anchored in New York
			invExec(t, db, `UPDATE tenants SET billing_anchor_day = 15, time_zone = 'America/New_York' WHERE id = $1`, id)
			cal = ny
		case 3: // a draft of March, April final
			invExec(t, db, `INSERT INTO invoices (tenant_id, period, period_start, period_end) VALUES ($1, '2031-03-01', '2031-03-01T00:00:00Z', '2031-04-01T00:00:00Z')`, id)
			invExec(t, db, `INSERT INTO invoices (tenant_id, period, status, finalized_at, period_start, period_end)
				VALUES ($1, '2031-04-01', 'final', $2, '2031-04-01T00:00:00Z', '2031-05-01T00:00:00Z')`, id, now)
		}
		for h, units := range []int64{7, 11, 13} { // March, April, May
			invExec(t, db, `INSERT INTO usage (tenant_id, hour, meter, units, requests, overage_units) VALUES ($1, $2, 'demo', $3, $3, $3)`,
				id, march.AddDate(0, h, 9).Add(time.Duration(k)*time.Hour), units*int64(k+1))
		}
		invExec(t, db, `INSERT INTO credits (tenant_id, amount_cents, reason, expires_at, created_at) VALUES ($1, 500, 'r', NULL, $2), ($1, 40, 'r', '2031-05-20T00:00:00Z', $2)`,
			id, march.Add(time.Duration(k)*time.Hour))
		ofs = append(ofs, quota.PrepaidOf{TenantID: id, Tier: tier, Calendar: cal})
	}
	ofs = append(ofs, quota.PrepaidOf{TenantID: "00000000-0000-0000-0000-000000000001", Tier: tier})
	l := NewLedger(db)
	got, err := l.Prepaids(ctx, ofs, now)
	if err != nil {
		t.Fatal(err)
	}
	for k, of := range ofs[:len(ofs)-1] {
		want, err := l.Prepaid(ctx, of.TenantID, of.Tier, of.Calendar, now)
		if err != nil {
			t.Fatal(err)
		}
		if got[k] != want {
			t.Errorf("tenant %d: %+v among many, %+v alone", k, got[k], want)
		}
	}
	if g := got[len(ofs)-1]; g.BalanceMillicents != 0 || g.CreditCents != 0 || g.PrevID != 0 {
		t.Errorf("an unknown tenant: %+v, want a balance of nothing", g)
	}
	// and what they are: the first's April (11 cents, its invoice a
	// draft) draws on the 40 that pays April only, leaving May the 500
	if g := got[0]; g.BalanceMillicents != 500_000 || g.CreditCents != 500 || g.ExpiringMillicents != 40_000 || g.PrevID != 203104 {
		t.Errorf("tenant 0: %+v", g)
	}
}
