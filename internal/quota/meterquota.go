package quota

import (
	"fmt"
	"regexp"
)

// MeterQuota is a quota of one meter of a tier (API.md "Plans (v2)", quotas
// per meter): 10,000 searches and 100 exports a month beside the tier-wide
// quotas. It is enforced in the same atomic decision as the tier's limits,
// on the requests of routes of that meter, and named "<meter>.daily" and
// "<meter>.monthly" in headers, problems and /v1/usage.
//
// Its periods are the tenant's (the same days and months as the tier-wide
// quotas). Grants add to the tier-wide quotas only. Overage "bill" admits
// past the monthly quota and bills the units past it at the meter's own
// price, on an invoice line of the meter; a unit past both the meter's and
// the tier's monthly quota is billed once, at the meter's price (it is
// counted as the meter's overage, not the tier's). The tier's spend cap
// (max_overage_cents) bounds the month's overage cost of both together.
// The daily quota is always a hard cap, as the tier's is.
type MeterQuota struct {
	Meter                  string  `json:"meter"`
	DailyQuota             *int64  `json:"daily_quota"`
	MonthlyQuota           *int64  `json:"monthly_quota"`
	Overage                Overage `json:"overage"`
	OveragePriceCentsPer1K int64   `json:"overage_price_cents_per_1k"`
}

// MaxMeterQuotas bounds the meter quotas of one tier.
const MaxMeterQuotas = 32

// meterRE is the routes' meter syntax (internal/routes).
var meterRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)

// ValidMeter reports whether s is a meter name routes may use: 1 to 64 of
// a-z 0-9 _ . -, starting with a letter or digit.
func ValidMeter(s string) bool { return meterRE.MatchString(s) }

// Names are the limit names of q: "<meter>.daily" and "<meter>.monthly".
func (q MeterQuota) Names() (daily, monthly LimitName) {
	return LimitName(q.Meter + ".daily"), LimitName(q.Meter + ".monthly")
}

// Bills reports whether q bills its overage.
func (q MeterQuota) Bills() bool { return q.Overage == OverageBill && q.MonthlyQuota != nil }

// Validate checks q (the k-th of its tier) and returns a CodeInvalid *Error
// naming the bad field as meter_quotas[k].field.
func (q MeterQuota) Validate(k int) error {
	field := func(f string) string { return fmt.Sprintf("meter_quotas[%d].%s", k, f) }
	if !ValidMeter(q.Meter) {
		return FieldError(field("meter"), "must be 1 to 64 of a-z 0-9 _ . -, starting with a letter or digit")
	}
	if q.DailyQuota == nil && q.MonthlyQuota == nil {
		return FieldError(field("daily_quota"), "a meter quota needs daily_quota, monthly_quota or both")
	}
	if q.DailyQuota != nil {
		if err := checkCount(field("daily_quota"), *q.DailyQuota, 0); err != nil {
			return err
		}
	}
	if q.MonthlyQuota != nil {
		if err := checkCount(field("monthly_quota"), *q.MonthlyQuota, 0); err != nil {
			return err
		}
	}
	switch q.Overage {
	case OverageBlock:
		if q.OveragePriceCentsPer1K != 0 {
			return FieldError(field("overage_price_cents_per_1k"), "must be 0 when overage is block")
		}
	case OverageBill:
		if q.OveragePriceCentsPer1K <= 0 || q.OveragePriceCentsPer1K > MaxPrice {
			return FieldError(field("overage_price_cents_per_1k"), "must be between 1 and %d when overage is bill", MaxPrice)
		}
		if q.MonthlyQuota == nil {
			return FieldError(field("overage"), "bill needs a monthly_quota to bill past")
		}
	default:
		return FieldError(field("overage"), `must be "block" or "bill"`)
	}
	return nil
}

// ValidateMeterQuotas checks a tier's meter quotas: each valid, at most
// MaxMeterQuotas, no meter twice.
func ValidateMeterQuotas(qs []MeterQuota) error {
	if len(qs) > MaxMeterQuotas {
		return FieldError("meter_quotas", "at most %d meter quotas", MaxMeterQuotas)
	}
	seen := make(map[string]bool, len(qs))
	for k, q := range qs {
		if err := q.Validate(k); err != nil {
			return err
		}
		if seen[q.Meter] {
			return FieldError(fmt.Sprintf("meter_quotas[%d].meter", k), "meter %q has a quota already", q.Meter)
		}
		seen[q.Meter] = true
	}
	return nil
}

// MeterQuotaFor returns the quota of meter among qs, or nil.
func MeterQuotaFor(qs []MeterQuota, meter string) *MeterQuota {
	for k := range qs {
		if qs[k].Meter == meter {
			return &qs[k]
		}
	}
	return nil
}
