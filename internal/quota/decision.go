package quota

import (
	"context"
	"errors"
	"math"
	"time"
)

// LimitName names one of the four limits of a tier. The names are part of the
// HTTP contract (RateLimit headers, violated-policies, /v1/usage).
type LimitName string

// The four limits of a tier, in AllLimits' order.
const (
	LimitBurst   LimitName = "burst"   // GCRA on requests
	LimitBucket  LimitName = "bucket"  // token bucket on cost units
	LimitDaily   LimitName = "daily"   // units per UTC day
	LimitMonthly LimitName = "monthly" // units per UTC month
)

// LimitSpendCap names the refusal of a request whose overage would make the
// month's overage cost more than the tenant's max_overage_cents. It is no
// limit of AllLimits: it has no RateLimit header item, only a name in
// Violated.
const LimitSpendCap LimitName = "spend_cap"

// AllLimits lists the limits in their fixed order: the order of the headers
// and of Decision.Limits.
var AllLimits = []LimitName{LimitBurst, LimitBucket, LimitDaily, LimitMonthly}

// Request asks to admit one call of a tenant.
type Request struct {
	TenantID string
	Meter    string // the route's meter, for the usage ledger
	Cost     int64  // cost units, at least 1
	Limits   Limits // the tenant's effective limits
	Overage  Overage
	// OveragePriceCentsPer1K is the tier's overage price: with
	// Limits.MaxOverageCents it makes the spend cap (quota.SpendCapUnits).
	OveragePriceCentsPer1K int64
	// FailOpen is the tier's policy when Redis is unreachable: admit through
	// an in-process limiter at the same limits (true) or refuse (false).
	FailOpen bool
	DryRun   bool // decide without consuming or counting anything
	// IdempotencyKey, when set, makes a repeat within 24 hours return the first
	// decision without being counted again (see Idem).
	IdempotencyKey string
	// IdempotencyFingerprint identifies the request the key was first used
	// for (method, path, body digest): the same key with another fingerprint
	// is IdemMismatch.
	IdempotencyFingerprint string
	// IdempotencyLease is how long the first request with the key may stay
	// in flight (IdemInFlight for repeats meanwhile) before its answer is
	// stored with StoreAnswer; zero stores the decision as the answer at once
	// (POST /v1/check has no other answer).
	IdempotencyLease time.Duration
	// IdempotencyClaim names this request's claim on the tenant's room for
	// stored answers (AnswerLimits): random, made by the caller that stores
	// or releases the answer later, so that it finds its claim again; the
	// Gate makes one when it is empty.
	IdempotencyClaim string
	// Now, when non-zero, replaces Redis server time. Tests only.
	Now time.Time
	// MeterQuotas are the tier's quotas per meter: the one of Meter, if
	// any, is decided with the limits; with a spend cap, the others' overage
	// counts toward it (see MeterQuota).
	MeterQuotas []MeterQuota
	// Prepaid, for a tenant of a prepaid tier, is the credit its admission
	// draws on (see Prepaid); nil for postpaid.
	Prepaid *Prepaid
	// Policies are the policies that match the request, decided with its
	// limits, all or nothing (API.md "Policies").
	Policies []PolicyCall
	// RequestID identifies the request among all of a node's and all
	// nodes' requests: a concurrency policy's lease, a sliding log's entry.
	RequestID string
	// Calendar is the tenant's billing calendar: its days and months are
	// those of the daily and monthly quotas (and of its meter quotas),
	// their resets and windows. The zero Calendar is the default, UTC days
	// and calendar months.
	Calendar Calendar
}

// LimitState is one active limit as seen by a decision.
type LimitState struct {
	Name      LimitName
	Limit     int64         // burst, capacity or quota (including grants)
	Remaining int64         // what is left after this decision
	Reset     time.Time     // when the limit is back to full (burst, bucket) or the period ends (quotas)
	Window    time.Duration // the policy window of the RateLimit-Policy header
}

// Decision is the answer to a Request. Going over a limit is a Decision with
// Allowed false, not an error.
type Decision struct {
	Allowed bool
	// Limits holds one entry per active (non-unlimited) limit, in AllLimits
	// order, then the meter quota's daily and monthly limits
	// ("<meter>.daily", "<meter>.monthly"), when the meter has them.
	Limits []LimitState
	// Violated names the limits that refused, when !Allowed.
	Violated []LimitName
	// RetryAfter is, when !Allowed, the earliest wait after which the same
	// request would pass if nothing else consumed the room meanwhile; negative
	// when it never can (the cost exceeds a limit's whole size).
	RetryAfter time.Duration
	// OverageUnits are the admitted units past the monthly quota (bill tiers).
	OverageUnits int64
	// MeterOverageUnits are the admitted units past the request's meter
	// quota (a billed one): billed at the meter's price, not among
	// OverageUnits. A refund or a settlement gives back these, no more.
	MeterOverageUnits int64
	// Idem is what the idempotency key made of the request (Replayed).
	Idem IdemOutcome
	// Degraded is true when Redis was unreachable and an in-process limiter
	// of this API node decided (fail-open tiers).
	Degraded bool
	// Now is the time the decision was taken at (Redis server time).
	Now time.Time
	// Policies holds one state per policy of the request, in its order;
	// a refusing one also appears, by name, in Violated.
	Policies []PolicyState
	// Fallback is set when a degrade policy refused and nothing else did:
	// the request is answered with it, consuming nothing (Allowed false).
	Fallback *PolicyState
	// Delay is how long the request waits before it proceeds (the longest
	// leaky_bucket queue delay); zero for most.
	Delay time.Duration
}

// IdemOutcome is what an Idempotency-Key made of a request. IdemInFlight and
// IdemMismatch decide nothing: the request was neither admitted nor refused
// by a limit, and the Decision carries no limits.
type IdemOutcome int8

// The outcomes of an Idempotency-Key.
const (
	IdemNone     IdemOutcome = iota // no key, or the first request with it
	IdemReplayed                    // answered from the first request's stored answer
	IdemInFlight                    // the first request with the key is still running
	IdemMismatch                    // the key was first used for another request
	// IdemLimit means a new key found the tenant's room for stored answers full
	// (AnswerLimits); the request was refused before it ran, consuming
	// nothing, and RetryAfter says when room frees.
	IdemLimit
)

// IdemOutcomeOf is the outcome numbered v in a script's answer; a number
// beyond IdemOutcome's range is no outcome (-1).
func IdemOutcomeOf(v int64) IdemOutcome {
	if v < math.MinInt8 || v > math.MaxInt8 {
		return -1
	}
	return IdemOutcome(v)
}

// Replayed reports whether the decision is the stored answer to an earlier
// request with the same idempotency key.
func (d Decision) Replayed() bool { return d.Idem == IdemReplayed }

// Limit returns the state of the named limit and whether it is active.
func (d Decision) Limit(name LimitName) (LimitState, bool) {
	for _, l := range d.Limits {
		if l.Name == name {
			return l, true
		}
	}
	return LimitState{}, false
}

// Admitter decides on requests. Implementations must be safe for concurrent
// use; an error means the backing store failed, never that a limit was hit.
type Admitter interface {
	Admit(ctx context.Context, req Request) (Decision, error)
}

// Upgrade is the hint offered with a refusal when a tier ranked higher
// gives more room (see Upgrades).
type Upgrade struct {
	Tier         string `json:"tier"`
	Name         string `json:"name"`
	PriceCents   int64  `json:"price_cents"`
	DailyQuota   *int64 `json:"daily_quota"`
	MonthlyQuota *int64 `json:"monthly_quota"`
	URL          string `json:"url"`
}

// StoredAnswer is the answer kept for an idempotency key, replayed to
// repeats of the request: its status, the headers worth repeating as
// "Name: value" lines, and its body.
type StoredAnswer struct {
	Status int
	Header string
	Body   []byte
}

// RefusalCount is a number of refused requests of a tenant's meter in one
// hour, counted outside the admission script (the deny cache).
type RefusalCount struct {
	TenantID string
	Meter    string
	Hour     time.Time
	Requests int64
}

// CeilSeconds rounds d up to whole seconds, never below zero: the one
// rounding of every wait an answer shows (Retry-After, retry_after).
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// WindowSeconds is a limit's window in whole seconds, at least 1 (the
// RateLimit-Policy header's w parameter is an integer).
func WindowSeconds(d time.Duration) int64 {
	return max(1, CeilSeconds(d))
}

// ResetTime is a limit's reset as every answer shows it (X-RateLimit-Reset,
// the problem's and /v1/usage's reset): rounded up to the whole second, so
// that no client that waits for it is early, and all of them agree.
func ResetTime(t time.Time) time.Time {
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second).UTC()
	}
	return t.UTC()
}

// ErrNoAnswer means an idempotency record holds a decision but no answer
// (it expired between the decision and the read, or was stored by a caller
// with nothing to answer but the decision).
var ErrNoAnswer = errors.New("quota: no stored answer")

// ErrOutcomeUnknown marks a store's error after which the decision may
// have been made and counted all the same: the call reached the store and
// no answer came back (a timeout, a connection lost after the call was
// written). A fail-open tier must not admit such a request locally: its
// usage would be counted twice.
var ErrOutcomeUnknown = errors.New("quota: the store may have decided and counted the request")
