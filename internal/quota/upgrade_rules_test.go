package quota

import "testing"

// upgradeTier is a block tier with the given rank, price and daily quota
// (nil: unlimited), monthly 10,000 and burst 5/10.
func upgradeTier(slug string, rank int, price int64, daily *int64) Tier {
	return Tier{Slug: slug, Name: slug, Rank: rank, PriceCents: price, Overage: OverageBlock,
		Limits: Limits{BurstRate: Ptr(5.0), Burst: Ptr(int64(10)), DailyQuota: daily, MonthlyQuota: Ptr(int64(10_000))}}
}

// TestUpgradeHintChoice: among the tiers ranked above the tenant's that
// give more room where it was refused, the hint is the cheapest, then the
// lowest ranked, wherever the tiers stand in the list; never one ranked
// equal, never a spend cap that allows no unit.
func TestUpgradeHintChoice(t *testing.T) {
	t.Parallel()
	daily := func(n int64) *int64 { return &n }
	cur := upgradeTier("cur", 10, 100, daily(100))
	billed := func(slug string, rank int, price, capCents int64) Tier {
		t := upgradeTier(slug, rank, price, daily(100))
		t.Overage, t.OveragePriceCentsPer1K, t.MaxOverageCents = OverageBill, 10, Ptr(capCents)
		return t
	}
	for _, tc := range []struct {
		name     string
		current  Tier
		tiers    []Tier
		violated []LimitName // nil: the hint of /v1/usage
		want     string
	}{
		{"the cheapest, listed first", cur,
			[]Tier{upgradeTier("cheap", 20, 200, daily(500)), upgradeTier("dear", 30, 900, daily(500)), cur},
			[]LimitName{LimitDaily}, "cheap"},
		{"the cheapest, listed last", cur,
			[]Tier{cur, upgradeTier("dear", 30, 900, daily(500)), upgradeTier("cheap", 20, 200, daily(500))},
			[]LimitName{LimitDaily}, "cheap"},
		{"at one price, the lower rank, listed last", cur,
			[]Tier{cur, upgradeTier("high", 40, 300, daily(500)), upgradeTier("low", 20, 300, daily(500))},
			[]LimitName{LimitDaily}, "low"},
		{"at one price, the lower rank, listed first", cur,
			[]Tier{cur, upgradeTier("low", 20, 300, daily(500)), upgradeTier("high", 40, 300, daily(500))},
			[]LimitName{LimitDaily}, "low"},
		{"usage: the only one, listed first", cur,
			[]Tier{upgradeTier("more", 20, 200, daily(500)), cur}, nil, "more"},
		{"a tier of another set, ranked equal to one that gives more", upgradeTier("legacy", 20, 100, daily(100)),
			[]Tier{upgradeTier("same-rank", 20, 200, daily(500))}, []LimitName{LimitDaily}, ""},
		{"a tier of another set, ranked below one that gives more", upgradeTier("legacy", 19, 100, daily(100)),
			[]Tier{upgradeTier("above", 20, 200, daily(500))}, []LimitName{LimitDaily}, "above"},
		// 10 cents per 1,000 units: a cap of 0 cents admits no unit past
		// the quota, 1 cent admits 100
		{"monthly: a spend cap of 0 is no more room", cur,
			[]Tier{cur, billed("cap0", 20, 200, 0)}, []LimitName{LimitMonthly}, ""},
		{"monthly: a spend cap of a cent is", cur,
			[]Tier{cur, billed("cap0", 20, 200, 0), billed("cap1", 30, 300, 1)}, []LimitName{LimitMonthly}, "cap1"},
	} {
		var d *Decision
		if tc.violated != nil {
			d = &Decision{Violated: tc.violated}
		}
		got := NewUpgrades(tc.tiers).For(tc.current, Overrides{}, d)
		if gotSlug := hintSlug(got); gotSlug != tc.want {
			t.Errorf("%s: got hint %q, want %q", tc.name, gotSlug, tc.want)
		}
	}
}

func hintSlug(u *Upgrade) string {
	if u == nil {
		return ""
	}
	return u.Tier
}

// TestShortfallNamesTheFirstLimit: the console's warning names the first
// limit, in the order of the headers then of the meter quotas, in which a
// tier ranked higher gives less.
func TestShortfallNamesTheFirstLimit(t *testing.T) {
	t.Parallel()
	n := func(v int64) *int64 { return &v }
	meters := func(xDaily, xMonthly, yDaily, yMonthly int64) []MeterQuota {
		return []MeterQuota{
			{Meter: "x", DailyQuota: n(xDaily), MonthlyQuota: n(xMonthly), Overage: OverageBlock},
			{Meter: "y", DailyQuota: n(yDaily), MonthlyQuota: n(yMonthly), Overage: OverageBlock},
		}
	}
	other := upgradeTier("other", 1, 100, n(100))
	other.MeterQuotas = meters(10, 100, 10, 100)
	for _, tc := range []struct {
		name string
		mut  func(*Tier)
		want LimitName // "" for none
	}{
		{"the same", func(*Tier) {}, ""},
		{"more of everything", func(t *Tier) { t.DailyQuota = nil; t.MeterQuotas = meters(20, 200, 20, 200) }, ""},
		{"less burst", func(t *Tier) { t.Burst = n(5) }, LimitBurst},
		{"less burst and daily", func(t *Tier) { t.Burst, t.DailyQuota = n(5), n(50) }, LimitBurst},
		{"less daily and monthly", func(t *Tier) { t.DailyQuota, t.MonthlyQuota = n(50), n(50) }, LimitDaily},
		{"less monthly", func(t *Tier) { t.MonthlyQuota = n(50) }, LimitMonthly},
		{"less of x's month", func(t *Tier) { t.MeterQuotas = meters(10, 50, 10, 100) }, "x.monthly"},
		{"less of y's day", func(t *Tier) { t.MeterQuotas = meters(10, 100, 5, 100) }, "y.daily"},
		{"less of y's month", func(t *Tier) { t.MeterQuotas = meters(10, 100, 10, 50) }, "y.monthly"},
		{"less of x's day and y's month", func(t *Tier) { t.MeterQuotas = meters(5, 100, 10, 50) }, "x.daily"},
		{"no quota on y: unlimited", func(t *Tier) { t.MeterQuotas = meters(10, 100, 10, 100)[:1] }, ""},
	} {
		tier := upgradeTier("t", 2, 200, n(100))
		tier.MeterQuotas = other.MeterQuotas
		tc.mut(&tier)
		name, less := Shortfall(tier, other)
		if name != tc.want || less != (tc.want != "") {
			t.Errorf("%s: got %q, %t; want %q", tc.name, name, less, tc.want)
		}
	}
}
