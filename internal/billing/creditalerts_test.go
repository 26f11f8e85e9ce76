package billing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// mustPrepaidTier creates a prepaid tier that includes no units and
// charges 1 cent a unit; it returns its slug.
func mustPrepaidTier(tb testing.TB, db *pgxpool.Pool, billingMode quota.Billing) string {
	tb.Helper()
	slug := "pp-" + testenv.RandomHex(4)
	t := quota.Tier{Slug: slug, Name: "Prepaid " + slug, Rank: randomRank(tb), Limits: quota.Limits{MonthlyQuota: ptr(int64(0))},
		Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000, Billing: billingMode, TopUpURL: "https://example.com/top-up"}
	if _, err := catalogdb.NewStore(db).CreateTier(context.Background(), "test", t); err != nil {
		tb.Fatalf("create tier: %v", err)
	}
	return slug
}

func ptr[T any](v T) *T { return &v }

// randomRank is a tier rank no other test's tier takes, most likely.
func randomRank(tb testing.TB) int {
	n, err := strconv.ParseInt(testenv.RandomHex(2), 16, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return 100_000 + int(n)*3 + int(time.Now().UnixNano()%3)
}

// mustTenantOn creates a tenant on tier with webhookURL at created; it
// returns its id and signing secret.
func mustTenantOn(tb testing.TB, db *pgxpool.Pool, tier, webhookURL string) (string, []byte) {
	tb.Helper()
	ctx := context.Background()
	tn, err := catalogdb.NewStore(db).CreateTenantWith(ctx, "test",
		quota.Tenant{Name: "acme " + testenv.RandomHex(3), Tier: tier, WebhookURL: webhookURL})
	if err != nil {
		tb.Fatalf("create tenant: %v", err)
	}
	// (created at the start of the month, so that the month's draft bills it whole)
	if _, err := db.Exec(ctx, `UPDATE tenants SET created_at = '2026-03-01T00:00:00Z' WHERE id = $1`, tn.ID); err != nil {
		tb.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE tenant_tier_history SET valid_from = '2026-03-01T00:00:00Z' WHERE tenant_id = $1`, tn.ID); err != nil {
		tb.Fatal(err)
	}
	var secret []byte
	if err := db.QueryRow(ctx, `SELECT webhook_secret FROM tenants WHERE id = $1`, tn.ID).Scan(&secret); err != nil {
		tb.Fatal(err)
	}
	return tn.ID, secret
}

// TestCreditAlerts: a prepaid tenant's low-balance alerts are recorded
// once per threshold (80 % of its credit spent by usage its draft
// invoices hold, then all of it), armed again by a top-up, and delivered
// as signed credit.balance_low webhooks; a postpaid tenant gets none.
func TestCreditAlerts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	rcv := mustReceiver(t, clock, nil)
	prepaid, postpaid := mustPrepaidTier(t, db, quota.BillingPrepaid), mustPrepaidTier(t, db, quota.BillingPostpaid)
	id, secret := mustTenantOn(t, db, prepaid, rcv.URL+"/hook")
	rcv.setSecret(secret)
	other, _ := mustTenantOn(t, db, postpaid, rcv.URL+"/hook")
	ledger := billing.NewLedger(db)
	for _, tn := range []string{id, other} {
		if _, _, err := ledger.CreateCredit(ctx, "test", tn, "", billing.NewCredit{AmountCents: 1000, Reason: "first"}, t0.Add(-48*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	inv := billing.NewInvoicer(db, clock.Now, time.Hour)
	hour := t0.Add(-5 * time.Hour)
	use := func(units int64) {
		t.Helper()
		for _, tn := range []string{id, other} {
			if _, err := db.Exec(ctx, `INSERT INTO usage (tenant_id, hour, meter, units, requests, overage_units) VALUES ($1, $2, 'demo', $3, $3, $3)`,
				tn, hour, units); err != nil {
				t.Fatal(err)
			}
		}
		hour = hour.Add(time.Hour)
		if err := inv.Refresh(ctx, []string{id, other}); err != nil {
			t.Fatal(err)
		}
		if err := billing.RecordCreditAlerts(ctx, db, []string{id, other}, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	alerts := func() []string {
		t.Helper()
		rows, err := db.Query(ctx, `SELECT tenant_id::text || ' ' || to_char(period, 'YYYY-MM-DD') || ' ' || threshold || ' ' || units || '/' || quota
			FROM alerts WHERE kind = 'credit' AND tenant_id = ANY($1::uuid[]) ORDER BY created_at, threshold`, []string{id, other})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	first := id + " 2026-03-13 "
	use(700) // 70 %
	if got := alerts(); len(got) != 0 {
		t.Fatalf("at 70 %% spent: %v", got)
	}
	use(150) // 85 %
	if got, want := alerts(), []string{first + "80 850/1000"}; !slices.Equal(got, want) {
		t.Fatalf("at 85 %%: %v, want %v", got, want)
	}
	use(100) // 95 %: no second 80
	use(60)  // 101 %
	if got, want := alerts(), []string{first + "80 850/1000", first + "100 1010/1000"}; !slices.Equal(got, want) {
		t.Fatalf("past 100 %%: %v, want %v", got, want)
	}
	// a top-up on another day arms them again: 1010 of 2000 spent is 50 %
	if _, _, err := ledger.CreateCredit(ctx, "test", id, "", billing.NewCredit{AmountCents: 1000, Reason: "top-up"}, t0.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	use(600) // 1610 of 2000: 80.5 %
	if got := alerts(); len(got) != 3 || got[2] != id+" 2026-03-15 80 1610/2000" {
		t.Fatalf("after a top-up: %v", got)
	}

	// (the outbox's times are Postgres's; the deliverer runs on the test's clock)
	if _, err := db.Exec(ctx, `UPDATE alerts SET next_attempt_at = $2 WHERE tenant_id = $1`, id, t0.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	mustRun(t, newTestDeliverer(db, clock))
	if bad := rcv.verifyErrors(); len(bad) > 0 {
		t.Fatalf("webhooks failed verification: %v", bad)
	}
	var got []string
	for _, r := range rcv.requests() {
		var body struct {
			Type string `json:"type"`
			Data struct {
				TenantID     string `json:"tenant_id"`
				Threshold    int    `json:"threshold"`
				CreditCents  int64  `json:"credit_cents"`
				SpentCents   int64  `json:"spent_cents"`
				BalanceCents int64  `json:"balance_cents"`
			} `json:"data"`
		}
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatal(err)
		}
		if body.Type != billing.CreditAlertEventType || body.Data.TenantID != id {
			t.Errorf("webhook %s", r.Body)
		}
		got = append(got, fmt.Sprintf("%d %d %d %d", body.Data.Threshold, body.Data.CreditCents, body.Data.SpentCents, body.Data.BalanceCents))
	}
	slices.Sort(got)
	if want := []string{"100 1000 1010 0", "80 1000 850 150", "80 2000 1610 390"}; !slices.Equal(got, want) {
		t.Errorf("webhooks (threshold, credit, spent, balance): %q, want %q", got, want)
	}
}
