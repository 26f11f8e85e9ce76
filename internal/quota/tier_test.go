package quota

import (
	"math"
	"testing"
)

func validTier() Tier {
	return Tier{Slug: "pro-2", Name: "Pro 2", Rank: 3, PriceCents: 4900,
		Limits: Limits{BurstRate: Ptr(10.0), Burst: Ptr(int64(20)), BucketCapacity: Ptr(int64(100)),
			BucketRefillPerSec: Ptr(5.0), DailyQuota: Ptr(int64(1000)), MonthlyQuota: nil},
		Overage: OverageBill, OveragePriceCentsPer1K: 50}
}

func TestTierValidate(t *testing.T) {
	if err := validTier().Validate(); err != nil {
		t.Fatalf("valid tier: %v", err)
	}
	for _, tc := range []struct {
		field string
		mut   func(*Tier)
	}{
		{"slug", func(t *Tier) { t.Slug = "Pro" }},
		{"slug", func(t *Tier) { t.Slug = "-pro" }},
		{"slug", func(t *Tier) { t.Slug = "" }},
		{"name", func(t *Tier) { t.Name = "" }},
		{"rank", func(t *Tier) { t.Rank = -1 }},
		{"price_cents", func(t *Tier) { t.PriceCents = -1 }},
		{"burst_rate", func(t *Tier) { t.BurstRate = Ptr(0.0) }},
		{"burst_rate", func(t *Tier) { t.BurstRate = Ptr(math.NaN()) }},
		{"burst_rate", func(t *Tier) { t.BurstRate = Ptr(math.Inf(1)) }},
		{"burst", func(t *Tier) { t.Burst = Ptr(int64(0)) }},
		{"burst", func(t *Tier) { t.Burst = nil }},
		{"burst", func(t *Tier) { t.BurstRate = Ptr(MinRate); t.Burst = Ptr(MaxQuantity) }},
		{"bucket_capacity", func(t *Tier) { t.BucketCapacity = Ptr(int64(-5)) }},
		{"bucket_capacity", func(t *Tier) { t.BucketRefillPerSec = nil }},
		{"bucket_capacity", func(t *Tier) { t.BucketRefillPerSec = Ptr(MinRate); t.BucketCapacity = Ptr(MaxQuantity) }},
		{"bucket_refill_per_sec", func(t *Tier) { t.BucketRefillPerSec = Ptr(-1.0) }},
		{"daily_quota", func(t *Tier) { t.DailyQuota = Ptr(int64(-1)) }},
		{"monthly_quota", func(t *Tier) { t.MonthlyQuota = Ptr(MaxQuantity + 1) }},
		{"overage", func(t *Tier) { t.Overage = "maybe" }},
		{"overage_price_cents_per_1k", func(t *Tier) { t.OveragePriceCentsPer1K = 0 }},
		{"overage_price_cents_per_1k", func(t *Tier) { t.Overage = OverageBlock }},
		{"max_overage_cents", func(t *Tier) { t.MaxOverageCents = Ptr(int64(-1)) }},
		{"max_overage_cents", func(t *Tier) { t.MaxOverageCents = Ptr(MaxPrice + 1) }},
		{"max_overage_cents", func(t *Tier) {
			t.Overage, t.OveragePriceCentsPer1K, t.MaxOverageCents = OverageBlock, 0, Ptr(int64(10))
		}},
	} {
		tier := validTier()
		tc.mut(&tier)
		err := tier.Validate()
		e, ok := err.(*Error)
		if !ok || e.Code != CodeInvalid || e.Field != tc.field {
			t.Errorf("want an invalid %s, got %v", tc.field, err)
		}
	}
}

func TestSpendCapValidAndInUnits(t *testing.T) {
	for _, c := range []int64{0, 1, MaxPrice} {
		tier := validTier()
		tier.MaxOverageCents = Ptr(c)
		if err := tier.Validate(); err != nil {
			t.Errorf("cap %d: %v", c, err)
		}
	}
	for _, tc := range []struct {
		cents   *int64
		overage Overage
		price   int64
		want    int64
	}{
		{nil, OverageBill, 50, -1},
		{Ptr(int64(10)), OverageBlock, 50, -1},
		{Ptr(int64(10)), OverageBill, 0, -1},
		{Ptr(int64(0)), OverageBill, 50, 0},
		{Ptr(int64(50)), OverageBill, 1000, 50},
		{Ptr(int64(1)), OverageBill, 7, 142},  // 142 units cost 0.994 cent, 143 would cost 1.001
		{Ptr(int64(1)), OverageBill, 3000, 0}, // not one unit fits a cent at 3 cents a unit
		{Ptr(MaxPrice), OverageBill, 1, MaxPrice * 1000},
	} {
		if got := SpendCapUnits(tc.cents, tc.overage, tc.price); got != tc.want {
			t.Errorf("SpendCapUnits(%v, %s, %d) = %d, want %d", tc.cents, tc.overage, tc.price, got, tc.want)
		}
	}
}

func TestUpgradeForPicksTheCheapestThatGivesMore(t *testing.T) {
	tiers := []Tier{{Slug: "free", Rank: 0, Limits: Limits{DailyQuota: Ptr(int64(10))}},
		{Slug: "ent", Rank: 20, PriceCents: 500}, {Slug: "pro", Rank: 10, PriceCents: 100, UpgradeURL: "u"}}
	if up := UpgradeFor(tiers[0], tiers); up == nil || up.Tier != "pro" || up.URL != "u" {
		t.Fatalf("UpgradeFor(free) = %+v, want pro", up)
	}
	if up := UpgradeFor(tiers[2], tiers); up != nil {
		t.Fatalf("UpgradeFor(pro) = %+v, want nil: ent gives no more", up)
	}
	if up := UpgradeFor(tiers[1], tiers); up != nil {
		t.Fatalf("UpgradeFor(top) = %+v, want nil", up)
	}
}
