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

func TestUpgradeForPicksTheNextRank(t *testing.T) {
	tiers := []Tier{{Slug: "free", Rank: 0}, {Slug: "ent", Rank: 20}, {Slug: "pro", Rank: 10, UpgradeURL: "u"}}
	if up := UpgradeFor(tiers[0], tiers); up == nil || up.Tier != "pro" || up.URL != "u" {
		t.Fatalf("UpgradeFor(free) = %+v, want pro", up)
	}
	if up := UpgradeFor(tiers[1], tiers); up != nil {
		t.Fatalf("UpgradeFor(top) = %+v, want nil", up)
	}
}
