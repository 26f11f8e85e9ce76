package billing

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Rating: an invoice's lines from its rating input, in whole cents, with
// no database (the rules: docs/architecture.md, "Invoices: rating and
// timing").

// TierSegment is a stretch [From, To) of a month that a tenant spent on one
// tier, with what rating needs of the tier.
type TierSegment struct {
	Tier       string // slug
	Name       string
	PriceCents int64 // per full month
	// MonthlyQuota is the tenant's monthly quota on this tier (the tier's,
	// or the tenant's override); nil means unlimited.
	MonthlyQuota           *int64
	Overage                quota.Overage
	OveragePriceCentsPer1K int64
	From, To               time.Time
	// MeterQuotas are the tier's meter quotas (current settings: they have
	// no history), for rating the meters' overage.
	MeterQuotas []quota.MeterQuota
	// Billing is how the tier's tenants pay (its current setting: it has
	// no history either); the prepaid balance reads what admission drew.
	Billing quota.Billing
}

// InvoiceGrant is extra units granted for a day or for the month.
type InvoiceGrant struct {
	Period      string    // "day" or "month"
	PeriodStart time.Time // UTC midnight
	Units       int64
}

// RatingInput is everything Rate needs for one tenant's billing period.
type RatingInput struct {
	Start, End time.Time // the billing period, [Start, End)
	// Zone is the tenant's time zone, in which lines show dates (nil: UTC).
	Zone *time.Location
	// Segments are the tiers the tenant was on, clipped to the month and to
	// the tenant's lifetime, oldest first.
	Segments []TierSegment
	// Units and OverageUnits are the month's sums of usage.units and
	// usage.overage_units.
	Units, OverageUnits int64
	// Grants are the month's grant and the grants of its days.
	Grants []InvoiceGrant
	// MeterOverage are the month's units past meter quotas, per meter
	// (usage.meter_overage_units).
	MeterOverage []MeterOverage
}

// Rate returns the lines of a month's invoice: one subscription line per tier
// segment, one included line, one overage line when there are overage units,
// and one line per grant. Amounts are whole cents, never negative: the
// subscription is price × segment seconds / month seconds rounded half up,
// the overage ceil(overage units × price per 1,000 / 1,000). Contiguous
// segments of the same tier at the same price count as one, with the later
// one's overage price and quota (those in force at its end). See Invoicer
// for which prices apply: a caller splits a tier's stretch where its price
// changed, and gives each part the prices in force in it.
func Rate(in RatingInput) []InvoiceLine {
	monthSecs := in.End.Unix() - in.Start.Unix()
	if monthSecs <= 0 {
		return nil
	}
	in.Segments = slices.Clone(in.Segments)
	slices.SortStableFunc(in.Segments, func(a, b TierSegment) int { return a.From.Compare(b.From) })
	var segs []TierSegment
	for _, s := range in.Segments {
		if s.From.Before(in.Start) {
			s.From = in.Start
		}
		if s.To.After(in.End) {
			s.To = in.End
		}
		if !s.To.After(s.From) {
			continue
		}
		if n := len(segs); n > 0 && segs[n-1].To.Equal(s.From) && segs[n-1].Tier == s.Tier && segs[n-1].PriceCents == s.PriceCents {
			// one line; what is in force at its end (an overage price
			// changed alone) is the later part's
			from := segs[n-1].From
			segs[n-1] = s
			segs[n-1].From = from
			continue
		}
		segs = append(segs, s)
	}

	var lines []InvoiceLine
	// A period across a DST change is an hour off whole days: its days are
	// rounded; proration still divides by its exact seconds.
	monthDays := (monthSecs + 43200) / 86400
	loc := in.Zone
	if loc == nil {
		loc = time.UTC
	}
	for _, s := range segs {
		secs := s.To.Unix() - s.From.Unix()
		lines = append(lines, InvoiceLine{
			Kind: "subscription",
			Description: fmt.Sprintf("%s plan, %s – %s (%s of %d days)",
				s.Name, lineDay(s.From, loc), lineDay(s.To, loc), lineDays(secs), monthDays),
			Quantity:    secs,
			AmountCents: mulDivCents(s.PriceCents, 2*secs, monthSecs, 2*monthSecs),
		})
	}

	included := InvoiceLine{Kind: "included", Description: "Usage", Quantity: max(in.Units, 0)}
	if len(segs) > 0 {
		last := segs[len(segs)-1]
		q := "unlimited units"
		if last.MonthlyQuota != nil {
			q = lineUnits(*last.MonthlyQuota) + " units"
		}
		included.Description = fmt.Sprintf("Usage, included in %s plan: %s per month", last.Name, q)
	}
	lines = append(lines, included)

	if in.OverageUnits > 0 {
		price, name := overageRate(segs)
		lines = append(lines, InvoiceLine{
			Kind:        "overage",
			Description: fmt.Sprintf("Overage: %s units at %s per 1,000 (%s plan)", lineUnits(in.OverageUnits), lineMoney(price), name),
			Quantity:    in.OverageUnits,
			AmountCents: mulDivCents(in.OverageUnits, price, 999, 1000),
		})
	}

	lines = append(lines, meterOverageLines(segs, in.MeterOverage)...)

	grants := slices.Clone(in.Grants)
	slices.SortStableFunc(grants, func(a, b InvoiceGrant) int {
		if c := a.PeriodStart.Compare(b.PeriodStart); c != 0 {
			return c
		}
		if a.Period == b.Period {
			return 0
		}
		if a.Period == "month" {
			return -1
		}
		return 1
	})
	for _, g := range grants {
		if g.Units <= 0 {
			continue
		}
		when := g.PeriodStart.UTC().Format("2006-01-02")
		if g.Period == "month" && g.PeriodStart.UTC().Day() == 1 {
			when = g.PeriodStart.UTC().Format("January 2006")
		} else if g.Period == "month" {
			when = "the period from " + when
		}
		lines = append(lines, InvoiceLine{
			Kind:        "grant",
			Description: fmt.Sprintf("Grant: %s extra units for %s (not charged)", lineUnits(g.Units), when),
			Quantity:    g.Units,
		})
	}
	return lines
}

// overageRate returns the price per 1,000 units that rates a period's
// tier overage, of the segments segs (in order), and its plan's name: the
// last segment's, or when its tier does not bill overage, the latest
// billing one's.
func overageRate(segs []TierSegment) (price int64, name string) {
	name = "no plan"
	for k := len(segs) - 1; k >= 0; k-- {
		if k == len(segs)-1 || segs[k].Overage == quota.OverageBill {
			price, name = segs[k].OveragePriceCentsPer1K, segs[k].Name
		}
		if segs[k].Overage == quota.OverageBill {
			break
		}
	}
	return price, name
}

// TotalCents returns the sum of the lines' amounts, saturating at the
// largest int64 rather than overflowing.
func TotalCents(lines []InvoiceLine) int64 {
	var total int64
	for _, l := range lines {
		if l.AmountCents > math.MaxInt64-total {
			return math.MaxInt64
		}
		total += l.AmountCents
	}
	return total
}

// mulDivCents returns (a×b + add) / d for non-negative a, b, add and positive d,
// through a 128-bit product so that nothing overflows, saturating at the
// largest int64. Rounding up is add = d-1; half up is add = d/2.
func mulDivCents(a, b, add, d int64) int64 {
	if a <= 0 || b <= 0 || d <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	var c uint64
	lo, c = bits.Add64(lo, uint64(max(add, 0)), 0)
	hi += c
	if hi >= uint64(d) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(d))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// lineDay shows a segment boundary: its local date in loc (the tenant's
// zone; UTC for the default calendar), with the local time of day when it
// is not midnight.
func lineDay(t time.Time, loc *time.Location) string {
	t = t.In(loc)
	if h, m, s := t.Clock(); h == 0 && m == 0 && s == 0 && t.Nanosecond() == 0 {
		return t.Format("2006-01-02")
	}
	return t.Format("2006-01-02 15:04")
}

// lineDays shows seconds as days with one decimal, rounded half up.
func lineDays(secs int64) string {
	tenths := (secs*10 + 43200) / 86400
	return fmt.Sprintf("%d.%d", tenths/10, tenths%10)
}

// lineMoney shows cents as dollars: 50 → "$0.50".
func lineMoney(c int64) string { return fmt.Sprintf("$%d.%02d", c/100, c%100) }

// lineUnits groups digits by thousands: 1234567 → "1,234,567".
func lineUnits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := len(s) > 0 && s[0] == '-'
	if neg {
		s = s[1:]
	}
	var out []byte
	for k := range len(s) {
		if k > 0 && (len(s)-k)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[k])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
