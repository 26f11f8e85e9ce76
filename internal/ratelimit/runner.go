package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// Runner admits requests with one Redis round trip each. It is safe for
// concurrent use and holds no state of its own beyond the store: every
// decision is made by the script against Redis state and Redis time, so any
// number of API nodes share the limits exactly.
type Runner struct {
	*redisfn.Store          // the client, the key layout and the Function library
	batch          *batcher // admissions, coalesced into pipelines
	// releaseArg is the channel of the releases (releases.go), boxed once
	// for the script calls that release
	releaseArg any
}

var _ quota.Admitter = (*Runner)(nil)

// New returns a Runner on s.
func New(s *redisfn.Store) *Runner {
	r := &Runner{Store: s, batch: newBatcher(s)}
	r.releaseArg = r.releases()
	return r
}

// keys returns admit's KEYS in order; the idempotency key only when
// idem is set.
func (r *Runner) keys(tenantID, idem string) []string {
	if idem != "" {
		return r.StateKeys(tenantID, "pending", "idem2:"+idem)
	}
	return r.StateKeys(tenantID, "pending")
}

// Admit decides on req in one atomic script run. A refusal is a Decision
// with Allowed false; an error means the request was invalid (a
// quota.CodeInvalid *quota.Error: cost outside 1..quota.MaxQuantity, a meter
// that is empty, longer than 64 characters or holds '|', bad limits) or
// Redis failed. Redis failures are never turned into refusals: whether to
// fail open or closed is the caller's (the tier's) decision.
//
// With DryRun the decision is the one Admit would take, and nothing is
// written. With an IdempotencyKey, the first allowed decision is kept for 24
// hours (see lua/admit.lua): a repeat of the same request (fingerprint) is
// replayed once the answer is stored (StoreAnswer), counting no quota but
// passing the burst limits; while the first is in flight it is IdemInFlight,
// and another request under the key is IdemMismatch. Refusals are not kept,
// since they consumed nothing.
//
// An error after which Redis may have run the admission all the same (no
// answer came to a call it was sent) wraps quota.ErrOutcomeUnknown.
func (r *Runner) Admit(ctx context.Context, req quota.Request) (quota.Decision, error) {
	d, err := r.admit(ctx, req)
	if err != nil && redisfn.MayHaveRun(err) {
		err = fmt.Errorf("%w: %w", quota.ErrOutcomeUnknown, err)
	}
	return d, err
}

func (r *Runner) admit(ctx context.Context, req quota.Request) (quota.Decision, error) {
	if err := checkRequest(req); err != nil {
		return quota.Decision{}, err
	}
	p, err := requestParams(req)
	if err != nil {
		return quota.Decision{}, err
	}
	mode, idem := "admit", ""
	switch {
	case req.DryRun:
		mode = "dry"
	case req.IdempotencyKey != "":
		idem = redisfn.IdemHash(req.IdempotencyKey)
	}
	if len(req.Policies) > 0 {
		return r.admitWithPolicies(ctx, req, p, mode, idem)
	}
	res, b, err := r.run(ctx, req.TenantID, idem, redisfn.Micros(req.Now), mode, req.Cost, req.Meter, overageMode(req.Overage), p,
		req.IdempotencyFingerprint, req.IdempotencyLease.Microseconds(), nil, req.Calendar)
	if err == nil && mode != "dry" {
		r.MarkActive(req.TenantID) // admitted or refused, its pending usage changed
	}
	if err != nil {
		return quota.Decision{}, fmt.Errorf("ratelimit: admit: %w", err)
	}
	return decode(res, p, req.Calendar, b), nil
}

// Peek reports the tenant's limits as they stand, consuming and counting
// nothing (for usage pages and headers outside a metered call). Allowed,
// Violated and RetryAfter say whether one more unit would fit in every active
// limit, judging the monthly quota as a hard cap: Peek does not know the
// overage policy, and a bill tier would still admit past it. A zero now
// means Redis time. Its quotas are those of the default calendar (UTC days
// and months): PeekIn takes the tenant's.
func (r *Runner) Peek(ctx context.Context, tenantID string, limits quota.Limits, now time.Time) (quota.Decision, error) {
	return r.PeekIn(ctx, tenantID, quota.Calendar{}, limits, now)
}

// PeekIn is Peek with the days and months of the tenant's billing
// calendar cal.
func (r *Runner) PeekIn(ctx context.Context, tenantID string, cal quota.Calendar, limits quota.Limits, now time.Time) (quota.Decision, error) {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return quota.Decision{}, err
	}
	if err := redisfn.CheckNow(now); err != nil {
		return quota.Decision{}, err
	}
	p, err := paramsOf(limits)
	if err != nil {
		return quota.Decision{}, err
	}
	res, b, err := r.run(ctx, tenantID, "", redisfn.Micros(now), "peek", 1, "-", "block", p, "", 0, nil, cal)
	if err != nil {
		return quota.Decision{}, fmt.Errorf("ratelimit: peek: %w", err)
	}
	return decode(res, p, cal, b), nil
}

// run calls admit (lua/admit.lua); pol, when not nil, are the policies
// decided in the same call, with the request's id. cal is
// the tenant's calendar: unless it is the default, the script takes its
// Boundaries around now (Go's clock when now is 0), which run returns for
// decode. When Redis's clock is outside them (the script answers
// "CALENDAR <its now>", having written nothing), run calls once more with
// the boundaries of the script's now.
func (r *Runner) run(ctx context.Context, tenantID, idem string, now int64, mode string, cost int64, meter, overage string, p params, fp string, leaseUS int64, pol *inSlot, cal quota.Calendar) ([]int64, *calBounds, error) {
	// The batcher coalesces concurrent calls into pipelines (batch.go); a
	// Redis without the library (restarted, flushed, a new master) is
	// given it again (library.go).
	var b *calBounds
	if !cal.IsDefault() {
		t := time.Now()
		if now > 0 {
			t = time.UnixMicro(now)
		}
		b = boundsOf(cal, t)
	}
	keys, args, want := r.admitCall(tenantID, idem, now, mode, cost, meter, overage, p, fp, leaseUS, pol, b)
	// an admission that may take a lease is seen to its end, so that its
	// caller learns of the lease and releases it (batcher.do)
	finish := pol != nil && pol.leases && mode == "admit"
	res, err := r.batch.do(ctx, keys, args, finish)
	if err != nil && b != nil {
		if at := calendarNow(err); at > 0 {
			b = makeBounds(cal, time.UnixMicro(at))
			args[18] = b.arg
			res, err = r.batch.do(ctx, keys, args, finish)
		}
	}
	if err != nil {
		return nil, nil, prepaidStale(err)
	}
	if len(res) != want && (len(res) != resultLen || res[5] < int64(quota.IdemInFlight)) {
		return nil, nil, fmt.Errorf("script answered %d values, want %d", len(res), want)
	}
	return res, b, nil
}

// admitCall is the keys and arguments of a call of admit (lua/admit.lua),
// and how many integers its answer holds.
func (r *Runner) admitCall(tenantID, idem string, now int64, mode string, cost int64, meter, overage string, p params, fp string, leaseUS int64, pol *inSlot, b *calBounds) (keys []string, args []any, want int) {
	n := 14
	if pol != nil || p.mq != "" || b != nil {
		n += 5
	}
	if pol != nil {
		n += 7 * len(pol.specs)
	}
	args = make([]any, 14, n)
	args[0], args[1], args[2], args[3], args[4] = now, boxed(mode), cost, meter, boxed(overage)
	bp := boxedParams(p)
	copy(args[5:11], bp[:6])
	args[11], args[12], args[13] = fp, leaseUS, bp[6]
	keys = r.keys(tenantID, idem)
	want = itemsAt(p)
	if pol != nil {
		want += 7 * len(pol.specs)
		args = append(args, len(pol.specs), pol.id, pol.outside, p.mq, calArg(b))
		args = appendPolicyArgs(args, pol.specs)
		for _, sp := range pol.specs {
			keys = append(keys, sp.Key)
		}
	} else if p.mq != "" || b != nil {
		args = append(args, 0, "", "", p.mq, calArg(b))
	}
	if p.mq != "" {
		keys = append(keys, r.Key(tenantID, "mq"))
	}
	return keys, args, want
}

// calArg is admit's ARGV[19]: b's boundaries, or the empty string
// for the default calendar.
func calArg(b *calBounds) any {
	if b == nil {
		return ""
	}
	return b.arg
}

// boxedStrings are the script arguments that take a few fixed values,
// boxed once: an interface made of a string variable allocates.
var boxedStrings = map[string]any{"admit": "admit", "dry": "dry", "peek": "peek", "block": "block", "bill": "bill"}

func boxed(s string) any {
	if v, ok := boxedStrings[s]; ok {
		return v
	}
	return s
}

// paramsBoxes holds the seven limit arguments of each params seen (ARGV[6..11]
// and the spend cap, ARGV[14]), boxed once (tiers are few; the cache is
// dropped whole past maxParamsBoxes).
var (
	paramsBoxes    sync.Map // params -> []any
	paramsBoxesLen atomic.Int64
)

const maxParamsBoxes = 10_000

func boxedParams(p params) []any {
	p.mq, p.mqMeter = "", "" // (not among the seven)
	if v, ok := paramsBoxes.Load(p); ok {
		return v.([]any)
	}
	v := []any{p.gcraT, p.burst, p.bucketU, p.capacity, p.daily, p.monthly, p.ocap}
	if paramsBoxesLen.Add(1) > maxParamsBoxes {
		paramsBoxes.Clear()
		paramsBoxesLen.Store(1)
	}
	paramsBoxes.Store(p, v)
	return v
}

// Grant adds units to the tenant's quota for the current period ("day" or
// "month" of the default calendar, UTC): until the period ends its limit is
// quota + grants. The period is taken from Redis time, or from now when it
// is not zero. Every call adds: for a recorded grant, use ApplyGrant.
func (r *Runner) Grant(ctx context.Context, tenantID string, period string, units int64, now time.Time) error {
	_, err := r.grant(ctx, tenantID, quota.Calendar{}, "", period, time.Time{}, units, now)
	return err
}

// ApplyGrant adds a recorded grant, id, of units to the tenant's quota for
// the period ("day" or "month" of the tenant's billing calendar cal) that
// starts on the date of start, once: applying the same id again, from any
// node or the worker, adds nothing. start's date (its UTC fields, as a
// grant's period_start is recorded) is the period's first local date:
// for a month, the anchor day of the month it starts in. It reports
// whether the grant is in the counter, added now or before; false means its
// period is not the current one in Redis time, and nothing was written.
func (r *Runner) ApplyGrant(ctx context.Context, tenantID string, cal quota.Calendar, id, period string, start time.Time, units int64) (bool, error) {
	if id == "" {
		return false, quota.FieldError("id", "is required")
	}
	if start.IsZero() {
		return false, quota.FieldError("period_start", "is required")
	}
	return r.grant(ctx, tenantID, cal, id, period, start, units, time.Time{})
}

// grant runs grant (lua/grant.lua): id and start are empty for a grant
// without an id; now zero means Redis time.
func (r *Runner) grant(ctx context.Context, tenantID string, cal quota.Calendar, id, period string, start time.Time, units int64, now time.Time) (bool, error) {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return false, err
	}
	if period != "day" && period != "month" {
		return false, quota.FieldError("period", `must be "day" or "month"`)
	}
	if units < 1 || units > quota.MaxQuantity {
		return false, quota.FieldError("units", "must be an integer between 1 and %d", quota.MaxQuantity)
	}
	if err := redisfn.CheckNow(now); err != nil {
		return false, err
	}
	// The script's period ids: days since the epoch (of the local date, in
	// a calendar), or year*100+month (of the anchor day starting the
	// period): the ids of the period's first date in any calendar.
	var periodID int64
	if !start.IsZero() {
		start = start.UTC()
		periodID = redisfn.FloorDiv(start.Unix(), 86400)
		if period == "month" {
			periodID = int64(start.Year())*100 + int64(start.Month())
		}
	}
	var b *calBounds
	if !cal.IsDefault() {
		t := time.Now()
		if !now.IsZero() {
			t = now
		}
		b = boundsOf(cal, t)
	}
	keys := r.StateKeys(tenantID)
	res, err := r.Call(ctx, redisfn.FnGrant, keys, redisfn.Micros(now), period, units, id, periodID, calArg(b)).Int64Slice()
	if err != nil && b != nil {
		if at := calendarNow(err); at > 0 {
			b = makeBounds(cal, time.UnixMicro(at))
			res, err = r.Call(ctx, redisfn.FnGrant, keys, redisfn.Micros(now), period, units, id, periodID, b.arg).Int64Slice()
		}
	}
	if err != nil {
		return false, fmt.Errorf("ratelimit: grant: %w", err)
	}
	if len(res) != 7 {
		return false, fmt.Errorf("ratelimit: grant: script answered %d values, want 7", len(res))
	}
	return res[6] >= 0, nil
}
