package billing

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/quota"
)

// The prepaid balance (quota.Prepaid) is what a prepaid tenant's
// admissions of a billing period may draw: the credit the period's
// invoice will be able to draw once every invoice before it that is not
// final yet has drawn its share. It is computed as the invoicer will
// finalize those invoices, with the same code: each open period rated as
// Generate rates it (ratedTenant.rate, on the ledger as it is now, not on
// a draft that may be older), and the credits drawn period after period,
// oldest first, by the one rule of which credit pays which invoice
// (availableCredit.pays, creditPool). So a postpaid plan's price, the
// prorated price of a plan left in the middle of a period, a postpaid
// period's overage: every charge an open invoice will take is held back,
// and a credit counts only for the invoices it may pay.
//
// What admission draws itself is Redis's (admit.lua, "Prepaid"): the
// draws of this period and, while its invoice is not final, of the
// previous one. The balance leaves out what Redis counts:
//
//   - This period's overage lines are drawn at admission, unit by unit, at
//     the overage price in force then, and with its first prepaid unit
//     the tier's overage admitted earlier in the period (a tenant moved
//     onto the tier). What the invoice charges for them beyond what those
//     draws must have counted (overage admitted on a postpaid plan after
//     a prepaid draw, a meter's overage from before the move, a higher
//     price at the period's end) is held back (untrackedOverage).
//   - The previous period's draws (R, in Redis, ppmc plus a rounding cent
//     per line) count only when Redis has them: the tenant drew in that
//     period. Its invoice takes U (its lines but the overage ones) plus
//     the larger of R and L (its overage lines, rated on the ledger), and
//     draws first E, the credit that pays it but not this period's
//     invoice (all of which expires before that one's end, and so comes
//     first in drawOrder); it takes what passes E from the credit of this
//     period. With X = U - E, the balance holds H = max(0, X + L) and
//     sends ExpiringMillicents = max(-X, L): the script's
//     H + max(0, R - ExpiringMillicents) is then max(0, X + L, X + R),
//     whether Redis has R or not: while the ledger lacks the period's
//     last usage, R covers what of it admission drew. That invoice takes
//     no more than the credit it shares with this period's (S: a credit
//     granted after its period ended is not of it): when X + L >= S, it
//     takes all of S whatever R is, so H = S and ExpiringMillicents is
//     unboundedMillicents, which no draws reach.
//
// The ledger gets usage a flush after Redis counted it: a balance read
// before the usage a postpaid stretch admitted is flushed (the seconds
// after a move onto a prepaid tier, or after a postpaid period's end)
// holds back too little of it until the catalog reads the balance again
// (its refresh loop).

// Prepaid returns what the admissions of the prepaid tenant tenantID on
// tier may draw on in the billing period of cal containing now (see
// quota.Prepaid and above): Prepaids of one. An unknown tenant is
// CodeNotFound.
func (l *Ledger) Prepaid(ctx context.Context, tenantID string, tier quota.Tier, cal quota.Calendar, now time.Time) (quota.Prepaid, error) {
	ps, missing, err := l.prepaids(ctx, []quota.PrepaidOf{{TenantID: tenantID, Tier: tier, Calendar: cal}}, now)
	if err != nil {
		return quota.Prepaid{}, err
	}
	if len(missing) > 0 {
		return quota.Prepaid{}, quota.Errorf(quota.CodeNotFound, "no tenant %q", tenantID)
	}
	return ps[0], nil
}

// balanceOf is what Prepaids gathers for one tenant.
type balanceOf struct {
	of                    quota.PrepaidOf
	base                  ratedTenant // id, creation, overrides, current tier
	start, end, prevStart time.Time
	prevLabel             time.Time
	prevFinal             bool
	older                 []time.Time // the labels of the drafts before the previous period's
	rated                 map[int]*ratedTenant
	buckets               []overageBucket // this period's overage, by hour
}

// unboundedMillicents is an ExpiringMillicents no draws of a period reach
// (a period's credit is at most 2^40 cents, 2^50 millicents), and which
// the admission script's numbers (doubles) hold exactly.
const unboundedMillicents = 1 << 53

// The rated periods of a balanceOf, besides older[k] at k.
const (
	ratedPrev = -1
	ratedCur  = -2
)

// Prepaids returns the balances of the prepaid tenants ts at now (see
// Prepaid), in their order, read in one snapshot (a finalization that
// commits meanwhile is seen whole or not at all) and in a fixed handful
// of statements however many tenants they are (the rating statements take
// every tenant's period at once, as the invoicer's do). A tenant that does
// not exist (deleted meanwhile) gets a balance of nothing.
func (l *Ledger) Prepaids(ctx context.Context, ts []quota.PrepaidOf, now time.Time) ([]quota.Prepaid, error) {
	ps, _, err := l.prepaids(ctx, ts, now)
	return ps, err
}

// prepaids is Prepaids, which also returns the tenants that do not exist.
func (l *Ledger) prepaids(ctx context.Context, ts []quota.PrepaidOf, now time.Time) (out []quota.Prepaid, missing []string, err error) {
	bs := make(map[string]*balanceOf, len(ts))
	var ids []string
	for _, of := range ts {
		if bs[of.TenantID] != nil {
			continue
		}
		b := &balanceOf{of: of, rated: map[int]*ratedTenant{}}
		b.start, b.end = of.Calendar.Period(now)
		b.prevStart, _ = of.Calendar.Period(b.start.Add(-time.Nanosecond))
		b.prevLabel = labelOf(of.Calendar, b.prevStart)
		b.base.cal = of.Calendar
		bs[of.TenantID] = b
		ids = append(ids, of.TenantID)
	}
	out = make([]quota.Prepaid, len(ts))
	err = pgx.BeginTxFunc(ctx, l.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		missing = missing[:0]
		ids, err := loadBalanceTenants(ctx, tx, ids, bs)
		if err != nil {
			return err
		}
		for id, b := range bs {
			if b.base.id == "" {
				missing = append(missing, id)
			}
		}
		pools, err := creditPools(ctx, tx, ids, false)
		if err != nil {
			return err
		}
		if err := rateOpenPeriods(ctx, tx, ids, bs, now); err != nil {
			return err
		}
		for k, of := range ts {
			out[k] = bs[of.TenantID].balance(pools[of.TenantID], now)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, missing, nil
}

// loadBalanceTenants reads the tenants ids of bs (their creation,
// overrides and current tier) and their open invoices before the current
// period: the drafts' labels, and whether the previous period's is final.
// It returns the ids of those that exist.
func loadBalanceTenants(ctx context.Context, tx pgx.Tx, ids []string, bs map[string]*balanceOf) ([]string, error) {
	var id string
	var t ratedTenant
	c := &t.current
	rows, err := tx.Query(ctx, `
		SELECT t.id::text, t.created_at, t.overrides,
		       tr.slug, tr.name, tr.price_cents, tr.monthly_quota, tr.overage, tr.overage_price_cents_per_1k, tr.billing
		FROM tenants t JOIN tiers tr ON tr.slug = t.tier WHERE t.id = ANY($1::uuid[])`, ids)
	if err != nil {
		return nil, fmt.Errorf("billing: prepaid balance: tenants: %w", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&id, &t.created, &t.overrides,
		&c.Tier, &c.Name, &c.PriceCents, &c.MonthlyQuota, &c.Overage, &c.OveragePriceCentsPer1K, &c.Billing}, func() error {
		b := bs[id]
		t.id, t.cal = id, b.base.cal
		b.base = t
		t = ratedTenant{} // (a scan into the same overrides would keep fields the next row lacks)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("billing: prepaid balance: tenants: %w", err)
	}
	ids = slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return bs[id].base.id == "" })
	labels := make([]time.Time, len(ids))
	for k, id := range ids {
		labels[k] = bs[id].prevLabel
	}
	var label time.Time
	var final bool
	rows, err = tx.Query(ctx, `
		SELECT i.tenant_id::text, i.period, i.status = 'final'
		FROM unnest($1::uuid[], $2::date[]) AS b(tenant_id, pl)
		JOIN invoices i ON i.tenant_id = b.tenant_id AND i.period <= b.pl AND (i.status = 'draft' OR i.period = b.pl)
		WHERE i.tenant_id = ANY($1::uuid[])
		ORDER BY 1, 2`, ids, labels)
	if err != nil {
		return nil, fmt.Errorf("billing: prepaid balance: invoices: %w", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&id, &label, &final}, func() error {
		b := bs[id]
		switch label = label.UTC(); {
		case label.Equal(b.prevLabel):
			b.prevFinal = final
		case !final:
			b.older = append(b.older, label)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("billing: prepaid balance: invoices: %w", err)
	}
	return ids, nil
}

// rateOpenPeriods rates the open periods of the tenants of bs (each
// tenant's current one, its previous one unless final, its older drafts'),
// as Generate will, and reads the current periods' overage by hour where
// they have more than one price. Each call of loadRatingInputs takes one
// period of every tenant that has one: all current periods, then all
// previous ones, then all first older drafts, and so on.
func rateOpenPeriods(ctx context.Context, tx pgx.Tx, ids []string, bs map[string]*balanceOf, now time.Time) error {
	for slot := ratedCur; ; slot++ {
		var ts []*ratedTenant
		byID := map[string]*ratedTenant{}
		for _, id := range ids {
			b := bs[id]
			var label time.Time
			switch {
			case slot == ratedCur:
				label = labelOf(b.of.Calendar, now)
			case slot == ratedPrev && !b.prevFinal:
				label = b.prevLabel
			case slot >= 0 && slot < len(b.older):
				label = b.older[slot]
			default:
				continue
			}
			s, e := periodOf(b.of.Calendar, label)
			if !b.base.created.Before(e) {
				continue
			}
			t := b.base
			t.in = RatingInput{Start: s, End: e, Zone: b.of.Calendar.Zone}
			b.rated[slot] = &t
			ts, byID[id] = append(ts, &t), &t
		}
		if len(ts) == 0 {
			if slot >= 0 {
				break
			}
			continue
		}
		if err := loadRatingInputs(ctx, tx, ts, byID); err != nil {
			return err
		}
		for _, t := range ts {
			t.lines = t.rate()
		}
	}
	return loadOverageBuckets(ctx, tx, ids, bs)
}

// loadOverageBuckets reads, for each tenant of bs whose current period has
// more than one price (tier or price changes), the period's overage by
// hour; the others' buckets are their sums, one per line.
func loadOverageBuckets(ctx context.Context, tx pgx.Tx, ids []string, bs map[string]*balanceOf) error {
	var hourly []string
	var starts, ends []time.Time
	for _, id := range ids {
		t := bs[id].rated[ratedCur]
		if t == nil {
			continue
		}
		if len(t.in.Segments) > 1 {
			hourly, starts, ends = append(hourly, id), append(starts, t.in.Start), append(ends, t.in.End)
			continue
		}
		b := bs[id]
		b.buckets = append(b.buckets, overageBucket{t.in.Start, t.in.End, "", t.in.OverageUnits})
		for _, o := range t.in.MeterOverage {
			b.buckets = append(b.buckets, overageBucket{t.in.Start, t.in.End, o.Meter, o.Units})
		}
	}
	if len(hourly) == 0 {
		return nil
	}
	var id, meter string
	var hour time.Time
	var over, meterOver int64
	rows, err := tx.Query(ctx, `
		SELECT u.tenant_id::text, u.hour, u.meter, u.overage_units, u.meter_overage_units
		FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[]) AS b(tenant_id, ps, pe)
		JOIN usage u ON u.tenant_id = b.tenant_id AND u.hour >= b.ps AND u.hour < b.pe
		WHERE u.tenant_id = ANY($1::uuid[]) AND (u.overage_units > 0 OR u.meter_overage_units > 0)`, hourly, starts, ends)
	if err != nil {
		return fmt.Errorf("billing: prepaid balance: usage: %w", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&id, &hour, &meter, &over, &meterOver}, func() error {
		b := bs[id]
		if over > 0 {
			b.buckets = append(b.buckets, overageBucket{hour, hour.Add(time.Hour), "", over})
		}
		if meterOver > 0 {
			b.buckets = append(b.buckets, overageBucket{hour, hour.Add(time.Hour), meter, meterOver})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("billing: prepaid balance: usage: %w", err)
	}
	return nil
}

// balance computes b's balance from its rated periods and its credits
// (pool, which it draws on).
func (b *balanceOf) balance(pool creditPool, now time.Time) quota.Prepaid {
	cal := b.of.Calendar
	p := quota.Prepaid{PeriodID: cal.PeriodID(now), Until: b.end,
		// the tier's overage line and each billed meter quota's
		Lines: 1 + len(slices.DeleteFunc(slices.Clone(b.of.Tier.MeterQuotas), func(q quota.MeterQuota) bool { return !q.Bills() })),
		// before the invoices not final draw
		CreditCents: pool.left(b.end, time.Time{})}
	for k := range b.older {
		if t := b.rated[k]; t != nil {
			pool.draw(TotalCents(t.lines), t.in.End)
		}
	}
	var held int64 // millicents
	if t := b.rated[ratedPrev]; t != nil {
		u, l := splitOverage(t.lines)
		x := u - pool.left(t.in.End, b.end)
		shared := pool.left(b.end, time.Time{}) - pool.left(b.end, t.in.End) // what pays both invoices
		p.PrevID = cal.PeriodID(b.prevStart)
		if x+l >= shared { // it takes all of it, however much it drew
			held, p.ExpiringMillicents = 1000*shared, unboundedMillicents
		} else {
			held, p.ExpiringMillicents = 1000*max(0, x+l), 1000*max(-x, l)
		}
	}
	if t := b.rated[ratedCur]; t != nil {
		u, _ := splitOverage(t.lines)
		held += 1000 * (u + untrackedOverage(t, b.buckets))
	}
	p.BalanceMillicents = 1000*pool.left(b.end, time.Time{}) - held
	p.HeldCents = p.CreditCents - p.BalanceMillicents/1000
	return p
}

// splitOverage returns the sum of the amounts of lines but the overage
// ones, and that of the overage ones (the tier's and the meters').
func splitOverage(lines []InvoiceLine) (other, overage int64) {
	for _, l := range lines {
		if l.Kind == "overage" {
			overage += l.AmountCents
		} else {
			other += l.AmountCents
		}
	}
	return other, overage
}

// overageBucket is overage units admitted in [from, to): the tier's
// (meter "") or one meter's past its own quota.
type overageBucket struct {
	from, to time.Time
	meter    string
	units    int64
}

// untrackedOverage returns what t's overage lines (t rated, in its
// current billing period) charge beyond what admission must have drawn
// for the same units (buckets: the period's overage units by when they
// were admitted), in cents: nothing for a tenant on one prepaid tier all
// period at one price. A unit admitted on a prepaid tier was drawn at the
// tier's price then (the tier's overage price; the meter's, when the tier
// bills the meter's overage); the tier's overage admitted on a postpaid
// tier before the period's first prepaid draw was drawn with that draw,
// at the price then; any other unit was not drawn. Usage is in hourly
// buckets, so a bucket that a change of tier or price cuts counts at the
// lowest price it may have been drawn at.
func untrackedOverage(t *ratedTenant, buckets []overageBucket) int64 {
	segs := t.in.Segments
	charged := map[string]int64{} // millicents the invoice charges, per line ("": the tier's)
	drawn := map[string]int64{}   // the least admission drew for them
	if t.in.OverageUnits > 0 {
		price, _ := overageRate(segs)
		charged[""] = t.in.OverageUnits * price
	}
	for _, o := range t.in.MeterOverage {
		if q, _ := meterRate(segs, o.Meter); q != nil {
			charged[o.Meter] = o.Units * q.OveragePriceCentsPer1K
		}
	}
	for _, b := range buckets {
		least := int64(-1)
		for k, s := range segs {
			if s.From.Before(b.to) && b.from.Before(s.To) {
				if d := drawPrice(segs, k, b.meter); least < 0 || d < least {
					least = d
				}
			}
		}
		drawn[b.meter] += b.units * max(least, 0)
	}
	var cents int64
	for line, mc := range charged {
		if n := mc - drawn[line]; n > 0 {
			cents += (n + 999) / 1000
		}
	}
	return cents
}

// drawPrice returns the least price per unit, in millicents, at which
// admission drew a unit of overage of meter ("": the tier's) admitted in
// the segment segs[k] of a period.
func drawPrice(segs []TierSegment, k int, meter string) int64 {
	tierPrice := func(s TierSegment) int64 {
		if s.Overage == quota.OverageBill {
			return s.OveragePriceCentsPer1K
		}
		return 0
	}
	s := segs[k]
	switch {
	case meter != "":
		if q := quota.MeterQuotaFor(s.MeterQuotas, meter); s.Billing == quota.BillingPrepaid && q != nil && q.Bills() {
			return q.OveragePriceCentsPer1K
		}
		return 0
	case s.Billing == quota.BillingPrepaid:
		return tierPrice(s)
	}
	// postpaid: drawn with the period's first prepaid draw, if it comes
	// after (a prepaid stretch before may have drawn already)
	least := int64(-1)
	for j, o := range segs {
		if o.Billing != quota.BillingPrepaid {
			continue
		}
		if j < k {
			return 0
		}
		if d := tierPrice(o); least < 0 || d < least {
			least = d
		}
	}
	return max(least, 0)
}
