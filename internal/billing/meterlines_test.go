package billing

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestMeterOverageLines: each meter's overage is its own line at its own
// price, rounded up to the cent; a meter whose quota the month's last tier
// no longer bills is rated at the latest tier that did; a meter no tier
// bills shows at 0 with the reason.
func TestMeterOverageLines(t *testing.T) {
	t.Parallel()
	bills := func(m string, q, price int64) quota.MeterQuota {
		return quota.MeterQuota{Meter: m, MonthlyQuota: quota.Ptr(q), Overage: quota.OverageBill, OveragePriceCentsPer1K: price}
	}
	segs := []TierSegment{
		{Tier: "pro", Name: "Pro", MeterQuotas: []quota.MeterQuota{bills("export", 100, 2500), bills("search", 5000, 40)}},
		{Tier: "team", Name: "Team", MeterQuotas: []quota.MeterQuota{bills("search", 10000, 30),
			{Meter: "export", MonthlyQuota: quota.Ptr(int64(100)), Overage: quota.OverageBlock}}},
	}
	got := meterOverageLines(segs, []MeterOverage{{"search", 1234}, {"export", 3}, {"video", 10}, {"none", 0}})
	want := []InvoiceLine{
		{Kind: "overage", Description: "Overage of export: 3 units past its quota of 100 at $25.00 per 1,000 (Pro plan)", Quantity: 3, AmountCents: 8},
		{Kind: "overage", Description: "Overage of search: 1,234 units past its quota of 10,000 at $0.30 per 1,000 (Team plan)", Quantity: 1234, AmountCents: 38},
		{Kind: "overage", Description: "Overage of video: 10 units past its quota (not charged: no plan of the month bills it)", Quantity: 10},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d lines %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}

// TestGenerateWithMeterOverage: a fixed month to the cent with meter
// quotas, a tier change mid-month, tier overage and meter overage. Meters
// (49.00 a month, 100,000 units, 0.20 per 1,000 past them; search: 1,000
// units, 1.50 per 1,000 past them) until Nov 16, then Meters+ (99.00,
// 150,000 units, 0.10; search: 2,000 units, 2.00 past them): half a month
// of each, the tier's overage at Meters+'s price and the meter's at
// Meters+'s search price (the tiers in force at the month's end).
func TestGenerateWithMeterOverage(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	invExec(t, db, `INSERT INTO tiers (slug, name, rank, price_cents, monthly_quota, overage, overage_price_cents_per_1k, meter_quotas)
		VALUES ('meters', 'Meters', 5, 4900, 100000, 'bill', 20,
		        '[{"meter": "search", "daily_quota": null, "monthly_quota": 1000, "overage": "bill", "overage_price_cents_per_1k": 150}]'),
		       ('meters-plus', 'Meters+', 6, 9900, 150000, 'bill', 10,
		        '[{"meter": "search", "daily_quota": null, "monthly_quota": 2000, "overage": "bill", "overage_price_cents_per_1k": 200},
		          {"meter": "export", "daily_quota": 5, "monthly_quota": null, "overage": "block", "overage_price_cents_per_1k": 0}]')`)
	id := invTenant(t, db, "meters", invNov)
	invChangeTier(t, db, id, "meters-plus", invNov.AddDate(0, 0, 15))
	meterUsage := func(hour time.Time, meter string, units, overage, meterOverage int64) {
		invExec(t, db, `INSERT INTO usage (tenant_id, hour, meter, units, requests, overage_units, meter_overage_units)
			VALUES ($1, $2, $3, $4, $4, $5, $6)`, id, hour, meter, units, overage, meterOverage)
	}
	meterUsage(invNov.Add(3*time.Hour), "demo", 149000, 0, 0)
	meterUsage(invNov.Add(4*time.Hour), "search", 2500, 1000, 1333) // 1,333 past search's quota, 1,000 more past the tier's
	meterUsage(invDec.Add(-time.Hour), "search", 17, 0, 17)
	meterUsage(invDec.Add(time.Hour), "search", 999, 0, 999) // December
	clock := &invClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	got := invGenerate(t, NewInvoicer(db, clock.Now, time.Hour), id, invNov)
	want := []InvoiceLine{
		{Kind: "subscription", Description: "Meters plan, 2026-11-01 – 2026-11-16 (15.0 of 30 days)", Quantity: invNovSecs / 2, AmountCents: 2450},
		{Kind: "subscription", Description: "Meters+ plan, 2026-11-16 – 2026-12-01 (15.0 of 30 days)", Quantity: invNovSecs / 2, AmountCents: 4950},
		{Kind: "included", Description: "Usage, included in Meters+ plan: 150,000 units per month", Quantity: 151517},
		// 1,000 × 0.10 / 1,000 = 0.10
		{Kind: "overage", Description: "Overage: 1,000 units at $0.10 per 1,000 (Meters+ plan)", Quantity: 1000, AmountCents: 10},
		// 1,350 × 2.00 / 1,000 = 2.70
		{Kind: "overage", Description: "Overage of search: 1,350 units past its quota of 2,000 at $2.00 per 1,000 (Meters+ plan)", Quantity: 1350, AmountCents: 270},
	}
	invCheckLines(t, got, want)
	if got.TotalCents != 2450+4950+10+270 {
		t.Fatalf("total %d, want %d", got.TotalCents, 2450+4950+10+270)
	}
}
