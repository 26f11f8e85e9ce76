package quota

import (
	"math"
	"slices"
	"strings"
)

// The upgrade hint names a tier worth moving to, never merely the next
// rank: a tier ranked higher may still give less (an admin may rank a
// small plan above a free one).
//
// Each tier gives room in these limits, compared as amounts where null
// (unlimited) is the largest:
//
//   - burst: its rate and its burst; bucket: its refill rate and capacity
//     (a pair gives more when neither is smaller and one is larger);
//   - daily: the daily quota;
//   - monthly: the monthly quota, and the month's units in all (the
//     quota, plus what the spend cap admits past it when overage is
//     billed: unlimited without a cap, none when overage is blocked);
//     spend_cap: the month's units in all;
//   - <meter>.daily, <meter>.monthly for each meter with a quota in
//     either tier (a tier without a quota on that meter is unlimited on
//     it), a billed meter quota's month being unlimited past its quota
//     (the spend cap bounds it).
//
// A tier gives less than another when any of these is smaller. All are
// read with the tenant's overrides applied (an override is the tenant's
// whatever its tier). The hint of a refusal is the cheapest tier (then the
// lowest rank) ranked above the tenant's that gives no less and more room
// in every limit that refused; a policy that refused counts as more room
// in a tier it does not apply to (its match names tiers, not that one). A
// refusal for want of prepaid credit, which no plan adds, has no hint. The
// hint without a refusal (/v1/usage) is the cheapest tier ranked above
// that gives no less and more of something. No such tier: no hint.

// limitRoom is a tier's room in one limit: one or two amounts.
type limitRoom [2]float64

// compare returns -1 when a has less room than b (either amount smaller),
// 1 when more (neither smaller, one larger), else 0.
func (a limitRoom) compare(b limitRoom) int {
	out := 0
	for i := range a {
		switch {
		case a[i] < b[i]:
			return -1
		case a[i] > b[i]:
			out = 1
		}
	}
	return out
}

func amount[T int64 | float64](p *T) float64 {
	if p == nil {
		return math.Inf(1)
	}
	return float64(*p)
}

// plan is a tier as a tenant with overrides would have it.
type plan struct {
	t *Tier
	l Limits
}

func planOf(t *Tier, o Overrides) plan { return plan{t: t, l: o.Apply(t.Limits)} }

// monthUnits are the units the plan admits in a month in all.
func (p plan) monthUnits() float64 {
	monthly := amount(p.l.MonthlyQuota)
	if p.t.Overage != OverageBill {
		return monthly
	}
	capUnits := SpendCapUnits(p.l.MaxOverageCents, p.t.Overage, p.t.OveragePriceCentsPer1K)
	if capUnits < 0 {
		return math.Inf(1)
	}
	return monthly + float64(capUnits)
}

// meterRoom returns the plan's daily and monthly room on meter.
func (p plan) meterRoom(meter string) (daily, monthly limitRoom) {
	q := MeterQuotaFor(p.t.MeterQuotas, meter)
	if q == nil {
		inf := math.Inf(1)
		return limitRoom{inf, inf}, limitRoom{inf, inf}
	}
	included := amount(q.MonthlyQuota)
	all := included
	if q.Bills() {
		all = math.Inf(1)
	}
	return limitRoom{amount(q.DailyQuota), amount(q.DailyQuota)}, limitRoom{included, all}
}

// room returns the plan's room in the limit named name, and false for a
// name that is no limit of a tier.
func (p plan) room(name LimitName) (limitRoom, bool) {
	switch name {
	case LimitBurst:
		return limitRoom{amount(p.l.BurstRate), amount(p.l.Burst)}, true
	case LimitBucket:
		return limitRoom{amount(p.l.BucketRefillPerSec), amount(p.l.BucketCapacity)}, true
	case LimitDaily:
		return limitRoom{amount(p.l.DailyQuota), amount(p.l.DailyQuota)}, true
	case LimitMonthly:
		return limitRoom{amount(p.l.MonthlyQuota), p.monthUnits()}, true
	case LimitSpendCap:
		return limitRoom{p.monthUnits(), p.monthUnits()}, true
	}
	s := string(name)
	for _, suffix := range []string{".daily", ".monthly"} {
		if meter, ok := strings.CutSuffix(s, suffix); ok && meter != "" {
			d, m := p.meterRoom(meter)
			if suffix == ".daily" {
				return d, true
			}
			return m, true
		}
	}
	return limitRoom{}, false
}

// tierLimits are the limits of a tier itself, beside its meters'.
var tierLimits = [...]LimitName{LimitBurst, LimitBucket, LimitDaily, LimitMonthly}

// shortfall returns the first limit in which a gives less than b, and
// whether there is one.
func shortfall(a, b plan) (LimitName, bool) {
	at := -1
	eachRoom(a, b, func(k, c int) bool {
		if c < 0 {
			at = k
		}
		return at < 0
	})
	if at < 0 {
		return "", false
	}
	if at < len(tierLimits) {
		return tierLimits[at], true
	}
	at -= len(tierLimits)
	qs := append(slices.Clip(a.t.MeterQuotas), b.t.MeterQuotas...)
	d, m := qs[at/2].Names()
	if at%2 == 0 {
		return d, true
	}
	return m, true
}

// gives reports whether a gives more room than b in some limit (c 1),
// or less (c -1).
func gives(a, b plan, c int) bool {
	found := false
	eachRoom(a, b, func(_, cmp int) bool {
		found = cmp == c
		return !found
	})
	return found
}

// eachRoom calls f with how a's room compares to b's in each limit they
// are compared in, the k-th of them: the tier's own (tierLimits), then
// the daily and monthly limits of each meter quota of a, then of b. It
// stops when f returns false.
func eachRoom(a, b plan, f func(k, c int) bool) {
	k := 0
	for _, n := range tierLimits {
		ra, _ := a.room(n)
		rb, _ := b.room(n)
		if !f(k, ra.compare(rb)) {
			return
		}
		k++
	}
	for _, t := range [2]*Tier{a.t, b.t} {
		for _, q := range t.MeterQuotas {
			ad, am := a.meterRoom(q.Meter)
			bd, bm := b.meterRoom(q.Meter)
			if !f(k, ad.compare(bd)) || !f(k+1, am.compare(bm)) {
				return
			}
			k += 2
		}
	}
}

// Shortfall returns the first limit in which tier t gives less than tier
// other (for a tenant without overrides), and whether there is one: what
// the console warns of when t is ranked above other.
func Shortfall(t, other Tier) (LimitName, bool) {
	return shortfall(planOf(&t, Overrides{}), planOf(&other, Overrides{}))
}

// Upgrades are the upgrade hints of one set of tiers. The hints of tenants
// without overrides are computed once, with the set (the catalog keeps it
// with its tiers), for no refusal and for a refusal by each single limit:
// a refusal then finds its hint with a map lookup and no allocation. Other
// hints are computed when asked, as cheaply. The hints returned are shared:
// callers must not change them.
type Upgrades struct {
	tiers []Tier
	hints []Upgrade // hints[i] is the hint that names tiers[i]
	// plain holds, by tier slug and limit name ("" for no refusal), the
	// hint of a tenant without overrides; nil for none.
	plain map[string]map[LimitName]*Upgrade
}

// NewUpgrades returns the upgrade hints of tiers.
func NewUpgrades(tiers []Tier) *Upgrades {
	u := &Upgrades{tiers: slices.Clone(tiers), hints: make([]Upgrade, len(tiers)),
		plain: make(map[string]map[LimitName]*Upgrade, len(tiers))}
	names := []LimitName{"", LimitBurst, LimitBucket, LimitDaily, LimitMonthly, LimitSpendCap}
	for i := range u.tiers {
		t := &u.tiers[i]
		u.hints[i] = Upgrade{Tier: t.Slug, Name: t.Name, PriceCents: t.PriceCents, DailyQuota: t.DailyQuota,
			MonthlyQuota: t.MonthlyQuota, URL: t.UpgradeURL}
		for _, q := range t.MeterQuotas {
			d, m := q.Names()
			if !slices.Contains(names, d) {
				names = append(names, d, m)
			}
		}
	}
	for i := range u.tiers {
		t := &u.tiers[i]
		byName := make(map[LimitName]*Upgrade, len(names))
		for _, name := range names {
			var violated []LimitName
			if name != "" {
				violated = []LimitName{name}
			}
			byName[name] = u.pick(t, Overrides{}, violated, nil)
		}
		u.plain[t.Slug] = byName
	}
	return u
}

// For returns the hint for a tenant on tier current with overrides o:
// for its refusal d, or, with d nil, without one (its usage). Nil when no
// tier is worth moving to.
func (u *Upgrades) For(current Tier, o Overrides, d *Decision) *Upgrade {
	if u == nil {
		return nil
	}
	var violated []LimitName
	var policies []PolicyState
	if d != nil {
		violated, policies = d.Violated, d.Policies
	}
	if o == (Overrides{}) && len(violated) <= 1 {
		var name LimitName
		if len(violated) == 1 {
			name = violated[0]
		}
		if byName, ok := u.plain[current.Slug]; ok {
			if hint, ok := byName[name]; ok {
				return hint
			}
		}
	}
	for i := range u.tiers {
		if u.tiers[i].Slug == current.Slug {
			return u.pick(&u.tiers[i], o, violated, policies)
		}
	}
	return u.pick(&current, o, violated, policies)
}

// pick chooses the hint of a tenant on cur with overrides o refused by
// violated (none: no refusal), whose policies' states are policies.
func (u *Upgrades) pick(cur *Tier, o Overrides, violated []LimitName, policies []PolicyState) *Upgrade {
	now := planOf(cur, o)
	best := -1
	for i := range u.tiers {
		t := &u.tiers[i]
		if t.Rank <= cur.Rank || t.Slug == cur.Slug {
			continue
		}
		if best >= 0 && (t.PriceCents > u.tiers[best].PriceCents ||
			t.PriceCents == u.tiers[best].PriceCents && t.Rank > u.tiers[best].Rank) {
			continue
		}
		cand := planOf(t, o)
		if gives(cand, now, -1) || !helps(cand, now, violated, policies) {
			continue
		}
		best = i
	}
	if best < 0 {
		return nil
	}
	return &u.hints[best]
}

// helps reports whether cand gives more room than cur in every limit of
// violated, or, with none, in some limit.
func helps(cand, cur plan, violated []LimitName, policies []PolicyState) bool {
	if len(violated) == 0 {
		return gives(cand, cur, 1)
	}
	for _, name := range violated {
		if rc, ok := cand.room(name); ok {
			ru, _ := cur.room(name)
			if rc.compare(ru) <= 0 {
				return false
			}
			continue
		}
		if !escapes(cand.t.Slug, name, policies) {
			return false // prepaid credit, or a policy that applies to cand too
		}
	}
	return true
}

// escapes reports whether a tenant on tier slug would escape the policy
// named name: the policy names tiers, and not that one.
func escapes(slug string, name LimitName, policies []PolicyState) bool {
	for _, st := range policies {
		if st.Policy != nil && LimitName(st.Policy.Name) == name {
			return len(st.Policy.Match.Tiers) > 0 && !slices.Contains(st.Policy.Match.Tiers, slug)
		}
	}
	return false
}

// UpgradeFor returns the hint, without a refusal, of a tenant without
// overrides on current among tiers (see Upgrades).
func UpgradeFor(current Tier, tiers []Tier) *Upgrade {
	return NewUpgrades(tiers).For(current, Overrides{}, nil)
}
