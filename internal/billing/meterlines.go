package billing

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tollgate/tollgate/internal/quota"
)

// MeterOverage is the month's units of one meter admitted past the meter's
// own monthly quota (usage.meter_overage_units; quota.MeterQuota).
type MeterOverage struct {
	Meter string
	Units int64
}

// meterOverageLines rates the billing period's meter overage: one
// "overage" line per meter, in meter order, at the overage price of the
// meter's quota in the tier in force at the end of the period, or, when
// that tier does not bill the meter's overage (its quota was removed or
// blocks since), in the latest tier of the period that does, as the
// tier-wide overage is rated.
// Meter quotas have no price history: a tier's current ones are used. The
// amount is ceil(units × price per 1,000 / 1,000), as the tier's overage.
// A meter no tier of the period bills is listed at 0, so that the units
// show, with the reason.
func meterOverageLines(segs []TierSegment, over []MeterOverage) []InvoiceLine {
	over = slices.Clone(over)
	slices.SortFunc(over, func(a, b MeterOverage) int { return strings.Compare(a.Meter, b.Meter) })
	var lines []InvoiceLine
	for _, o := range over {
		if o.Units <= 0 {
			continue
		}
		q, name := meterRate(segs, o.Meter)
		if q == nil {
			lines = append(lines, InvoiceLine{
				Kind:        "overage",
				Description: fmt.Sprintf("Overage of %s: %s units past its quota (not charged: no plan of the month bills it)", o.Meter, lineUnits(o.Units)),
				Quantity:    o.Units,
			})
			continue
		}
		lines = append(lines, InvoiceLine{
			Kind: "overage",
			Description: fmt.Sprintf("Overage of %s: %s units past its quota of %s at %s per 1,000 (%s plan)",
				o.Meter, lineUnits(o.Units), lineUnits(*q.MonthlyQuota), lineMoney(q.OveragePriceCentsPer1K), name),
			Quantity:    o.Units,
			AmountCents: mulDivCents(o.Units, q.OveragePriceCentsPer1K, 999, 1000),
		})
	}
	return lines
}

// meterRate returns the meter quota whose price rates the meter's
// overage in a period of the segments segs (in order), and its plan's
// name: the latest segment's whose tier bills the meter's overage; nil
// when none does.
func meterRate(segs []TierSegment, meter string) (*quota.MeterQuota, string) {
	for k := len(segs) - 1; k >= 0; k-- {
		if mq := quota.MeterQuotaFor(segs[k].MeterQuotas, meter); mq != nil && mq.Bills() {
			return mq, segs[k].Name
		}
	}
	return nil, ""
}
