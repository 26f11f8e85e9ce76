package ratelimit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/limits"
	"github.com/tollgate/tollgate/internal/quota"
)

// Runner admits requests with one Redis round trip each. It is safe for
// concurrent use and holds no state of its own beyond the client: every
// decision is made by the script against Redis state and Redis time, so any
// number of API nodes share the limits exactly.
type Runner struct {
	c      redis.UniversalClient
	prefix string
	lib    *library  // the Function library it calls (library.go)
	batch  *batcher  // admissions, coalesced into pipelines
	active activeSet // tenants with usage counted since the last ReportActive
	// answers bound each tenant's idempotency records (idem.go)
	answers quota.AnswerLimits
	// releaseArg is the channel of the releases (releases.go), boxed once
	// for the script calls that release
	releaseArg any
}

var _ quota.Admitter = (*Runner)(nil)

// New returns a Runner on c whose keys start with prefix (see the package
// doc for the layout). c may be a single server or a Redis Cluster. New
// panics when prefix holds a brace, which would move every key's hash tag;
// the configuration allows none.
func New(c redis.UniversalClient, prefix string) *Runner {
	if strings.ContainsAny(prefix, "{}") {
		panic(fmt.Sprintf("ratelimit: key prefix %q must not contain braces", prefix))
	}
	r := &Runner{c: c, prefix: prefix, lib: lib, batch: newBatcher(c, lib), answers: quota.DefaultAnswerLimits}
	r.releaseArg = r.releases()
	return r
}

// key returns the key of one piece of a tenant's state.
func (r *Runner) key(tenantID, name string) string {
	return r.prefix + ":v1:{t:" + tenantID + "}:" + name
}

// stateKeys returns the KEYS of a function of the state (lua/state.lua):
// the state hash, then extra.
func (r *Runner) stateKeys(tenantID string, extra ...string) []string {
	k := make([]string, 1, 1+len(extra)+1)
	k[0] = r.stateKey(tenantID)
	for _, name := range extra {
		k = append(k, r.key(tenantID, name))
	}
	return k
}

// stateKey is the tenant's state hash (lua/state.lua).
func (r *Runner) stateKey(tenantID string) string {
	return r.prefix + ":v2:{t:" + tenantID + "}"
}

// keys returns admit's KEYS in order (limits.Functions' admit): the
// idempotency record's only when idem is set.
func (r *Runner) keys(tenantID, idem string) []string {
	if idem != "" {
		return r.stateKeys(tenantID, "pending", "mq", "idem2:"+idem)
	}
	return r.stateKeys(tenantID, "pending", "mq")
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
func (r *Runner) Admit(ctx context.Context, req quota.Request) (quota.Decision, error) {
	if err := checkRequest(req); err != nil {
		return quota.Decision{}, err
	}
	l, err := listFor(req)
	if err != nil {
		return quota.Decision{}, err
	}
	mode, idem := "admit", ""
	switch {
	case req.DryRun:
		mode = "dry"
	case req.IdempotencyKey != "":
		idem = idemHash(req.IdempotencyKey)
	}
	if len(req.Policies) > 0 {
		return r.admitWithPolicies(ctx, req, l, mode, idem)
	}
	res, err := r.run(ctx, req.TenantID, idem, micros(req.Now), mode, l, req.Cost, req.Meter,
		req.IdempotencyFingerprint, req.IdempotencyLease.Microseconds(), prepaidArg(req.Prepaid), nil)
	if err == nil && mode != "dry" {
		r.active.add(req.TenantID) // admitted or refused, its pending usage changed
	}
	if err != nil {
		return quota.Decision{}, fmt.Errorf("ratelimit: admit: %w", err)
	}
	return limits.DecodeFlat(res).Quota(l), nil
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
func (r *Runner) PeekIn(ctx context.Context, tenantID string, cal quota.Calendar, lim quota.Limits, now time.Time) (quota.Decision, error) {
	if err := checkTenant(tenantID); err != nil {
		return quota.Decision{}, err
	}
	if err := checkNow(now); err != nil {
		return quota.Decision{}, err
	}
	l, err := listFor(quota.Request{Meter: "-", Limits: lim, Calendar: cal})
	if err != nil {
		return quota.Decision{}, err
	}
	res, err := r.run(ctx, tenantID, "", micros(now), "peek", l, 1, "-", "", 0, "", nil)
	if err != nil {
		return quota.Decision{}, fmt.Errorf("ratelimit: peek: %w", err)
	}
	return limits.DecodeFlat(res).Quota(l), nil
}

// run calls admit (lua/admit.lua) on list l, whose calendar, unless it
// is the default, goes with its Boundaries around now (Go's clock when now
// is 0); pol, when not nil, are the policies decided in the same call,
// with the request's id. When Redis's clock is outside those boundaries
// (the function answers "CALENDAR <its now>", having written nothing), run
// calls once more with the boundaries of the function's now. It returns
// the answer: limits.AnswerLen values (limits.TierAnswerLen for a list
// without a meter quota and no policies), then the policies' items.
func (r *Runner) run(ctx context.Context, tenantID, idem string, now int64, mode string, l *limits.List, cost int64, meter, fp string, leaseUS int64, prepaid string, pol *inSlot) ([]int64, error) {
	// The batcher coalesces concurrent calls into pipelines (batch.go); a
	// Redis without the library (restarted, flushed, a new master) is
	// given it again (library.go).
	cal, calArg := l.Calendar, ""
	if !cal.IsDefault() {
		t := time.Now()
		if now > 0 {
			t = time.UnixMicro(now)
		}
		calArg = boundsOf(cal, t).arg
	}
	keys, args, want := r.admitCall(tenantID, idem, now, mode, l, cost, meter, fp, leaseUS, calArg, prepaid, pol)
	// an admission that may take a lease is seen to its end, so that its
	// caller learns of the lease and releases it (batcher.do)
	finish := pol != nil && pol.leases && mode == "admit"
	res, err := r.batch.do(ctx, keys, args, finish)
	if err != nil && calArg != "" {
		if at := calendarNow(err); at > 0 {
			args[admitArg("calendar")] = makeBounds(cal, time.UnixMicro(at)).arg
			res, err = r.batch.do(ctx, keys, args, finish)
		}
	}
	if err != nil {
		return nil, prepaidStale(err)
	}
	short := len(res) == limits.TierAnswerLen && want == limits.AnswerLen // (no meter quota, no policies)
	if len(res) != want && !short && !(len(res) == limits.AnswerLen && res[5] >= int64(quota.IdemInFlight)) {
		return nil, fmt.Errorf("script answered %d values, want %d", len(res), want)
	}
	return res, nil
}

// admitCall is the keys and arguments of a call of admit (lua/admit.lua,
// by limits.Functions' positions), and how many integers its answer
// holds.
func (r *Runner) admitCall(tenantID, idem string, now int64, mode string, l *limits.List, cost int64, meter, fp string, leaseUS int64, calArg, prepaid string, pol *inSlot) (keys []string, args []any, want int) {
	np, id, outside := 0, "", ""
	if pol != nil {
		np, id, outside = len(pol.specs), pol.id, pol.outside
	}
	args = make([]any, admitArgs, admitArgs+policyArgs*np)
	args[0], args[1], args[2], args[3], args[4] = now, boxed(mode), l.Wire(), cost, meter
	args[5], args[6], args[7], args[8], args[9], args[10], args[11] = id, fp, leaseUS, calArg, prepaid, outside, np
	keys = r.keys(tenantID, idem)
	if pol != nil {
		args = appendPolicyArgs(args, pol.specs)
		for _, sp := range pol.specs {
			keys = append(keys, sp.Key)
		}
	}
	return keys, args, limits.AnswerLen + policyItem*np
}

// admit's arguments (limits.Functions), before the policies' groups of
// policyArgs each (lua/policy.lua's POLICY_ARGS); a policy's answer is
// policyItem values.
var (
	admitArgs  = len(limits.Functions[0].Args)
	policyArgs = 7
	policyItem = len(limits.Functions[0].ResultsRepeat)
)

// admitArg is the index in admit's arguments of name.
func admitArg(name string) int { return limits.Index(limits.Functions[0].Args, name) - 1 }

// calArg is a calendar argument of the library's functions: b's
// boundaries, or the empty string for the default calendar.
func calArg(b *calBounds) any {
	if b == nil {
		return ""
	}
	return b.arg
}

// boxedStrings are the script arguments that take a few fixed values,
// boxed once: an interface made of a string variable allocates.
var boxedStrings = map[string]any{"admit": "admit", "dry": "dry", "peek": "peek"}

func boxed(s string) any {
	if v, ok := boxedStrings[s]; ok {
		return v
	}
	return s
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
	if err := checkTenant(tenantID); err != nil {
		return false, err
	}
	if period != "day" && period != "month" {
		return false, quota.FieldError("period", `must be "day" or "month"`)
	}
	if units < 1 || units > quota.MaxQuantity {
		return false, quota.FieldError("units", "must be an integer between 1 and %d", quota.MaxQuantity)
	}
	if err := checkNow(now); err != nil {
		return false, err
	}
	// The script's period ids: days since the epoch (of the local date, in
	// a calendar), or year*100+month (of the anchor day starting the
	// period): the ids of the period's first date in any calendar.
	var periodID int64
	if !start.IsZero() {
		start = start.UTC()
		periodID = floorDiv(start.Unix(), 86400)
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
	keys := r.stateKeys(tenantID)
	res, err := r.fcall(ctx, fnGrant, keys, micros(now), period, units, id, periodID, calArg(b)).Int64Slice()
	if err != nil && b != nil {
		if at := calendarNow(err); at > 0 {
			b = makeBounds(cal, time.UnixMicro(at))
			res, err = r.fcall(ctx, fnGrant, keys, micros(now), period, units, id, periodID, b.arg).Int64Slice()
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
