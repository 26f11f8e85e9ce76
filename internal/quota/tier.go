package quota

import (
	"math"
	"regexp"
	"time"
)

// Overage says what a tier does with a request that would exceed its monthly
// quota.
type Overage string

const (
	// OverageBlock refuses requests past the monthly quota.
	OverageBlock Overage = "block"
	// OverageBill admits them and bills the units past the quota at the tier's
	// price per 1,000 units.
	OverageBill Overage = "bill"
)

// Limits are the admission limits of a tier (or of a tenant, after its
// overrides). A nil field means unlimited: that limit is not enforced.
//
// BurstRate and Burst configure GCRA, which counts requests: BurstRate requests
// per second on average, Burst of them at once. BucketCapacity and
// BucketRefillPerSec configure the token bucket, which counts cost units.
// DailyQuota and MonthlyQuota count cost units per UTC calendar day and month.
// MaxOverageCents is the spend cap of a bill tier: the most the month's
// overage may cost, in cents (nil: no cap; ignored unless the overage is
// billed). See SpendCapUnits for how it is enforced.
type Limits struct {
	BurstRate          *float64 `json:"burst_rate"`
	Burst              *int64   `json:"burst"`
	BucketCapacity     *int64   `json:"bucket_capacity"`
	BucketRefillPerSec *float64 `json:"bucket_refill_per_sec"`
	DailyQuota         *int64   `json:"daily_quota"`
	MonthlyQuota       *int64   `json:"monthly_quota"`
	MaxOverageCents    *int64   `json:"max_overage_cents"`
}

// Tier is a priced plan: its limits, its monthly price in cents and what
// happens past its monthly quota. Rank orders tiers for upgrade hints: a
// higher rank is a bigger plan.
type Tier struct {
	Slug                   string  `json:"slug"`
	Name                   string  `json:"name"`
	Rank                   int     `json:"rank"`
	PriceCents             int64   `json:"price_cents"`
	Limits                         // burst_rate … monthly_quota, inlined in JSON
	Overage                Overage `json:"overage"`
	OveragePriceCentsPer1K int64   `json:"overage_price_cents_per_1k"`
	FailOpen               bool    `json:"fail_open"`
	UpgradeURL             string  `json:"upgrade_url"`
	// MeterQuotas are the tier's quotas of single meters (never nil once
	// read from the store: [] in JSON).
	MeterQuotas []MeterQuota `json:"meter_quotas"`
	// Billing is how the tier's tenants pay ("" reads as postpaid); a
	// prepaid tier's refusals for want of credit point to TopUpURL.
	Billing  Billing `json:"billing"`
	TopUpURL string  `json:"top_up_url"`
}

// IsPrepaid reports whether the tier's admissions draw on credit.
func (t Tier) IsPrepaid() bool { return t.Billing == BillingPrepaid }

// Bounds on configuration values, chosen so that every quantity the admission
// script computes stays an exact integer in a Lua double (below 2^53).
const (
	MaxQuantity  = int64(1) << 40 // units or requests in one limit
	MaxRate      = 1e6            // requests or units per second
	MinRate      = 1e-6           // one per ~11.6 days
	MaxPrice     = int64(1) << 40 // cents
	MaxNameLen   = 200
	MaxURLLength = 2048
	// MaxWindowMicros bounds a burst or bucket window (burst × interval,
	// capacity × interval): 2^50 µs, about 35.7 years, keeps now plus a
	// window exact in a Lua double until the 2200s.
	MaxWindowMicros = int64(1) << 50
)

var slugRE = regexp.MustCompile(`^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidSlug reports whether s is a valid tier slug: 1 to 63 lowercase letters,
// digits and inner hyphens.
func ValidSlug(s string) bool { return slugRE.MatchString(s) }

// Validate checks l and returns a CodeInvalid *Error naming the first bad field.
func (l Limits) Validate() error {
	if (l.BurstRate == nil) != (l.Burst == nil) {
		return FieldError("burst", "burst_rate and burst are both set or both null")
	}
	if l.BurstRate != nil {
		if err := checkRate("burst_rate", *l.BurstRate); err != nil {
			return err
		}
		if err := checkCount("burst", *l.Burst, 1); err != nil {
			return err
		}
		if *l.Burst > MaxWindowMicros/IntervalMicros(*l.BurstRate) {
			return FieldError("burst", "burst / burst_rate must be at most %d seconds", MaxWindowMicros/1e6)
		}
	}
	if (l.BucketCapacity == nil) != (l.BucketRefillPerSec == nil) {
		return FieldError("bucket_capacity", "bucket_capacity and bucket_refill_per_sec are both set or both null")
	}
	if l.BucketCapacity != nil {
		if err := checkCount("bucket_capacity", *l.BucketCapacity, 1); err != nil {
			return err
		}
		if err := checkRate("bucket_refill_per_sec", *l.BucketRefillPerSec); err != nil {
			return err
		}
		if *l.BucketCapacity > MaxWindowMicros/IntervalMicros(*l.BucketRefillPerSec) {
			return FieldError("bucket_capacity", "bucket_capacity / bucket_refill_per_sec must be at most %d seconds", MaxWindowMicros/1e6)
		}
	}
	if l.DailyQuota != nil {
		if err := checkCount("daily_quota", *l.DailyQuota, 0); err != nil {
			return err
		}
	}
	if l.MonthlyQuota != nil {
		if err := checkCount("monthly_quota", *l.MonthlyQuota, 0); err != nil {
			return err
		}
	}
	if l.MaxOverageCents != nil && (*l.MaxOverageCents < 0 || *l.MaxOverageCents > MaxPrice) {
		return FieldError("max_overage_cents", "must be an integer between 0 and %d, or null", MaxPrice)
	}
	return nil
}

// SpendCapUnits converts a spend cap to the overage units it allows in a
// month: floor(max_overage_cents × 1000 / price per 1,000 units), or -1
// (no cap) when there is no cap, the overage is not billed or costs
// nothing. Rounding down means a request is refused once its overage would
// make the month's overage cost more than the cap (the cost of units taken
// as units × price / 1000, unrounded): with 7 cents per 1,000 units and a
// cap of 1 cent, 142 units (0.994 cent) pass and the 143rd is refused.
// The result is at most 2^40 × 1000 (below 2^53, exact in the script).
func SpendCapUnits(maxOverageCents *int64, overage Overage, pricePer1K int64) int64 {
	if maxOverageCents == nil || overage != OverageBill || pricePer1K <= 0 {
		return -1
	}
	return *maxOverageCents * 1000 / pricePer1K
}

// Validate checks t and returns a CodeInvalid *Error naming the first bad field.
func (t Tier) Validate() error {
	if !ValidSlug(t.Slug) {
		return FieldError("slug", "must be 1 to 63 lowercase letters, digits or inner hyphens")
	}
	switch {
	case t.Name == "" || len(t.Name) > MaxNameLen: // CheckName when it is set
		return FieldError("name", "must be 1 to %d characters", MaxNameLen)
	case t.Rank < 0 || t.Rank > 1_000_000:
		return FieldError("rank", "must be between 0 and 1000000")
	case t.PriceCents < 0 || t.PriceCents > MaxPrice:
		return FieldError("price_cents", "must be between 0 and %d", MaxPrice)
	}
	if err := t.Limits.Validate(); err != nil {
		return err
	}
	switch t.Overage {
	case OverageBlock:
		if t.OveragePriceCentsPer1K != 0 {
			return FieldError("overage_price_cents_per_1k", "must be 0 when overage is block")
		}
		if t.MaxOverageCents != nil {
			return FieldError("max_overage_cents", "must be null when overage is block")
		}
	case OverageBill:
		if t.OveragePriceCentsPer1K <= 0 || t.OveragePriceCentsPer1K > MaxPrice {
			return FieldError("overage_price_cents_per_1k", "must be between 1 and %d when overage is bill", MaxPrice)
		}
	default:
		return FieldError("overage", `must be "block" or "bill"`)
	}
	if len(t.UpgradeURL) > MaxURLLength {
		return FieldError("upgrade_url", "must be at most %d characters", MaxURLLength)
	}
	if err := t.checkBilling(); err != nil {
		return err
	}
	return ValidateMeterQuotas(t.MeterQuotas)
}

func checkRate(field string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < MinRate || v > MaxRate {
		return FieldError(field, "must be a positive number between %g and %g, or null", MinRate, MaxRate)
	}
	return nil
}

func checkCount(field string, v, lo int64) error {
	if v < lo || v > MaxQuantity {
		return FieldError(field, "must be an integer between %d and %d, or null", lo, MaxQuantity)
	}
	return nil
}

// IntervalMicros converts a rate per second to the interval between two
// units in whole microseconds, rounded to nearest and at least 1. The Lua
// script and the Go models both use this integer, so they agree exactly.
func IntervalMicros(perSec float64) int64 {
	return max(int64(math.Round(1e6/perSec)), 1)
}

// Ptr returns a pointer to v; handy for optional limits.
func Ptr[T any](v T) *T { return &v }

// DayStart returns the start of the UTC calendar day containing t.
func DayStart(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// MonthStart returns the start of the UTC calendar month containing t.
func MonthStart(t time.Time) time.Time {
	y, m, _ := t.UTC().Date()
	return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
}
