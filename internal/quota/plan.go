package quota

import (
	"time"
)

// DefaultTimeZone and DefaultAnchorDay are a tenant's billing calendar
// unless it says otherwise.
const (
	DefaultTimeZone  = "UTC"
	DefaultAnchorDay = 1
)

// CheckCalendar validates a tenant's billing anchor day (1..28, so that
// every month has it) and time zone (an IANA name, as LoadZone takes it;
// never "", which is no name once the default is applied, nor "Local",
// the server's setting). It returns a CodeInvalid *Error naming
// billing_anchor_day or time_zone.
func CheckCalendar(anchorDay int, zone string) error {
	if !ValidAnchorDay(anchorDay) {
		return FieldError("billing_anchor_day", "must be an integer between 1 and %d", MaxAnchorDay)
	}
	if zone == "" {
		return FieldError("time_zone", `must be an IANA time zone name such as "UTC" or "Europe/Paris"`)
	}
	_, err := LoadZone(zone)
	return err
}

// Calendar returns the tenant's billing calendar. A zone that no longer
// loads (the stored name was checked when it was set) counts as UTC.
func (t Tenant) Calendar() Calendar {
	zone, err := LoadZone(t.TimeZone)
	if err != nil {
		zone = time.UTC
	}
	return Calendar{AnchorDay: t.BillingAnchorDay, Zone: zone}
}

// Effective says when a tier change applies.
type Effective string

const (
	// EffectiveNow changes the tier at once.
	EffectiveNow Effective = "now"
	// EffectiveNextPeriod records the change as pending; the worker applies
	// it at the start of the tenant's next billing period.
	EffectiveNextPeriod Effective = "next_period"
)

// QuotaMode says what a tier change does with the usage already counted in
// the current day and month.
type QuotaMode string

const (
	// QuotaCarry keeps it: the new tier's quotas count it.
	QuotaCarry QuotaMode = "carry"
	// QuotaReset empties the day's and the month's used units when the tier
	// changes; grants stay, and so does the month's overage, billed and
	// still counted against the spend cap.
	QuotaReset QuotaMode = "reset"
)

// PlanRequest is a tier change as asked (PATCH /admin/v1/tenants/{id} with
// tier): Effective "" means by rank (see EffectiveFor), Quota "" carry.
type PlanRequest struct {
	Tier      string
	Effective Effective
	Quota     QuotaMode
}

// Validate checks the request's effective and quota values, returning a
// CodeInvalid *Error naming the field.
func (r PlanRequest) Validate() error {
	switch r.Effective {
	case "", EffectiveNow, EffectiveNextPeriod:
	default:
		return FieldError("effective", `must be "now" or "next_period"`)
	}
	switch r.Quota {
	case "", QuotaCarry, QuotaReset:
	default:
		return FieldError("quota", `must be "carry" or "reset"`)
	}
	return nil
}

// EffectiveFor returns when the change from a tier of rank from to one of
// rank to applies: as asked, else now for an upgrade or an equal rank and
// at the next period for a downgrade (the tenant keeps what it paid for
// until then).
func (r PlanRequest) EffectiveFor(from, to int) Effective {
	if r.Effective != "" {
		return r.Effective
	}
	if to < from {
		return EffectiveNextPeriod
	}
	return EffectiveNow
}

// QuotaMode returns the request's quota mode, carry unless it says reset.
func (r PlanRequest) QuotaMode() QuotaMode {
	if r.Quota == "" {
		return QuotaCarry
	}
	return r.Quota
}

// PendingChange is a tier change waiting for the tenant's next billing
// period: the worker applies it at EffectiveAt exactly (the tier history
// changes at that instant, however late the worker runs).
type PendingChange struct {
	Tier        string    `json:"tier"`
	EffectiveAt time.Time `json:"effective_at"`
	Quota       QuotaMode `json:"quota"`
	RequestedAt time.Time `json:"requested_at"`
}

// NextPeriodStart returns the start of the tenant's billing period after
// the one containing now, in its calendar: when a pending change takes
// effect.
func (t Tenant) NextPeriodStart(now time.Time) time.Time {
	_, end := t.Calendar().Period(now)
	return end.UTC()
}

// CounterReset is a recorded reset of a tenant's day and month counters, made
// by a tier change with quota reset at At (the change's time: the day and
// month it empties, and its id in the live counters, where it applies once).
// Calendar is the tenant's, whose day and month those are.
type CounterReset struct {
	ID       string
	TenantID string
	At       time.Time
	Calendar Calendar
}
