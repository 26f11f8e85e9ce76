// Package admission puts one quota.Admitter in front of the Redis runner:
// every metered request of an API node goes through its Gate, which adds
//
//   - the deny cache: once a tenant is refused until T, its later requests of
//     the same or a higher cost are refused in-process until T, with no Redis
//     round trip; an admin change to the tenant clears the entry;
//   - the Redis outage policy of the tenant's tier: fail-open admits through
//     an in-process limiter at the tier's own limits (never unlimited) and
//     marks the decision Degraded; fail-closed answers CodeUnavailable;
//   - a short circuit breaker: after a Redis error the gate stops calling
//     Redis for a second, then tries again, so an outage costs one timeout per
//     second rather than one per request, and recovery is automatic.
//
// Being the one entry point is also what lets a later version coalesce the
// admissions of concurrent requests into one Redis pipeline without changing
// any caller.
package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/ratelimit"
)

// breakerPause is how long the gate leaves Redis alone after an error.
const breakerPause = time.Second

// maxLocal bounds the in-process limiters kept during an outage.
const maxLocal = 100_000

type denial struct {
	until    time.Time // local clock
	cost     int64
	decision quota.Decision
}

// Gate is the API node's Admitter. It is safe for concurrent use.
type Gate struct {
	redis quota.Admitter
	now   func() time.Time

	mu        sync.Mutex
	deny      map[string]denial
	local     map[string]*ratelimit.Model
	downUntil time.Time

	// OnRedisError is called on every Redis failure (metrics).
	OnRedisError func(error)
	// OnDenyHit is called when the deny cache answers (metrics).
	OnDenyHit func()
}

// New returns a Gate in front of the Redis admitter r.
func New(r quota.Admitter, now func() time.Time) *Gate {
	return &Gate{redis: r, now: now, deny: map[string]denial{}, local: map[string]*ratelimit.Model{},
		OnRedisError: func(error) {}, OnDenyHit: func() {}}
}

// Admit decides on req. It returns an error only when the decision cannot be
// taken: Redis failed and the tier fails closed (CodeUnavailable), the
// request is invalid (CodeInvalid), or the context ended.
func (g *Gate) Admit(ctx context.Context, req quota.Request) (quota.Decision, error) {
	now := g.now()
	if d, ok := g.denied(req, now); ok {
		g.OnDenyHit()
		return d, nil
	}
	g.mu.Lock()
	down := now.Before(g.downUntil)
	g.mu.Unlock()
	if !down {
		d, err := g.redis.Admit(ctx, req)
		if err == nil {
			g.recovered()
			if !d.Allowed && !req.DryRun {
				g.remember(req, d, now)
			}
			return d, nil
		}
		var qe *quota.Error
		if errors.As(err, &qe) || ctx.Err() != nil {
			return d, err
		}
		g.OnRedisError(err)
		g.mu.Lock()
		g.downUntil = now.Add(breakerPause)
		g.mu.Unlock()
	}
	if !req.FailOpen {
		return quota.Decision{}, &quota.Error{Code: quota.CodeUnavailable,
			Message: "the quota store is unavailable and this tier fails closed; retry shortly"}
	}
	return g.admitLocally(req, now)
}

// denied answers from the deny cache when req is at least as costly as a
// request refused until a time still to come. Idempotent requests skip it:
// their first decision may be stored in Redis.
func (g *Gate) denied(req quota.Request, now time.Time) (quota.Decision, bool) {
	if req.IdempotencyKey != "" {
		return quota.Decision{}, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.deny[req.TenantID]
	if !ok {
		return quota.Decision{}, false
	}
	if !now.Before(e.until) {
		delete(g.deny, req.TenantID)
		return quota.Decision{}, false
	}
	if req.Cost < e.cost {
		return quota.Decision{}, false
	}
	d := e.decision
	elapsed := now.Sub(e.until.Add(-e.decision.RetryAfter))
	d.RetryAfter -= elapsed
	d.Now = d.Now.Add(elapsed)
	return d, true
}

func (g *Gate) remember(req quota.Request, d quota.Decision, now time.Time) {
	if d.RetryAfter <= 0 {
		return // never passes: nothing to wait for, and nothing worth caching
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.deny) >= maxLocal {
		g.deny = map[string]denial{}
	}
	g.deny[req.TenantID] = denial{until: now.Add(d.RetryAfter), cost: req.Cost, decision: d}
}

// Forget clears what the gate holds for a tenant; the catalog calls it on
// every admin change to the tenant.
func (g *Gate) Forget(tenantID string) {
	g.mu.Lock()
	delete(g.deny, tenantID)
	delete(g.local, tenantID)
	g.mu.Unlock()
}

// recovered drops the outage's in-process limiters once Redis answers again.
func (g *Gate) recovered() {
	g.mu.Lock()
	if len(g.local) > 0 {
		g.local = map[string]*ratelimit.Model{}
	}
	g.mu.Unlock()
}

// admitLocally decides with the in-process reference model at the tenant's
// own limits and local time. Quotas start from zero on this node, so during
// an outage a tenant gets at most its quotas per node: a bounded, never an
// unlimited, allowance.
func (g *Gate) admitLocally(req quota.Request, now time.Time) (d quota.Decision, err error) {
	req.IdempotencyKey = "" // the local limiter keeps no replay store
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.local[req.TenantID]
	if !ok {
		if len(g.local) >= maxLocal {
			g.local = map[string]*ratelimit.Model{}
		}
		m = &ratelimit.Model{}
		g.local[req.TenantID] = m
	}
	defer func() {
		// The model panics on limits the runner would have refused; those
		// never reach here, but a bug must not take the node down.
		if r := recover(); r != nil {
			err = fmt.Errorf("admission: local limiter: %v", r)
		}
	}()
	d = m.Admit(req, now)
	m.Pending = nil // usage admitted in fail-open mode is not billed (see README)
	d.Degraded = true
	return d, nil
}
