package httpx

import "github.com/tollgate/tollgate/internal/quota"

// TierFields are a tier's fields as a client changes them, each present or
// absent: the body of PATCH /admin/v1/tiers/{slug}, the body of POST
// /admin/v1/tiers beside its slug, and the console's tier editor (read
// into it by the pages' form decoder). One decoder serves the three.
type TierFields struct {
	// Slug names a new tier (POST); a slug never changes, so PATCH refuses
	// it as an unknown field (RefuseSlug), and Apply and Fill ignore it.
	Slug                   quota.Optional[string]        `json:"slug"`
	Name                   quota.Optional[string]        `json:"name"`
	Rank                   quota.Optional[int]           `json:"rank"`
	PriceCents             quota.Optional[int64]         `json:"price_cents"`
	BurstRate              quota.Optional[float64]       `json:"burst_rate"`
	Burst                  quota.Optional[int64]         `json:"burst"`
	BucketCapacity         quota.Optional[int64]         `json:"bucket_capacity"`
	BucketRefillPerSec     quota.Optional[float64]       `json:"bucket_refill_per_sec"`
	DailyQuota             quota.Optional[int64]         `json:"daily_quota"`
	MonthlyQuota           quota.Optional[int64]         `json:"monthly_quota"`
	Overage                quota.Optional[quota.Overage] `json:"overage"`
	OveragePriceCentsPer1K quota.Optional[int64]         `json:"overage_price_cents_per_1k"`
	FailOpen               quota.Optional[bool]          `json:"fail_open"`
	UpgradeURL             quota.Optional[string]        `json:"upgrade_url"`
	MaxOverageCents        quota.Optional[int64]         `json:"max_overage_cents"`
	// MeterQuotas replaces the whole list; null or [] removes them all.
	MeterQuotas quota.Optional[[]quota.MeterQuota] `json:"meter_quotas"`
	Billing     quota.Optional[quota.Billing]      `json:"billing"`
	TopUpURL    quota.Optional[string]             `json:"top_up_url"`
}

// RefuseSlug refuses a slug in a change of a tier, as the JSON decoder
// refuses a field the body does not have.
func (p TierFields) RefuseSlug() error {
	if p.Slug.Set {
		return quota.FieldError("slug", "unknown field")
	}
	return nil
}

// Apply sets t's fields to those present: a limit set to null becomes
// unlimited, and null for a field that cannot be null is a CodeInvalid
// error naming it. It checks the URLs; the rest is quota.Tier.Validate's.
func (p TierFields) Apply(t *quota.Tier) error { return p.apply(t, false) }

// Fill is Apply for a new tier: null for a field that cannot be null
// leaves t's value (its default) as an absent field does.
func (p TierFields) Fill(t *quota.Tier) error { return p.apply(t, true) }

func (p TierFields) apply(t *quota.Tier, nullIsAbsent bool) error {
	for _, err := range []error{
		set("name", p.Name, &t.Name, nullIsAbsent), set("rank", p.Rank, &t.Rank, nullIsAbsent),
		set("price_cents", p.PriceCents, &t.PriceCents, nullIsAbsent), set("overage", p.Overage, &t.Overage, nullIsAbsent),
		set("overage_price_cents_per_1k", p.OveragePriceCentsPer1K, &t.OveragePriceCentsPer1K, nullIsAbsent),
		set("fail_open", p.FailOpen, &t.FailOpen, nullIsAbsent), set("upgrade_url", p.UpgradeURL, &t.UpgradeURL, nullIsAbsent),
		set("billing", p.Billing, &t.Billing, nullIsAbsent), set("top_up_url", p.TopUpURL, &t.TopUpURL, nullIsAbsent),
	} {
		if err != nil {
			return err
		}
	}
	AssignNullable(p.BurstRate, &t.BurstRate)
	AssignNullable(p.Burst, &t.Burst)
	AssignNullable(p.BucketCapacity, &t.BucketCapacity)
	AssignNullable(p.BucketRefillPerSec, &t.BucketRefillPerSec)
	AssignNullable(p.DailyQuota, &t.DailyQuota)
	AssignNullable(p.MonthlyQuota, &t.MonthlyQuota)
	AssignNullable(p.MaxOverageCents, &t.MaxOverageCents)
	if p.MeterQuotas.Set {
		t.MeterQuotas = []quota.MeterQuota{}
		if p.MeterQuotas.Value != nil {
			t.MeterQuotas = *p.MeterQuotas.Value
		}
	}
	if err := ValidURL("upgrade_url", t.UpgradeURL); err != nil {
		return err
	}
	return ValidURL("top_up_url", t.TopUpURL)
}

// Assign assigns a present, non-null value of a field that cannot be null
// to *dst; null is a CodeInvalid error naming the field.
func Assign[T any](field string, o quota.Optional[T], dst *T) error { return set(field, o, dst, false) }

// set is Assign where nullIsAbsent makes null leave *dst as absence does.
func set[T any](field string, o quota.Optional[T], dst *T, nullIsAbsent bool) error {
	switch {
	case !o.Set:
	case o.Value != nil:
		*dst = *o.Value
	case !nullIsAbsent:
		return quota.FieldError(field, "must not be null")
	}
	return nil
}

// AssignNullable assigns a present field whose null means unlimited.
func AssignNullable[T any](o quota.Optional[T], dst **T) {
	if o.Set {
		*dst = o.Value
	}
}
