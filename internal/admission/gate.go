// Package admission puts one Gate in front of the Redis runner: every change
// of an API node's quota state (admissions, dry runs, refunds, idempotent
// answers) goes through it, which adds
//
//   - the deny cache: once a tenant is refused until T, its later requests of
//     the same or a higher cost that the same limits limit (the tier's for
//     every meter, a meter's own quota for that meter: see denials) are
//     refused in-process until T, with no Redis round trip. Those refusals
//     are still counted: the gate adds them up per
//     tenant, meter and hour and FlushRefusals writes the sums to the pending
//     usage (one pipeline a second, not a round trip per refusal). Whatever
//     frees room clears the entry on every node: an admin change to the
//     tenant or its tier, a refund, a grant (Forget, through the catalog's
//     invalidations);
//   - the Redis outage policy of the tenant's tier: fail-open admits through
//     an in-process limiter at the tier's own limits (never unlimited),
//     marks the decision Degraded and holds its usage until Redis (or the
//     ledger) records it, exactly once (outage.go); fail-closed answers
//     CodeUnavailable;
//   - a circuit breaker per Redis shard (the master serving the tenant's
//     slot; the one server of a single-node Redis): after breakerErrors
//     consecutive errors on a shard the gate stops calling it for
//     breakerPause, then lets requests try again. Tenants on healthy shards
//     are never paused, and a tenant's in-process limiter is dropped only
//     when its own shard answers for it again.
//
// Concurrent admissions reach Redis coalesced, one pipeline per Redis node
// and one call per tenant (internal/ratelimit's batcher), behind the same
// entry point.
package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/locallimit"
	"github.com/tollgate/tollgate/internal/quota"
)

const (
	// breakerErrors consecutive errors on a shard open its breaker: one
	// timeout is noise, not an outage.
	breakerErrors = 3
	// breakerPause is how long an open breaker leaves its shard alone.
	breakerPause = time.Second
	// maxLocal bounds the in-process limiters kept during an outage, and
	// the deny cache.
	maxLocal = 100_000
	// maxRefusalKeys bounds the refusals waiting for FlushRefusals; past it
	// new (tenant, meter, hour) triples are dropped, never the sums held.
	maxRefusalKeys = 100_000
)

// Store is what the gate needs of the Redis side; *quotaredis.Store
// provides it.
type Store interface {
	quota.Admitter
	// RefundRequest gives back the units of req, admitted by d, while its
	// day and month (of req's billing calendar) are the current ones, its
	// meter quota's too.
	RefundRequest(ctx context.Context, req quota.Request, d quota.Decision) error
	StoreAnswer(ctx context.Context, req quota.Request, a quota.StoredAnswer) (bool, error)
	ReleaseKey(ctx context.Context, req quota.Request) error
	// ClaimAnswer takes the room of the idempotency record req may write
	// (see idem.go); UnclaimAnswer gives it back.
	ClaimAnswer(ctx context.Context, req quota.Request, force bool) (quota.AnswerClaim, error)
	UnclaimAnswer(ctx context.Context, req quota.Request) error
	Answer(ctx context.Context, tenantID, key string) (quota.StoredAnswer, error)
	CountRefused(ctx context.Context, counts []quota.RefusalCount) error
	// ReleasePolicies ends the leases of req's concurrency policies.
	ReleasePolicies(ctx context.Context, req quota.Request) error
	// ReportActive tells the worker which tenants counted usage since the
	// last call.
	ReportActive(ctx context.Context) error
	// Shard names the Redis node that holds the tenant's state.
	Shard(tenantID string) string
	// RecoverOutage records fail-open usage exactly once under the
	// batch's id (see outage.go).
	RecoverOutage(ctx context.Context, b *quota.OutageBatch) error
	// EpochLost reports whether Redis lost data that the worker has not
	// restored yet.
	EpochLost(ctx context.Context) (bool, error)
}

// denial is a remembered refusal: until the local time until, a request
// of the tenant of at least cost units is refused with decision, when
// every limit that refused (decision.Violated) limits it too (see
// denials).
type denial struct {
	until    time.Time // local clock; zero: no refusal held
	cost     int64
	meter    string // the refused request's meter
	decision quota.Decision
	nTier    int // decision.Limits[:nTier] are the tier's items, the rest its meter quota's
}

// denials are a tenant's remembered refusals: all, by tier-wide limits
// only (GCRA, the token bucket, the day's and month's quotas, and the
// spend cap when no meter quota prices the overage differently), holds for
// every meter; one of meters, by a limit of one meter among them (its
// meter quota, its spend cap or credit), for that meter only. A refusal
// by a policy is never remembered: it may hold for one route, key or
// value only.
type denials struct {
	all    denial
	meters []denial // at most maxMeterDenials, one per meter
}

// maxMeterDenials bounds the meter refusals remembered per tenant.
const maxMeterDenials = 8

type refusalKey struct {
	tenant, meter string
	hour          int64 // unix s
}

type breaker struct {
	fails     int
	openUntil time.Time
}

// Gate is the API node's door to quota state. It is safe for concurrent use.
type Gate struct {
	store Store
	now   func() time.Time

	mu       sync.Mutex
	deny     map[string]*denials
	breakers map[string]*breaker
	refused  map[refusalKey]int64

	nBreakers atomic.Int32 // fast path: none kept
	queue     *waitQueue   // requests waiting in a policy queue on this node (queue.go)

	local  *locallimit.Limiter // fail-open decisions during an outage
	outage *outage             // their usage, until Redis or the ledger has it

	node     *locallimit.Node // policies of scope node
	adaptMu  sync.Mutex
	adaptive map[string]adaptiveEntry // adaptive policies' state, by name

	// OnRedisError is called on every Redis failure (metrics).
	OnRedisError func(error)
	// OnDenyHit is called when the deny cache answers (metrics).
	OnDenyHit func()
	// OnRoom is called after this node freed room for a tenant (a refund),
	// so that every node drops its deny entry (the catalog publishes it).
	OnRoom func(ctx context.Context, tenantID string)
	// Ledger, when set, takes fail-open usage that Redis did not take
	// for outageLedgerAfter, or at shutdown (outage.go).
	Ledger OutageLedger
	// OnQueueFull is called when a request is refused at once because a
	// bound of the policy queues is full: QueueFullNode, QueueFullTenant
	// or QueueFullPolicy (metrics).
	OnQueueFull func(bound string)
}

// New returns a Gate in front of the Redis store s.
func New(s Store, now func() time.Time) *Gate {
	return &Gate{store: s, now: now, deny: map[string]*denials{}, local: locallimit.NewLimiter(maxLocal),
		node: locallimit.NewNode(maxLocal), adaptive: map[string]adaptiveEntry{},
		breakers: map[string]*breaker{}, refused: map[refusalKey]int64{}, outage: newOutage(), queue: newWaitQueue(),
		OnRedisError: func(error) {}, OnDenyHit: func() {}, OnRoom: func(context.Context, string) {}, OnQueueFull: func(string) {}}
}

// Admit decides on req. It returns an error only when the decision cannot be
// taken: Redis failed and the tier fails closed (CodeUnavailable), the
// request is invalid (CodeInvalid), or the context ended.
//
// A request refused only by policies whose on_refuse is "queue" waits and
// is decided again (queue.go), as long as the wait stays within the
// smallest max_wait_ms of those policies (counted from the first decision)
// and the node's queue bounds leave it a slot; a waiter whose ctx ends (its
// client hung up) leaves the queue with its last refusal. Tier limits
// never queue.
//
// A request with an idempotency key claims the room of the record it may
// write first (idem.go): past the tenant's room it is refused (IdemLimit)
// before anything else is decided.
func (g *Gate) Admit(ctx context.Context, req quota.Request) (quota.Decision, error) {
	if req.IdempotencyKey != "" && !req.DryRun {
		return g.admitIdempotent(ctx, req)
	}
	return g.admitQueued(ctx, req)
}

// admitQueued is Admit's decision, with the waits of queue policies.
func (g *Gate) admitQueued(ctx context.Context, req quota.Request) (quota.Decision, error) {
	d, err := g.admitOnce(ctx, req)
	if err != nil || d.Allowed || req.DryRun {
		return d, err
	}
	budget, ok := queueBudget(d)
	if !ok {
		return d, nil
	}
	return g.wait(ctx, req, d, budget)
}

// queueBudget reports whether refusal d may wait in a queue (only policies
// with on_refuse "queue" refused it) and how long at most.
func queueBudget(d quota.Decision) (time.Duration, bool) {
	if d.Allowed || d.Fallback != nil || d.Idem != quota.IdemNone || len(d.Violated) == 0 {
		return 0, false
	}
	budget, queued := time.Duration(-1), 0
	for _, st := range d.Policies {
		if st.Outcome != quota.PolicyRefused {
			continue
		}
		if st.Policy.OnRefuse != quota.RefuseQueue || st.Policy.MaxWaitMS == nil {
			return 0, false
		}
		w := time.Duration(*st.Policy.MaxWaitMS) * time.Millisecond
		if budget < 0 || w < budget {
			budget = w
		}
		queued++
	}
	// every violated name must be one of those policies: a tier limit
	// never queues
	if queued == 0 || queued != len(d.Violated) {
		return 0, false
	}
	return budget, true
}

// Release ends what an admitted request holds until its response ends:
// the leases of its concurrency policies (in Redis and on this node) and
// its place in an adaptive policy's flight. A replay (d.Replayed()) holds
// none of them: Admit gave back what it took before answering, and Release
// does nothing for it.
func (g *Gate) Release(ctx context.Context, req quota.Request, d quota.Decision) error {
	if !d.Allowed || d.Replayed() {
		return nil
	}
	g.releaseLocal(req, d)
	if d.Degraded {
		return nil
	}
	for _, st := range d.Policies {
		if st.Policy.Algorithm == quota.AlgConcurrency && st.Outcome == quota.PolicyAdmitted && st.Policy.InRedis() {
			return g.store.ReleasePolicies(ctx, req)
		}
	}
	return nil
}

// admitOnce is one decision: the node's own policies (policies.go), then
// the deny cache, else Redis, else the outage policy.
func (g *Gate) admitOnce(ctx context.Context, req quota.Request) (quota.Decision, error) {
	if len(req.Policies) > 0 {
		return g.admitWithLocal(ctx, req)
	}
	return g.admitShared(ctx, req)
}

// admitShared decides on req with the state all nodes share: the deny
// cache, else Redis, else the outage policy.
func (g *Gate) admitShared(ctx context.Context, req quota.Request) (quota.Decision, error) {
	now := g.now()
	if d, ok := g.denied(req, now); ok {
		g.OnDenyHit()
		return d, nil
	}
	// The tenant's shard is looked up only while some breaker is open, or
	// after an error: the common path never needs it.
	shard := ""
	if g.nBreakers.Load() > 0 {
		shard = g.store.Shard(req.TenantID)
	}
	if shard == "" || !g.open(shard, now) {
		d, err := g.store.Admit(ctx, req)
		if err == nil {
			if shard != "" {
				g.closeBreaker(shard)
			}
			if g.local.Len() > 0 {
				g.local.Forget(req.TenantID) // its own shard answered again
			}
			if !d.Allowed && !req.DryRun && d.Idem == quota.IdemNone && len(d.Policies) == 0 {
				// (a policy's refusal is not the tenant's: it may hold
				// for one meter, key or value only)
				g.remember(req, d, now)
			}
			return d, nil
		}
		var qe *quota.Error
		var stale *quota.PrepaidStaleError
		if errors.As(err, &qe) || errors.As(err, &stale) || ctx.Err() != nil {
			return d, err
		}
		g.OnRedisError(err)
		if shard == "" {
			shard = g.store.Shard(req.TenantID)
		}
		g.failed(shard, now)
		if errors.Is(err, quota.ErrOutcomeUnknown) && !req.DryRun {
			// Redis may have counted it (a pause, a timeout): admitted
			// here too, a fail-open tier's request would be billed twice.
			// It is refused as a fail-closed one is; the requests after it
			// meet the open breaker and are decided here alone.
			return quota.Decision{}, &quota.Error{Code: quota.CodeUnavailable,
				Message: "the quota store did not answer in time and may have counted this request; it was not served: retry shortly"}
		}
	}
	if !req.FailOpen {
		return quota.Decision{}, &quota.Error{Code: quota.CodeUnavailable,
			Message: "the quota store is unavailable and this tier fails closed; retry shortly"}
	}
	if req.Prepaid != nil {
		// The credit is drawn down in Redis only: an in-process limiter
		// could not know what the other nodes drew, so a prepaid tenant
		// fails closed whatever its tier says.
		return quota.Decision{}, &quota.Error{Code: quota.CodeUnavailable,
			Message: "the quota store is unavailable and prepaid credit is drawn there only; retry shortly"}
	}
	if req.IdempotencyKey != "" && !req.DryRun {
		// Keys are recorded in Redis only: this node cannot know whether
		// another one (or Redis, before the outage) ran the request, and a
		// repeat must never run twice.
		return quota.Decision{}, errIdemUnavailable
	}
	return g.admitLocally(req, now)
}

// open reports whether shard's breaker is open at now.
func (g *Gate) open(shard string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.breakers[shard]
	return ok && now.Before(b.openUntil)
}

// failed counts an error on shard and opens its breaker at breakerErrors.
// An open breaker whose pause ended and fails again reopens at once.
func (g *Gate) failed(shard string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.breakers[shard]
	if !ok {
		if len(g.breakers) >= maxLocal {
			return // a storm of shard names cannot grow this without bound
		}
		b = &breaker{}
		g.breakers[shard] = b
		g.nBreakers.Add(1)
	}
	b.fails++
	if b.fails >= breakerErrors {
		b.openUntil = now.Add(breakerPause)
	}
}

func (g *Gate) closeBreaker(shard string) {
	g.mu.Lock()
	if _, ok := g.breakers[shard]; ok {
		delete(g.breakers, shard)
		g.nBreakers.Add(-1)
	}
	g.mu.Unlock()
}

// denied answers from the deny cache when one of the tenant's remembered
// refusals holds for req (denials): req is at least as costly, its time
// has not come, and every limit that refused limits req too. It counts the
// refusal. Idempotent requests skip it: their first decision may be stored
// in Redis. A tier-wide refusal answers another meter with the tier's
// items only; a meter with a quota of its own, whose items the refusal
// does not hold, asks Redis.
func (g *Gate) denied(req quota.Request, now time.Time) (quota.Decision, bool) {
	if req.IdempotencyKey != "" {
		return quota.Decision{}, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	ds, ok := g.deny[req.TenantID]
	if !ok {
		return quota.Decision{}, false
	}
	var e *denial
	if a := &ds.all; ds.holds(a, req, now) && (a.meter == req.Meter || quota.MeterQuotaFor(req.MeterQuotas, req.Meter) == nil) {
		e = a
	} else {
		for i := range ds.meters {
			if m := &ds.meters[i]; m.meter == req.Meter && ds.holds(m, req, now) {
				e = m
				break
			}
		}
	}
	if e == nil {
		if ds.empty() {
			delete(g.deny, req.TenantID)
		}
		return quota.Decision{}, false
	}
	d := e.decision
	if e.meter != req.Meter {
		d.Limits = d.Limits[:e.nTier]
	}
	elapsed := now.Sub(e.until.Add(-e.decision.RetryAfter))
	d.RetryAfter -= elapsed
	d.Now = d.Now.Add(elapsed)
	if !req.DryRun {
		k := refusalKey{tenant: req.TenantID, meter: req.Meter, hour: d.Now.Unix() / 3600 * 3600}
		if _, held := g.refused[k]; held || len(g.refused) < maxRefusalKeys {
			g.refused[k]++
		}
	}
	return d, true
}

// holds reports whether e refuses req at now; an entry whose time has come
// is cleared.
func (ds *denials) holds(e *denial, req quota.Request, now time.Time) bool {
	if e.until.IsZero() {
		return false
	}
	if !now.Before(e.until) {
		*e = denial{}
		return false
	}
	return req.Cost >= e.cost
}

// empty reports whether ds holds no refusal.
func (ds *denials) empty() bool {
	if !ds.all.until.IsZero() {
		return false
	}
	for i := range ds.meters {
		if !ds.meters[i].until.IsZero() {
			return false
		}
	}
	return true
}

// refusalScope says for which requests of the tenant the refusal d of req
// holds: every meter (perMeter false), or req's meter only; ok is false
// when it cannot be remembered (a limit this gate does not know, such as
// a policy's). A larger cost is refused by whatever refused a smaller one,
// so cost only needs the lower bound the entry keeps.
func refusalScope(req quota.Request, d quota.Decision) (perMeter, ok bool) {
	for _, v := range d.Violated {
		switch v {
		case quota.LimitBurst, quota.LimitBucket, quota.LimitDaily, quota.LimitMonthly:
		case quota.LimitSpendCap:
			// With meter quotas the cap weighs a meter's overage at its own
			// price, and a meter under its quota may have none.
			perMeter = perMeter || len(req.MeterQuotas) > 0
		case quota.LimitCredit:
			perMeter = true // the credit pays overage, priced by meter
		default:
			if !meterLimit(v, req.Meter) {
				return false, false
			}
			perMeter = true
		}
	}
	return perMeter, len(d.Violated) > 0
}

// meterLimit reports whether name is one of meter's quotas ("<meter>.daily",
// "<meter>.monthly"), without building the names.
func meterLimit(name quota.LimitName, meter string) bool {
	rest, ok := strings.CutPrefix(string(name), meter)
	return ok && (rest == ".daily" || rest == ".monthly")
}

func (g *Gate) remember(req quota.Request, d quota.Decision, now time.Time) {
	if d.RetryAfter <= 0 {
		return // never passes: nothing to wait for, and nothing worth caching
	}
	perMeter, ok := refusalScope(req, d)
	if !ok {
		return
	}
	nTier := 0
	for nTier < len(d.Limits) && slices.Contains(quota.AllLimits, d.Limits[nTier].Name) {
		nTier++
	}
	e := denial{until: now.Add(d.RetryAfter), cost: req.Cost, meter: req.Meter, decision: d, nTier: nTier}
	g.mu.Lock()
	defer g.mu.Unlock()
	ds := g.deny[req.TenantID]
	if ds == nil {
		if len(g.deny) >= maxLocal {
			g.deny = map[string]*denials{}
		}
		ds = &denials{}
		g.deny[req.TenantID] = ds
	}
	if !perMeter {
		ds.all = e
		return
	}
	// the meter's own slot, else a free or expired one, else the one
	// that ends first
	slot := -1
	for i := range ds.meters {
		m := &ds.meters[i]
		switch {
		case m.meter == req.Meter:
			ds.meters[i] = e
			return
		case slot < 0 && (m.until.IsZero() || !now.Before(m.until)):
			slot = i
		}
	}
	if slot < 0 && len(ds.meters) < maxMeterDenials {
		ds.meters = append(ds.meters, e)
		return
	}
	if slot < 0 {
		slot = 0
		for i := range ds.meters {
			if ds.meters[i].until.Before(ds.meters[slot].until) {
				slot = i
			}
		}
	}
	ds.meters[slot] = e
}

// Forget clears what the gate holds for a tenant, or for every tenant when
// tenantID is "" (a tier changed). The catalog calls it on every node for
// every admin change to the tenant or its tier and for every KindRoom
// message. Outage limiters are kept: they stand for Redis state this node
// cannot see, and go when the tenant's shard answers.
func (g *Gate) Forget(tenantID string) {
	g.mu.Lock()
	if tenantID == "" {
		g.deny = map[string]*denials{}
	} else {
		delete(g.deny, tenantID)
	}
	g.mu.Unlock()
}

// Refund gives back the units of an admitted request whose upstream failed
// (see pending.Usage.Refund), releases its idempotency key so that a
// retry runs again, and clears the tenant's deny entries on every node: the
// refund may have made room. A fail-open admission's units are taken off
// the usage this node holds for Redis (outage.go) instead.
func (g *Gate) Refund(ctx context.Context, req quota.Request, d quota.Decision) error {
	if d.Degraded {
		// a fail-open admission: its units are taken off what the node
		// holds (outage.go); its in-process quotas keep them
		g.outage.add(req, d.Now, g.now(), -req.Cost, 0)
		return nil
	}
	if err := g.store.RefundRequest(ctx, req, d); err != nil {
		return err
	}
	var err error
	if req.IdempotencyKey != "" {
		err = g.store.ReleaseKey(ctx, req)
	}
	g.Forget(req.TenantID)
	g.OnRoom(ctx, req.TenantID)
	return err
}

// StoreAnswer keeps the answer of the first request with an idempotency key
// for its repeats.
func (g *Gate) StoreAnswer(ctx context.Context, req quota.Request, a quota.StoredAnswer) error {
	_, err := g.store.StoreAnswer(ctx, req, a)
	return err
}

// ReleaseKey forgets the first request with an idempotency key that will
// have no answer to store (it failed before answering).
func (g *Gate) ReleaseKey(ctx context.Context, req quota.Request) error {
	return g.store.ReleaseKey(ctx, req)
}

// Answer reads the stored answer replayed to a repeat (Decision.Replayed()).
func (g *Gate) Answer(ctx context.Context, req quota.Request) (quota.StoredAnswer, error) {
	return g.store.Answer(ctx, req.TenantID, req.IdempotencyKey)
}

// FlushRefusals writes the refusals the deny cache answered since the last
// call to the tenants' pending usage, in one pipeline; Report calls it
// about once a second, off the request path. On an error the counts are
// kept for the next call.
func (g *Gate) FlushRefusals(ctx context.Context) error {
	g.mu.Lock()
	if len(g.refused) == 0 {
		g.mu.Unlock()
		return nil
	}
	held := g.refused
	g.refused = map[refusalKey]int64{}
	g.mu.Unlock()
	counts := make([]quota.RefusalCount, 0, len(held))
	for k, n := range held {
		counts = append(counts, quota.RefusalCount{TenantID: k.tenant, Meter: k.meter, Hour: time.Unix(k.hour, 0).UTC(), Requests: n})
	}
	if err := g.store.CountRefused(ctx, counts); err != nil {
		g.mu.Lock()
		for k, n := range held {
			if _, ok := g.refused[k]; ok || len(g.refused) < maxRefusalKeys {
				g.refused[k] += n
			}
		}
		g.mu.Unlock()
		return fmt.Errorf("admission: flush refusals: %w", err)
	}
	return nil
}

// finalReport bounds the last report, after the node's last request.
const finalReport = 2 * time.Second

// Report writes the refusals the deny cache answered (FlushRefusals) and
// the fail-open usage the node holds (FlushOutage), then tells the worker
// which tenants counted usage, theirs included. Each step keeps what
// failed for the next call, and the worker's sweep finds the tenants of a
// node that died, so a failure is only a delay.
func (g *Gate) Report(ctx context.Context) error { return g.report(ctx, false) }

// report is Report; final, at shutdown, sends the fail-open usage that
// Redis does not take to the ledger at once.
func (g *Gate) report(ctx context.Context, final bool) error {
	err := g.FlushRefusals(ctx)
	err = errors.Join(err, g.FlushOutage(ctx, final))
	return errors.Join(err, g.store.ReportActive(ctx))
}

// RunReports calls Report every interval, each run under a timeout of one
// interval, until ctx ends; then it reports once more, under its own
// timeout, and returns. Cancel ctx after the node's last request (after the
// HTTP server shut down) and wait for RunReports to return before closing
// Redis, so that the last report counts every request. Failures are logged
// to log and retried on the next tick.
func (g *Gate) RunReports(ctx context.Context, every time.Duration, log *slog.Logger) {
	var refused, toLedger int64
	run := func(ctx context.Context, timeout time.Duration, final bool) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := g.report(ctx, final); err != nil {
			log.Warn("reporting usage to the worker failed; retrying", "err", err)
		}
		if n := g.OutageRefused(); n != refused {
			rows, units := g.OutagePending()
			log.Warn("fail-open requests refused: this node holds all the fail-open usage it may until Redis or Postgres takes it",
				"refused", n-refused, "pending_rows", rows, "pending_units", units)
			refused = n
		}
		if _, n := g.OutageRecorded(); n != toLedger {
			log.Warn("fail-open usage written to the ledger directly: Redis stayed away; its overage and quota counters are not counted",
				"units", n-toLedger)
			toLedger = n
		}
		if final {
			if rows, units := g.OutagePending(); rows > 0 {
				log.Error("shutting down with fail-open usage that neither Redis nor Postgres took: it is lost",
					"pending_rows", rows, "pending_units", units)
			}
		}
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			run(context.WithoutCancel(ctx), finalReport, true)
			return
		case <-t.C:
			run(ctx, every, false)
		}
	}
}

// admitLocally decides with an in-process limiter at the tenant's own
// limits and local time. Quotas start from zero on this node, so during an
// outage a tenant gets at most its quotas per node: a bounded, never an
// unlimited, allowance. The usage it admits is held until Redis or the
// ledger records it (outage.go); when the node holds all it may, a request
// that needs a new row is refused as unavailable rather than served
// unbilled.
func (g *Gate) admitLocally(req quota.Request, now time.Time) (quota.Decision, error) {
	if !req.DryRun && !g.outage.room(outageKeyOf(req, now)) {
		g.outage.refused.Add(1)
		return quota.Decision{}, &quota.Error{Code: quota.CodeUnavailable,
			Message: "the quota store is unavailable and this node holds all the usage it can until it answers; retry shortly"}
	}
	d, err := g.local.Admit(req, now)
	if err != nil {
		// The runner refuses such requests before any I/O, so they never
		// reach here; an error is still an answer, never a crash.
		return quota.Decision{}, fmt.Errorf("admission: local limiter: %w", err)
	}
	d.Degraded = true
	if d.Allowed && !req.DryRun {
		g.outage.add(req, d.Now, now, req.Cost, 1)
	}
	return d, nil
}

// Settler is what settling needs of the store (routes with settle: true);
// *settlement.Settler, in *quotaredis.Store, provides it.
type Settler interface {
	Reserve(ctx context.Context, requestID string, req quota.Request, d quota.Decision) error
	Settle(ctx context.Context, tenantID, requestID string, actual int64) (quota.Settlement, error)
	// RefundReserved settles a reservation to 0, marked refunded.
	RefundReserved(ctx context.Context, tenantID, requestID string) (quota.Settlement, error)
	// Hold and TakeHold keep the concurrency leases of a reserved request
	// (POST /v1/check) until POST /v1/release or /v1/refund.
	Hold(ctx context.Context, tenantID, requestID, value string, ttl time.Duration) error
	TakeHold(ctx context.Context, tenantID, requestID string) (string, bool, error)
	// NoteRequestID and RequestIDOf keep a counted check's request id in
	// its idempotency record, for the repeats of its key.
	NoteRequestID(ctx context.Context, tenantID, key, requestID string) error
	RequestIDOf(ctx context.Context, tenantID, key string) (string, error)
}

var errNoSettler = errors.New("admission: the store cannot settle")

// Reserve records an admitted request of a settle route for Settle
// (settlement.Settler.Reserve). A fail-open admission is reserved on this
// node only (Redis is away): it settles here, into the usage the node
// holds for it.
func (g *Gate) Reserve(ctx context.Context, requestID string, req quota.Request, d quota.Decision) error {
	if d.Degraded {
		g.outage.reserveLocal(requestID, req, d, g.now())
		return nil
	}
	st, ok := g.store.(Settler)
	if !ok {
		return errNoSettler
	}
	return st.Reserve(ctx, requestID, req, d)
}

// Settle settles a reserved request to its actual cost, exactly once
// (settlement.Settler.Settle). A refund clears the tenant's deny entries on
// every node, as Refund does.
func (g *Gate) Settle(ctx context.Context, tenantID, requestID string, actual int64) (quota.Settlement, error) {
	return g.settle(ctx, tenantID, requestID, actual, false)
}

// RefundReserved refunds a reserved request whole, exactly once: a settle
// to 0 after which a settle or another refund changes nothing
// (SettleRefunded).
func (g *Gate) RefundReserved(ctx context.Context, tenantID, requestID string) (quota.Settlement, error) {
	return g.settle(ctx, tenantID, requestID, 0, true)
}

func (g *Gate) settle(ctx context.Context, tenantID, requestID string, actual int64, refund bool) (quota.Settlement, error) {
	if r, found, already := g.outage.settleLocal(requestID, tenantID, g.now(), refund); already != quota.SettleUnknown {
		return quota.Settlement{Status: already}, nil
	} else if found {
		delta := actual - r.req.Cost
		g.outage.add(r.req, r.at, g.now(), delta, 0)
		return quota.Settlement{Status: quota.SettleApplied, Delta: delta}, nil
	}
	st, ok := g.store.(Settler)
	if !ok {
		return quota.Settlement{}, errNoSettler
	}
	var s quota.Settlement
	var err error
	if refund {
		s, err = st.RefundReserved(ctx, tenantID, requestID)
	} else {
		s, err = st.Settle(ctx, tenantID, requestID, actual)
	}
	if err == nil && s.Status == quota.SettleApplied && s.Delta < 0 {
		g.Forget(tenantID)
		g.OnRoom(ctx, tenantID)
	}
	return s, err
}

// Hold records the concurrency leases held in Redis that d admitted req
// with, under req.RequestID, until TakeHold or the longest of their
// leases. A fail-open decision holds nothing in Redis.
func (g *Gate) Hold(ctx context.Context, req quota.Request, d quota.Decision) error {
	if d.Degraded || !d.Allowed {
		return nil
	}
	var b strings.Builder
	ttl := time.Duration(0)
	for _, st := range d.Policies {
		p := st.Policy
		if p.Algorithm != quota.AlgConcurrency || st.Outcome != quota.PolicyAdmitted || !p.InRedis() {
			continue
		}
		value := ""
		for _, c := range req.Policies {
			if c.Policy != nil && c.Policy.Name == p.Name {
				value = c.Value
			}
		}
		if b.Len() > 0 {
			b.WriteByte(holdSep)
		}
		b.WriteString(p.Name)
		b.WriteByte(holdValueSep)
		b.WriteString(value)
		if p.LeaseSeconds != nil {
			ttl = max(ttl, time.Duration(*p.LeaseSeconds)*time.Second)
		}
	}
	if b.Len() == 0 {
		return nil
	}
	st, ok := g.store.(Settler)
	if !ok {
		return errNoSettler
	}
	return st.Hold(ctx, req.TenantID, req.RequestID, b.String(), max(ttl, time.Second))
}

// The separators of a Hold's record: policy names and scope values hold
// neither (names are slugs; values are ids, key ids and header values
// without control characters).
const (
	holdSep      = '\x1e'
	holdValueSep = '\x1f'
)

// TakeHold takes what Hold recorded for the request, once: nil when
// nothing is held (never held, released before, or lapsed).
func (g *Gate) TakeHold(ctx context.Context, tenantID, requestID string) ([]quota.HeldLease, error) {
	st, ok := g.store.(Settler)
	if !ok {
		return nil, errNoSettler
	}
	v, found, err := st.TakeHold(ctx, tenantID, requestID)
	if err != nil || !found {
		return nil, err
	}
	var out []quota.HeldLease
	for _, item := range strings.Split(v, string(rune(holdSep))) {
		name, value, _ := strings.Cut(item, string(rune(holdValueSep)))
		out = append(out, quota.HeldLease{Policy: name, Value: value})
	}
	return out, nil
}

// NoteRequestID records the request id a counted check with an
// idempotency key was reserved under, for its repeats (RequestIDOf).
func (g *Gate) NoteRequestID(ctx context.Context, req quota.Request, requestID string) error {
	st, ok := g.store.(Settler)
	if !ok {
		return errNoSettler
	}
	return st.NoteRequestID(ctx, req.TenantID, req.IdempotencyKey, requestID)
}

// RequestIDOf is the request id of the first check of req's idempotency
// key: "" when none was noted (yet).
func (g *Gate) RequestIDOf(ctx context.Context, req quota.Request) (string, error) {
	st, ok := g.store.(Settler)
	if !ok {
		return "", errNoSettler
	}
	return st.RequestIDOf(ctx, req.TenantID, req.IdempotencyKey)
}

// ReleaseLeases ends the Redis leases of req's concurrency policies
// (req.Policies, under req.RequestID), as Release does for an answered
// metered request.
func (g *Gate) ReleaseLeases(ctx context.Context, req quota.Request) error {
	if err := g.store.ReleasePolicies(ctx, req); err != nil {
		return err
	}
	g.OnRoom(ctx, req.TenantID)
	return nil
}
