package quota

import (
	"fmt"
	"strings"
	"testing"
)

// checkFields runs validate on each case and wants the field it names
// ("" for valid).
func checkFields[T any](t *testing.T, base func() T, validate func(T) error, cases []fieldCase[T]) {
	t.Helper()
	for _, tc := range cases {
		v := base()
		tc.mut(&v)
		err := validate(v)
		got := errorField(err)
		if err != nil && got == "" {
			got = "?" + err.Error() // not a *Error naming a field
		}
		if got != tc.field {
			t.Errorf("%s: got field %q (%v), want %q", tc.name, got, err, tc.field)
		}
	}
}

type fieldCase[T any] struct {
	name  string
	mut   func(*T)
	field string // "" for valid
}

// TestTierBounds: each bound of a tier's values takes its edge and
// refuses one past it, naming the field.
func TestTierBounds(t *testing.T) {
	t.Parallel()
	// 1e-6 per second is an interval of 10^12 µs: 1125 of them fit the
	// 2^50 µs window (1.1259e15), 1126 do not.
	checkFields(t, validTier, Tier.Validate, []fieldCase[Tier]{
		{"the valid tier", func(*Tier) {}, ""},
		{"burst at the window's bound", func(t *Tier) { t.BurstRate, t.Burst = Ptr(MinRate), Ptr(int64(1125)) }, ""},
		{"burst past the window's bound", func(t *Tier) { t.BurstRate, t.Burst = Ptr(MinRate), Ptr(int64(1126)) }, "burst"},
		{"bucket at the window's bound", func(t *Tier) { t.BucketRefillPerSec, t.BucketCapacity = Ptr(MinRate), Ptr(int64(1125)) }, ""},
		{"bucket past the window's bound", func(t *Tier) { t.BucketRefillPerSec, t.BucketCapacity = Ptr(MinRate), Ptr(int64(1126)) }, "bucket_capacity"},
		{"the fastest rate", func(t *Tier) { t.BurstRate = Ptr(MaxRate) }, ""},
		{"faster", func(t *Tier) { t.BurstRate = Ptr(MaxRate * 1.000001) }, "burst_rate"},
		{"slower than the slowest", func(t *Tier) { t.BucketRefillPerSec = Ptr(MinRate * 0.999999) }, "bucket_refill_per_sec"},
		{"a burst of 1", func(t *Tier) { t.Burst = Ptr(int64(1)) }, ""},
		{"a bucket of 1", func(t *Tier) { t.BucketCapacity = Ptr(int64(1)) }, ""},
		{"a bucket of 0", func(t *Tier) { t.BucketCapacity = Ptr(int64(0)) }, "bucket_capacity"},
		{"quotas of 0", func(t *Tier) { t.DailyQuota, t.MonthlyQuota = Ptr(int64(0)), Ptr(int64(0)) }, ""},
		{"the largest quota", func(t *Tier) { t.DailyQuota = Ptr(MaxQuantity) }, ""},
		{"a daily quota past it", func(t *Tier) { t.DailyQuota = Ptr(MaxQuantity + 1) }, "daily_quota"},
		{"the dearest overage", func(t *Tier) { t.OveragePriceCentsPer1K = MaxPrice }, ""},
		{"dearer", func(t *Tier) { t.OveragePriceCentsPer1K = MaxPrice + 1 }, "overage_price_cents_per_1k"},
		{"the longest upgrade URL", func(t *Tier) { t.UpgradeURL = strings.Repeat("u", MaxURLLength) }, ""},
		{"longer", func(t *Tier) { t.UpgradeURL = strings.Repeat("u", MaxURLLength+1) }, "upgrade_url"},
		{"the longest name", func(t *Tier) { t.Name = strings.Repeat("n", MaxNameLen) }, ""},
		{"longer", func(t *Tier) { t.Name = strings.Repeat("n", MaxNameLen+1) }, "name"},
		{"the highest rank", func(t *Tier) { t.Rank = 1_000_000 }, ""},
		{"higher", func(t *Tier) { t.Rank = 1_000_001 }, "rank"},
		{"the dearest price", func(t *Tier) { t.PriceCents = MaxPrice }, ""},
		{"dearer", func(t *Tier) { t.PriceCents = MaxPrice + 1 }, "price_cents"},
		{"a bad meter quota", func(t *Tier) { t.MeterQuotas = []MeterQuota{{Meter: "search"}} }, "meter_quotas[0].daily_quota"},
	})
}

func validPrepaid() Tier {
	return Tier{Slug: "credits", Name: "Credits", Rank: 2, Overage: OverageBill, OveragePriceCentsPer1K: 30,
		Limits: Limits{MonthlyQuota: Ptr(int64(1000))}, Billing: BillingPrepaid, TopUpURL: "https://example.com/top-up"}
}

// TestPrepaidTierRules: a prepaid tier bills its overage past a monthly
// quota, costs nothing by the month and says where to top up; postpaid
// is the default billing.
func TestPrepaidTierRules(t *testing.T) {
	t.Parallel()
	checkFields(t, validPrepaid, Tier.Validate, []fieldCase[Tier]{
		{"the valid prepaid tier", func(*Tier) {}, ""},
		{"no monthly quota included", func(t *Tier) { t.MonthlyQuota = Ptr(int64(0)) }, ""},
		{"blocked overage", func(t *Tier) { t.Overage, t.OveragePriceCentsPer1K = OverageBlock, 0 }, "billing"},
		{"no monthly quota", func(t *Tier) { t.MonthlyQuota = nil }, "billing"},
		{"a price", func(t *Tier) { t.PriceCents = 900 }, "price_cents"},
		{"no top-up URL", func(t *Tier) { t.TopUpURL = "" }, "top_up_url"},
		{"the longest top-up URL", func(t *Tier) { t.TopUpURL = strings.Repeat("u", MaxURLLength) }, ""},
		{"longer", func(t *Tier) { t.TopUpURL = strings.Repeat("u", MaxURLLength+1) }, "top_up_url"},
		{"another billing", func(t *Tier) { t.Billing = "invoice" }, "billing"},
		{"postpaid, said", func(t *Tier) { t.Billing, t.TopUpURL = BillingPostpaid, "" }, ""},
		{"postpaid by default", func(t *Tier) { t.Billing, t.PriceCents = "", 900 }, ""},
		{"postpaid with a top-up URL too long", func(t *Tier) { t.Billing, t.TopUpURL = "", strings.Repeat("u", MaxURLLength+1) }, "top_up_url"},
	})
	for _, tc := range []struct {
		billing Billing
		want    bool
	}{{BillingPrepaid, true}, {BillingPostpaid, false}, {"", false}} {
		if got := (Tier{Billing: tc.billing}).IsPrepaid(); got != tc.want {
			t.Errorf("IsPrepaid of billing %q: got %t, want %t", tc.billing, got, tc.want)
		}
	}
}

// TestCheckOverridesOnPrepaid: a prepaid tenant's overrides may change
// its monthly quota but not make it unlimited (every unit would be free);
// a postpaid tenant's may. Overrides that make limits invalid are refused
// on either.
func TestCheckOverridesOnPrepaid(t *testing.T) {
	t.Parallel()
	postpaid := validTier()
	postpaid.MonthlyQuota = Ptr(int64(5000))
	for _, tc := range []struct {
		name  string
		tier  Tier
		o     Overrides
		field string
	}{
		{"prepaid, none", validPrepaid(), Overrides{}, ""},
		{"prepaid, another monthly quota", validPrepaid(), Overrides{MonthlyQuota: Set(Ptr(int64(50)))}, ""},
		{"prepaid, daily unlimited", validPrepaid(), Overrides{DailyQuota: Set[int64](nil)}, ""},
		{"prepaid, monthly unlimited", validPrepaid(), Overrides{MonthlyQuota: Set[int64](nil)}, "monthly_quota"},
		{"postpaid, monthly unlimited", postpaid, Overrides{MonthlyQuota: Set[int64](nil)}, ""},
		{"postpaid, half a pair", postpaid, Overrides{Burst: Set[int64](nil)}, "burst"},
	} {
		if got := errorField(tc.tier.CheckOverrides(tc.o)); got != tc.field {
			t.Errorf("%s: got field %q, want %q", tc.name, got, tc.field)
		}
	}
}

func validMeterQuota() MeterQuota {
	return MeterQuota{Meter: "export", DailyQuota: Ptr(int64(10)), MonthlyQuota: Ptr(int64(100)),
		Overage: OverageBill, OveragePriceCentsPer1K: 25}
}

// TestMeterQuotaRules: a meter quota names a route meter, has a daily or
// a monthly quota or both, and bills past its monthly quota only at a
// price; errors name the quota's place in the tier.
func TestMeterQuotaRules(t *testing.T) {
	t.Parallel()
	validate := func(q MeterQuota) error { return q.Validate(3) }
	checkFields(t, validMeterQuota, validate, []fieldCase[MeterQuota]{
		{"the valid quota", func(*MeterQuota) {}, ""},
		{"a daily quota only, blocked", func(q *MeterQuota) {
			q.MonthlyQuota, q.Overage, q.OveragePriceCentsPer1K = nil, OverageBlock, 0
		}, ""},
		{"a monthly quota only", func(q *MeterQuota) { q.DailyQuota = nil }, ""},
		{"quotas of 0", func(q *MeterQuota) { q.DailyQuota, q.MonthlyQuota = Ptr(int64(0)), Ptr(int64(0)) }, ""},
		{"the longest meter", func(q *MeterQuota) { q.Meter = strings.Repeat("m", 64) }, ""},
		{"longer", func(q *MeterQuota) { q.Meter = strings.Repeat("m", 65) }, "meter_quotas[3].meter"},
		{"no meter", func(q *MeterQuota) { q.Meter = "" }, "meter_quotas[3].meter"},
		{"an upper-case meter", func(q *MeterQuota) { q.Meter = "Export" }, "meter_quotas[3].meter"},
		{"no quota", func(q *MeterQuota) { q.DailyQuota, q.MonthlyQuota = nil, nil }, "meter_quotas[3].daily_quota"},
		{"a daily quota below 0", func(q *MeterQuota) { q.DailyQuota = Ptr(int64(-1)) }, "meter_quotas[3].daily_quota"},
		{"a monthly quota too large", func(q *MeterQuota) { q.MonthlyQuota = Ptr(MaxQuantity + 1) }, "meter_quotas[3].monthly_quota"},
		{"the largest quotas", func(q *MeterQuota) { q.DailyQuota, q.MonthlyQuota = Ptr(MaxQuantity), Ptr(MaxQuantity) }, ""},
		{"blocked, with a price", func(q *MeterQuota) { q.Overage = OverageBlock }, "meter_quotas[3].overage_price_cents_per_1k"},
		{"billed, free", func(q *MeterQuota) { q.OveragePriceCentsPer1K = 0 }, "meter_quotas[3].overage_price_cents_per_1k"},
		{"billed, the dearest", func(q *MeterQuota) { q.OveragePriceCentsPer1K = MaxPrice }, ""},
		{"billed, dearer", func(q *MeterQuota) { q.OveragePriceCentsPer1K = MaxPrice + 1 }, "meter_quotas[3].overage_price_cents_per_1k"},
		{"billed past no monthly quota", func(q *MeterQuota) { q.MonthlyQuota = nil }, "meter_quotas[3].overage"},
		{"no overage", func(q *MeterQuota) { q.Overage = "" }, "meter_quotas[3].overage"},
	})
	// A tier has at most MaxMeterQuotas of them, one a meter.
	quotas := func(n int) []MeterQuota {
		qs := make([]MeterQuota, n)
		for i := range qs {
			qs[i] = validMeterQuota()
			qs[i].Meter = fmt.Sprintf("m%d", i)
		}
		return qs
	}
	twice := quotas(3)
	twice[2].Meter = twice[0].Meter
	for _, tc := range []struct {
		name  string
		qs    []MeterQuota
		field string
	}{
		{"none", nil, ""},
		{"the most", quotas(MaxMeterQuotas), ""},
		{"one more", quotas(MaxMeterQuotas + 1), "meter_quotas"},
		{"a meter twice", twice, "meter_quotas[2].meter"},
	} {
		if got := errorField(ValidateMeterQuotas(tc.qs)); got != tc.field {
			t.Errorf("%s: got field %q, want %q", tc.name, got, tc.field)
		}
	}
	// Only a billed quota with a monthly quota bills.
	for _, tc := range []struct {
		q    MeterQuota
		want bool
	}{
		{MeterQuota{Overage: OverageBill, MonthlyQuota: Ptr(int64(0))}, true},
		{MeterQuota{Overage: OverageBill, DailyQuota: Ptr(int64(5))}, false},
		{MeterQuota{Overage: OverageBlock, MonthlyQuota: Ptr(int64(5))}, false},
	} {
		if got := tc.q.Bills(); got != tc.want {
			t.Errorf("Bills of overage %q, a monthly quota %t: got %t, want %t", tc.q.Overage, tc.q.MonthlyQuota != nil, got, tc.want)
		}
	}
}

// TestErrorText: an error's text names its code, and its field when it
// has one: what the logs show of an error the API answers.
func TestErrorText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{FieldError("time_zone", "unknown time zone %q", "Mars/Olympus"), `tollgate invalid: time_zone: unknown time zone "Mars/Olympus"`},
		{Errorf(CodeConflict, "tier %s is in use", "pro"), "tollgate conflict: tier pro is in use"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}
