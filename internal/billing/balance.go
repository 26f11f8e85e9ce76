package billing

import (
	"context"
	"errors"
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
//     whether Redis has R or not, and whatever of the period's usage the
//     ledger has yet.
//
// The ledger gets usage a flush after Redis counted it: a balance read
// before the usage a postpaid stretch admitted is flushed (in the
// seconds after a move onto a prepaid tier) holds back too little of it
// until the catalog reads the balance again (its refresh loop).

// Prepaid returns what the admissions of the prepaid tenant tenantID on
// tier may draw on in the billing period of cal containing now (see
// quota.Prepaid and above), read in one snapshot: a finalization that
// commits meanwhile is seen whole or not at all. An unknown tenant is
// CodeNotFound.
func (l *Ledger) Prepaid(ctx context.Context, tenantID string, tier quota.Tier, cal quota.Calendar, now time.Time) (quota.Prepaid, error) {
	start, end := cal.Period(now)
	prevStart, _ := cal.Period(start.Add(-time.Nanosecond))
	p := quota.Prepaid{PeriodID: cal.PeriodID(now), Until: end,
		// the tier's overage line and each billed meter quota's
		Lines: 1 + len(slices.DeleteFunc(slices.Clone(tier.MeterQuotas), func(q quota.MeterQuota) bool { return !q.Bills() }))}
	err := pgx.BeginTxFunc(ctx, l.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		base := ratedTenant{cal: cal}
		c := &base.current
		err := tx.QueryRow(ctx, `
			SELECT t.id::text, t.created_at, t.overrides,
			       tr.slug, tr.name, tr.price_cents, tr.monthly_quota, tr.overage, tr.overage_price_cents_per_1k, tr.billing
			FROM tenants t JOIN tiers tr ON tr.slug = t.tier WHERE t.id::text = $1`, tenantID).Scan(
			&base.id, &base.created, &base.overrides,
			&c.Tier, &c.Name, &c.PriceCents, &c.MonthlyQuota, &c.Overage, &c.OveragePriceCentsPer1K, &c.Billing)
		if errors.Is(err, pgx.ErrNoRows) {
			return quota.Errorf(quota.CodeNotFound, "no tenant %q", tenantID)
		}
		if err != nil {
			return fmt.Errorf("billing: prepaid balance: tenant: %w", err)
		}
		// The open periods before this one: the drafts' labels, and the
		// previous period's unless its invoice is final (it may not exist
		// yet: a tenant created in its last minutes).
		prevLabel := labelOf(cal, prevStart)
		rows, err := tx.Query(ctx, `
			SELECT period, status = 'final' FROM invoices
			WHERE tenant_id = $1 AND period <= $2 AND (status = 'draft' OR period = $2) ORDER BY period`, base.id, prevLabel)
		if err != nil {
			return fmt.Errorf("billing: prepaid balance: invoices: %w", err)
		}
		var label time.Time
		var final, prevFinal bool
		var older []time.Time
		_, err = pgx.ForEachRow(rows, []any{&label, &final}, func() error {
			switch {
			case label.Equal(prevLabel):
				prevFinal = final
			case !final:
				older = append(older, label.UTC())
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("billing: prepaid balance: invoices: %w", err)
		}
		// rated rates the tenant's period labelled label, or returns nil
		// when the tenant did not live in it.
		rated := func(label time.Time) (*ratedTenant, error) {
			s, e := periodOf(cal, label)
			if !base.created.Before(e) {
				return nil, nil
			}
			t := base
			t.in = RatingInput{Start: s, End: e, Zone: cal.Zone}
			if err := loadRatingInputs(ctx, tx, []*ratedTenant{&t}, map[string]*ratedTenant{t.id: &t}); err != nil {
				return nil, err
			}
			return &t, nil
		}
		pools, err := creditPools(ctx, tx, []string{base.id}, false)
		if err != nil {
			return err
		}
		pool := pools[base.id]
		p.CreditCents = pool.left(end, time.Time{})
		for _, label := range older {
			t, err := rated(label)
			if err != nil {
				return err
			}
			if t != nil {
				pool.draw(TotalCents(t.rate()), t.in.End)
			}
		}
		var held int64 // millicents
		if !prevFinal {
			t, err := rated(prevLabel)
			if err != nil {
				return err
			}
			if t != nil {
				u, l := splitOverage(t.rate())
				x := u - pool.left(t.in.End, end)
				held = 1000 * max(0, x+l)
				p.PrevID, p.ExpiringMillicents = cal.PeriodID(prevStart), 1000*max(-x, l)
			}
		}
		if t, err := rated(labelOf(cal, now)); err != nil {
			return err
		} else if t != nil {
			u, _ := splitOverage(t.rate())
			over, err := untrackedOverage(ctx, tx, t)
			if err != nil {
				return err
			}
			held += 1000 * (u + over)
		}
		p.BalanceMillicents = 1000*pool.left(end, time.Time{}) - held
		p.HeldCents = p.CreditCents - p.BalanceMillicents/1000
		return nil
	})
	if err != nil {
		return quota.Prepaid{}, err
	}
	return p, nil
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
// for the same units, in cents: nothing for a tenant on one prepaid tier
// all period at one price. A unit admitted on a prepaid tier was drawn at
// the tier's price then (the tier's overage price; the meter's, when the
// tier bills the meter's overage); the tier's overage admitted on a
// postpaid tier before the period's first prepaid draw was drawn with
// that draw, at the price then; any other unit was not drawn. Usage is
// in hourly buckets, so a bucket that a change of tier or price cuts
// counts at the lowest price it may have been drawn at.
func untrackedOverage(ctx context.Context, tx pgx.Tx, t *ratedTenant) (int64, error) {
	segs := t.in.Segments
	var buckets []overageBucket
	if len(segs) <= 1 { // one price all period: the sums are enough
		buckets = append(buckets, overageBucket{t.in.Start, t.in.End, "", t.in.OverageUnits})
		for _, o := range t.in.MeterOverage {
			buckets = append(buckets, overageBucket{t.in.Start, t.in.End, o.Meter, o.Units})
		}
	} else {
		rows, err := tx.Query(ctx, `
			SELECT hour, meter, overage_units, meter_overage_units FROM usage
			WHERE tenant_id = $1 AND hour >= $2 AND hour < $3 AND (overage_units > 0 OR meter_overage_units > 0)`,
			t.id, t.in.Start, t.in.End)
		if err != nil {
			return 0, fmt.Errorf("billing: prepaid balance: usage: %w", err)
		}
		var hour time.Time
		var meter string
		var over, meterOver int64
		_, err = pgx.ForEachRow(rows, []any{&hour, &meter, &over, &meterOver}, func() error {
			if over > 0 {
				buckets = append(buckets, overageBucket{hour, hour.Add(time.Hour), "", over})
			}
			if meterOver > 0 {
				buckets = append(buckets, overageBucket{hour, hour.Add(time.Hour), meter, meterOver})
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("billing: prepaid balance: usage: %w", err)
		}
	}
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
	return cents, nil
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
