package quota

import "testing"

// TestUpgradeHintGivesMoreRoom: the hint is the cheapest tier ranked
// higher that gives no less and more room where the refusal was, never
// merely the next rank.
func TestUpgradeHintGivesMoreRoom(t *testing.T) {
	i := func(v int64) *int64 { return &v }
	f := func(v float64) *float64 { return &v }
	base := func(slug string, rank int, price int64, mut func(*Tier)) Tier {
		t := Tier{Slug: slug, Name: slug, Rank: rank, PriceCents: price, Overage: OverageBlock,
			Limits: Limits{BurstRate: f(5), Burst: i(10), DailyQuota: i(1000), MonthlyQuota: i(10_000)}}
		if mut != nil {
			mut(&t)
		}
		return t
	}
	free := base("free", 0, 0, func(t *Tier) {
		t.MeterQuotas = []MeterQuota{{Meter: "demo", DailyQuota: i(3), Overage: OverageBlock}}
	})
	tiers := []Tier{
		free,
		base("tiny", 5, 100, func(t *Tier) { t.DailyQuota = i(5) }),      // ranked higher, less a day
		base("nodemo", 6, 200, func(t *Tier) { t.DailyQuota = i(2000) }), // no demo quota: unlimited demo
		base("lessdemo", 7, 150, func(t *Tier) { t.MeterQuotas = []MeterQuota{{Meter: "demo", DailyQuota: i(2), Overage: OverageBlock}} }),
		base("burst", 8, 300, func(t *Tier) { t.BurstRate, t.Burst = f(50), i(100); t.MeterQuotas = free.MeterQuotas }),
		base("bill", 9, 400, func(t *Tier) {
			t.Overage, t.OveragePriceCentsPer1K, t.MaxOverageCents = OverageBill, 10, i(100) // 10,000 units past the quota
			t.MeterQuotas = free.MeterQuotas
		}),
		base("billmore", 11, 600, func(t *Tier) {
			t.Overage, t.OveragePriceCentsPer1K, t.MaxOverageCents = OverageBill, 10, i(200)
			t.MeterQuotas = free.MeterQuotas
		}),
		base("billdear", 10, 500, func(t *Tier) { // a higher cap, at a price that allows fewer units
			t.Overage, t.OveragePriceCentsPer1K, t.MaxOverageCents = OverageBill, 50, i(200)
			t.MeterQuotas = free.MeterQuotas
		}),
		base("big", 12, 5000, func(t *Tier) {
			t.BurstRate, t.Burst, t.DailyQuota, t.MonthlyQuota, t.MeterQuotas = nil, nil, nil, nil, nil
		}),
		base("bigtwin", 13, 5000, func(t *Tier) {
			t.BurstRate, t.Burst, t.DailyQuota, t.MonthlyQuota, t.MeterQuotas = nil, nil, nil, nil, nil
		}),
	}
	by := map[string]Tier{}
	for _, t := range tiers {
		by[t.Slug] = t
	}
	u := NewUpgrades(tiers)
	policy := func(name string, tiers ...string) []PolicyState {
		return []PolicyState{{Policy: &Policy{Name: name, Match: PolicyMatch{Tiers: tiers}}, Outcome: PolicyRefused}}
	}
	for _, tc := range []struct {
		name     string
		tier     string
		o        Overrides
		violated []LimitName
		policies []PolicyState
		want     string // "" for none
	}{
		{"usage: the cheapest with more of something", "free", Overrides{}, nil, nil, "nodemo"},
		{"daily: not tiny, which gives less a day", "free", Overrides{}, []LimitName{LimitDaily}, nil, "nodemo"},
		{"burst", "free", Overrides{}, []LimitName{LimitBurst}, nil, "burst"},
		{"demo.daily: a tier without a demo quota has unlimited demo", "free", Overrides{}, []LimitName{"demo.daily"}, nil, "nodemo"},
		{"monthly: billed overage is more room in the month", "free", Overrides{}, []LimitName{LimitMonthly}, nil, "bill"},
		{"spend cap: a higher cap in units, not in cents", "bill", Overrides{}, []LimitName{LimitSpendCap}, nil, "billmore"},
		{"burst and daily: more of both", "free", Overrides{}, []LimitName{LimitBurst, LimitDaily}, nil, "big"},
		{"prepaid credit: no plan adds credit", "free", Overrides{}, []LimitName{LimitCredit}, nil, ""},
		{"a policy of the free tier", "free", Overrides{}, []LimitName{"reports"}, policy("reports", "free"), "nodemo"},
		{"a policy of every tier", "free", Overrides{}, []LimitName{"reports"}, policy("reports"), ""},
		{"a policy unknown", "free", Overrides{}, []LimitName{"reports"}, nil, ""},
		{"an overridden daily quota is the tenant's on any tier", "free", Overrides{DailyQuota: Set(i(100_000))}, []LimitName{LimitDaily}, nil, ""},
		{"an override of another limit", "free", Overrides{DailyQuota: Set(i(100_000))}, []LimitName{LimitBurst}, nil, "burst"},
		{"an override equal to the tier's: the tenant's on any tier", "free", Overrides{DailyQuota: Set(i(1000))}, []LimitName{LimitDaily}, nil, ""},
		{"an override, another limit refusing", "free", Overrides{DailyQuota: Set(i(1000))}, []LimitName{LimitBurst}, nil, "burst"},
		{"burst and daily with an override", "free", Overrides{BurstRate: Set(f(5))}, []LimitName{LimitBurst, LimitDaily}, nil, "big"},
		{"twins: the lower rank", "burst", Overrides{}, []LimitName{LimitDaily}, nil, "big"},
		{"the top", "bigtwin", Overrides{}, nil, nil, ""},
		{"tiny: anything above with more", "tiny", Overrides{}, []LimitName{LimitDaily}, nil, "nodemo"},
	} {
		d := &Decision{Violated: tc.violated, Policies: tc.policies}
		if tc.violated == nil {
			d = nil
		}
		got := u.For(by[tc.tier], tc.o, d)
		if (got == nil) != (tc.want == "") || got != nil && got.Tier != tc.want {
			t.Errorf("%s: hint %+v, want %q", tc.name, got, tc.want)
		}
	}
	if name, less := Shortfall(by["tiny"], free); !less || name != LimitDaily {
		t.Errorf("Shortfall(tiny, free) = %q, %v, want daily", name, less)
	}
	if name, less := Shortfall(by["lessdemo"], free); !less || name != "demo.daily" {
		t.Errorf("Shortfall(lessdemo, free) = %q, %v, want demo.daily", name, less)
	}
	if name, less := Shortfall(by["big"], free); less {
		t.Errorf("Shortfall(big, free) = %q, want none", name)
	}
	if n := testing.AllocsPerRun(100, func() {
		u.For(free, Overrides{}, &Decision{Violated: []LimitName{LimitDaily}})
		u.For(free, Overrides{DailyQuota: Set(i(1000))}, &Decision{Violated: []LimitName{LimitBurst, LimitDaily}})
	}); n != 0 {
		t.Errorf("a refusal's hint allocates %.1f times, want 0", n)
	}
}
