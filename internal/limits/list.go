package limits

import "github.com/tollgate/tollgate/internal/quota"

// Kind is what an entry limits. Its value is the entry's tag in the wire
// form.
type Kind byte

const (
	// Rate is GCRA: one request per Interval µs, Size requests of burst;
	// every request weighs 1.
	Rate Kind = 'r'
	// Bucket is a token bucket: one unit back per Interval µs, Size units
	// of capacity; a request weighs its cost.
	Bucket Kind = 'b'
	// Quota is a window quota: Limit units a day or a billing month
	// (Monthly) of the tenant's calendar, of one meter (Meter) or of every
	// meter (Meter ""; its limit is raised by the period's grants). Past
	// its limit it refuses (Price < 0) or admits and claims the units past
	// it as overage, billed at Price millicents a unit (the price per
	// 1,000 units in cents). A billed claim is the units of the request
	// past the limit, less what entries before it claimed: a unit past two
	// quotas is billed once, by the first.
	Quota Kind = 'q'
	// Cap is the spend cap: the overage a billing month may bill, Limit
	// millicents: the tier's overage units at Price (the tier's price)
	// plus the meters' overage millicents.
	Cap Kind = 'c'
	// Credit is a prepaid tenant's credit: the overage of its admissions
	// is drawn on a balance (Request.Prepaid), the tier's units at Price.
	Credit Kind = 'p'
	// Policy is one of the Redis-side policy algorithms (lua/policy*.lua,
	// internal/policyalg): opaque here, Spec carries what Redis needs.
	Policy Kind = 'x'
)

// Entry is one limit of a list; which fields mean what depends on Kind.
type Entry struct {
	Kind           Kind
	Interval, Size int64 // Rate and Bucket: µs per request or unit; burst or capacity
	Monthly        bool  // Quota: the billing month (else the day)
	Meter          string
	Limit          int64 // Quota: units; Cap: millicents
	Price          int64 // Quota: millicents a unit past Limit, -1 block; Cap, Credit: the tier's
	Spec           string
}

// List is a tenant's compiled limits for requests of one meter, in the
// order they are decided: the burst limits, the quotas (a meter's before
// the tier-wide month, which claims a unit past both only when the meter's
// does not), the money, the policies.
type List struct {
	Entries  []Entry
	Calendar quota.Calendar
	wire     string
}

// Plan is what Compile makes a list of: a tier's limits with a tenant's
// overrides applied, its overage mode and price, its meter quotas, whether
// it is prepaid, and the tenant's billing calendar.
type Plan struct {
	Limits                 quota.Limits
	Overage                quota.Overage
	OveragePriceCentsPer1K int64
	MeterQuotas            []quota.MeterQuota
	Prepaid                bool
	Calendar               quota.Calendar
	Policies               []string // opaque specs (Entry.Spec)
}

// PlanOf is the plan of req's limits; its balance (req.Prepaid) and
// policies are inputs of a decision, not of the list.
func PlanOf(req quota.Request) Plan {
	return Plan{Limits: req.Limits, Overage: req.Overage, OveragePriceCentsPer1K: req.OveragePriceCentsPer1K,
		MeterQuotas: req.MeterQuotas, Prepaid: req.Prepaid != nil, Calendar: req.Calendar}
}

// Compile makes the list of p for requests of meter; a cache keyed by the
// tier, the meter, the overrides and the calendar keeps it. It returns a
// quota.CodeInvalid *quota.Error for limits Redis would not take.
func Compile(p Plan, meter string) (*List, error) {
	l := p.Limits
	if err := l.Validate(); err != nil {
		return nil, err
	}
	var es []Entry
	if l.BurstRate != nil {
		T, B := quota.IntervalMicros(*l.BurstRate), *l.Burst
		if B > quota.MaxWindowMicros/T {
			return nil, quota.FieldError("burst", "burst / burst_rate must be at most %d seconds", quota.MaxWindowMicros/1e6)
		}
		es = append(es, Entry{Kind: Rate, Interval: T, Size: B})
	}
	if l.BucketCapacity != nil {
		U, C := quota.IntervalMicros(*l.BucketRefillPerSec), *l.BucketCapacity
		if C > quota.MaxWindowMicros/U {
			return nil, quota.FieldError("bucket_capacity", "bucket_capacity / bucket_refill_per_sec must be at most %d seconds", quota.MaxWindowMicros/1e6)
		}
		es = append(es, Entry{Kind: Bucket, Interval: U, Size: C})
	}
	if l.DailyQuota != nil {
		es = append(es, Entry{Kind: Quota, Limit: *l.DailyQuota, Price: -1})
	}
	mq := quota.MeterQuotaFor(p.MeterQuotas, meter)
	if mq != nil {
		if mq.DailyQuota != nil {
			es = append(es, Entry{Kind: Quota, Meter: meter, Limit: *mq.DailyQuota, Price: -1})
		}
		if mq.MonthlyQuota != nil {
			price := int64(-1)
			if mq.Bills() {
				price = mq.OveragePriceCentsPer1K
			}
			es = append(es, Entry{Kind: Quota, Monthly: true, Meter: meter, Limit: *mq.MonthlyQuota, Price: price})
		}
	}
	tprice, bill := int64(0), p.Overage == quota.OverageBill
	if bill {
		tprice = p.OveragePriceCentsPer1K
	}
	if l.MonthlyQuota != nil {
		price := int64(-1)
		if bill {
			price = tprice
		}
		es = append(es, Entry{Kind: Quota, Monthly: true, Limit: *l.MonthlyQuota, Price: price})
	}
	if c := l.MaxOverageCents; c != nil {
		es = append(es, Entry{Kind: Cap, Limit: *c * 1000, Price: tprice})
	}
	if p.Prepaid {
		es = append(es, Entry{Kind: Credit, Price: tprice})
	}
	for _, s := range p.Policies {
		es = append(es, Entry{Kind: Policy, Spec: s})
	}
	list := &List{Entries: es, Calendar: p.Calendar}
	list.wire = encode(es)
	return list, nil
}

// find returns the list's entry of kind k (for Quota: of the period and
// scope), or nil.
func (l *List) find(k Kind, monthly, meter bool) *Entry {
	for i := range l.Entries {
		e := &l.Entries[i]
		if e.Kind == k && (k != Quota || e.Monthly == monthly && (e.Meter != "") == meter) {
			return e
		}
	}
	return nil
}

// meterName is the meter of the list's meter quotas, "" for none.
func (l *List) meterName() string {
	for _, e := range l.Entries {
		if e.Kind == Quota && e.Meter != "" {
			return e.Meter
		}
	}
	return ""
}
