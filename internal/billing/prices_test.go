package billing

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// invPriceChange records a change of tier's prices at at in its price
// history, as the store does at its transaction's time, and in the tier.
func invPriceChange(tb testing.TB, db *pgxpool.Pool, tier string, price, overagePer1K int64, at time.Time) {
	tb.Helper()
	invExec(tb, db, `UPDATE tier_prices SET valid_to = $2 WHERE tier = $1 AND valid_to IS NULL`, tier, at)
	invExec(tb, db, `INSERT INTO tier_prices (tier, price_cents, overage_price_cents_per_1k, valid_from) VALUES ($1, $2, $3, $4)`,
		tier, price, overagePer1K, at)
	invExec(tb, db, `UPDATE tiers SET price_cents = $2, overage_price_cents_per_1k = $3 WHERE slug = $1`, tier, price, overagePer1K)
}

func priceLine(desc string, secs, cents int64) InvoiceLine {
	return InvoiceLine{Kind: "subscription", Description: desc, Quantity: secs, AmountCents: cents}
}

// TestPriceChangeMidMonth: September 2026 (30 days) on pro, whose price
// goes from 4900 to 7300 cents on the 11th at 06:00 and whose overage price
// goes from 50 to 80 cents per 1,000 on the 21st (price unchanged): two
// subscription lines, at the old price for 10.25 days and the new one for
// 19.75, and the overage at the price in force at the month's end.
func TestPriceChangeMidMonth(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	sep := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	id := invTenant(t, db, "pro", sep.AddDate(0, -1, 0))
	invPriceChange(t, db, "pro", 7300, 50, time.Date(2026, 9, 11, 6, 0, 0, 0, time.UTC))
	invPriceChange(t, db, "pro", 7300, 80, time.Date(2026, 9, 21, 0, 0, 0, 0, time.UTC))
	invUsage(t, db, id, sep.Add(time.Hour), 1_012_345, 12_345)

	clock := &invClock{t: time.Date(2026, 9, 30, 12, 0, 0, 0, time.UTC)}
	got := invGenerate(t, NewInvoicer(db, clock.Now, time.Hour), id, sep)
	oldSecs := int64(10*86400 + 6*3600) // Sep 1 00:00 – Sep 11 06:00
	newSecs := int64(30*86400) - oldSecs
	invCheckLines(t, got, []InvoiceLine{
		// 4900 × 10.25 / 30 = 1674.17 → 1674
		priceLine("Pro plan, 2026-09-01 – 2026-09-11 06:00 (10.3 of 30 days)", oldSecs, 1674),
		// 7300 × 19.75 / 30 = 4805.83 → 4806
		priceLine("Pro plan, 2026-09-11 06:00 – 2026-10-01 (19.8 of 30 days)", newSecs, 4806),
		{Kind: "included", Description: "Usage, included in Pro plan: 1,000,000 units per month", Quantity: 1_012_345},
		// 12,345 × 80 / 1000 = 987.6 → 988 (the price of the month's end)
		{Kind: "overage", Description: "Overage: 12,345 units at $0.80 per 1,000 (Pro plan)", Quantity: 12_345, AmountCents: 988},
	})
	if got.TotalCents != 1674+4806+988 {
		t.Errorf("total_cents: got %d, want %d", got.TotalCents, 1674+4806+988)
	}
}

// TestPriceChangeThroughTheStore: a price change made with UpdateTier
// leaves a final invoice as it was, and reprices the current month's draft
// only from the change on (the change's transaction time).
func TestPriceChangeThroughTheStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	store := catalogdb.NewStore(db)
	now := time.Now().UTC()
	cur := quota.MonthStart(now)
	prev := cur.AddDate(0, -1, 0)
	id := invTenant(t, db, "pro", prev)
	inv := NewInvoicer(db, func() time.Time { return time.Now().UTC() }, 0)

	final := invGenerate(t, inv, id, prev)
	if final.Status != "final" || final.TotalCents != 4900 {
		t.Fatalf("last month: got %s, %d cents; want final, 4900", final.Status, final.TotalCents)
	}
	before := invGenerate(t, inv, id, cur)
	if before.Status != "draft" || before.TotalCents != 4900 {
		t.Fatalf("this month before the change: got %s, %d cents; want draft, 4900", before.Status, before.TotalCents)
	}

	if _, err := store.UpdateTier(ctx, "test", "pro", func(tr *quota.Tier) error { tr.PriceCents = 9900; return nil }); err != nil {
		t.Fatal(err)
	}
	var at time.Time
	var n int
	if err := db.QueryRow(ctx, `SELECT max(valid_from), count(*) FROM tier_prices WHERE tier = 'pro'`).Scan(&at, &n); err != nil {
		t.Fatal(err)
	}
	if n != 2 || at.Before(now.Add(-time.Minute)) {
		t.Fatalf("price history: %d rows, the latest from %s; want 2, from the change", n, at)
	}
	// A change that leaves the prices as they are opens no row.
	if _, err := store.UpdateTier(ctx, "test", "pro", func(tr *quota.Tier) error { tr.Name = "Pro"; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM tier_prices WHERE tier = 'pro'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("after a change of name: %d price rows (%v), want 2", n, err)
	}

	if again := invGenerate(t, inv, id, prev); again.TotalCents != 4900 || len(again.Lines) != len(final.Lines) ||
		again.Lines[0] != final.Lines[0] || again.FinalizedAt == nil || !again.FinalizedAt.Equal(*final.FinalizedAt) {
		t.Errorf("the final invoice after the change:\n got %+v\nwant %+v", again, final)
	}

	got := invGenerate(t, inv, id, cur)
	end := cur.AddDate(0, 1, 0)
	monthSecs := end.Unix() - cur.Unix()
	// The change's instant in whole seconds, as Rate counts them.
	oldSecs := at.Unix() - cur.Unix()
	newSecs := end.Unix() - at.Unix()
	halfUp := func(price, secs int64) int64 { return (price*2*secs + monthSecs) / (2 * monthSecs) }
	if len(got.Lines) < 2 || got.Lines[0].Kind != "subscription" || got.Lines[1].Kind != "subscription" {
		t.Fatalf("this month after the change: lines %+v, want two subscription lines", got.Lines)
	}
	if got.Lines[0].Quantity != oldSecs || got.Lines[0].AmountCents != halfUp(4900, oldSecs) ||
		got.Lines[1].Quantity != newSecs || got.Lines[1].AmountCents != halfUp(9900, newSecs) {
		t.Errorf("this month after the change: got %+v and %+v; want %d s at 4900 (%d cents) and %d s at 9900 (%d cents)",
			got.Lines[0], got.Lines[1], oldSecs, halfUp(4900, oldSecs), newSecs, halfUp(9900, newSecs))
	}
}
