// Package locallimit holds Tollgate's production in-process limiters: the
// ones an API node decides with when Redis cannot (Limiter, for the tenants
// of fail-open tiers during an outage), and the per-key GCRA table that
// limits failed authentication attempts (Keyed). They keep their state in
// the node's memory, bounded, and return errors, never panic.
//
// The fail-open limiter decides with internal/limits, the limit algebra
// the admission scripts are held to: no arithmetic of its own.
package locallimit

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/limits"
	"github.com/tollgate/tollgate/internal/quota"
)

// Units, epoch, precision: those of internal/limits (µs since the Unix
// epoch, UTC; exact integers). Its periods are UTC calendar days and
// months, whatever the tenant's billing calendar (quota.Request.Calendar,
// which the admission script follows): its quotas start from zero during
// an outage anyway, and an outage that spans a tenant's local midnight but
// not UTC's (or the reverse) counts one day where Redis would count two.

// Limiter decides on requests in process, per tenant, over the four limits
// of quota.Limits and the spend cap: GCRA on requests, the token bucket on
// cost units, the daily and the monthly quota. Each tenant's state is a
// limits.State; a request's limits compile to a limits.List (kept per
// distinct limits, a bounded few). It keeps no idempotency records, no
// grants and no pending usage (the caller holds the usage it admits until
// Redis or the ledger records it: internal/admission), no meter quotas
// and no credit, and its quotas start from zero on this node.
//
// A Limiter is safe for concurrent use.
type Limiter struct {
	max int

	mu      sync.Mutex
	tenants map[string]*limits.State
	lists   map[listKey]*limits.List
	n       atomic.Int64 // len(tenants), read without the lock
}

// maxLists bounds the lists kept: one per distinct limits, overage and
// price (tiers with overrides), dropped whole past it.
const maxLists = 1024

// listKey is what a request's list is compiled from.
type listKey struct {
	rate, refill                               float64
	burst, capacity, daily, monthly, overCents int64
	hasRate, hasDaily, hasMonthly              bool
	hasCap, hasBurst, hasCapacity, hasRefill   bool
	overage                                    quota.Overage
	price                                      int64
}

func keyOf(req quota.Request) listKey {
	l := req.Limits
	k := listKey{overage: req.Overage, price: req.OveragePriceCentsPer1K}
	get := func(p *int64, v *int64, has *bool) {
		if p != nil {
			*v, *has = *p, true
		}
	}
	getf := func(p *float64, v *float64, has *bool) {
		if p != nil {
			*v, *has = *p, true
		}
	}
	getf(l.BurstRate, &k.rate, &k.hasRate)
	get(l.Burst, &k.burst, &k.hasBurst)
	getf(l.BucketRefillPerSec, &k.refill, &k.hasRefill)
	get(l.BucketCapacity, &k.capacity, &k.hasCapacity)
	get(l.DailyQuota, &k.daily, &k.hasDaily)
	get(l.MonthlyQuota, &k.monthly, &k.hasMonthly)
	get(l.MaxOverageCents, &k.overCents, &k.hasCap)
	return k
}

// NewLimiter returns a Limiter that keeps at most maxTenants tenants (at
// least 1). Past the bound it starts afresh rather than grow: memory stays
// bounded, and a tenant forgotten that way gets its burst and quotas again
// on this node, a bounded allowance.
func NewLimiter(maxTenants int) *Limiter {
	return &Limiter{max: max(1, maxTenants), tenants: map[string]*limits.State{}, lists: map[listKey]*limits.List{}}
}

// Len returns the number of tenants held. It takes no lock, so that a
// caller can skip Forget on its hot path when the limiter holds nobody.
func (l *Limiter) Len() int { return int(l.n.Load()) }

// Forget drops the tenant's state.
func (l *Limiter) Forget(tenantID string) {
	l.mu.Lock()
	if _, ok := l.tenants[tenantID]; ok {
		delete(l.tenants, tenantID)
		l.n.Add(-1)
	}
	l.mu.Unlock()
}

// check validates what Admit reads of req beside its limits (which
// limits.Compile validates). Every bound is one the Redis runner enforces
// too, so that no request this refuses would have been admitted there.
func check(req quota.Request, now time.Time) error {
	if err := req.Limits.Validate(); err != nil {
		return err
	}
	if req.Cost < 1 || req.Cost > quota.MaxQuantity {
		return quota.FieldError("cost", "must be an integer between 1 and %d", quota.MaxQuantity)
	}
	switch req.Overage {
	case quota.OverageBlock, quota.OverageBill, "":
	default:
		return quota.FieldError("overage", `must be "block" or "bill"`)
	}
	if req.TenantID == "" {
		return quota.FieldError("tenant_id", "must not be empty")
	}
	if us := now.UnixMicro(); us <= 0 || us > 1<<60 {
		// Past 2^60 us (year 38000) now plus a window could overflow.
		return quota.FieldError("now", "must be after 1970-01-01 and before the year 38000")
	}
	return nil
}

// Admit decides on req at now (req.Now is ignored): the decision
// lua/admit.lua would take on the same state, without an idempotency key
// (req.IdempotencyKey is ignored too). A dry run decides without consuming.
// It returns a CodeInvalid *quota.Error, and changes nothing, for a request
// it cannot decide: invalid limits, a cost out of range, an unknown overage
// policy, a time before 1970.
func (l *Limiter) Admit(req quota.Request, now time.Time) (quota.Decision, error) {
	if err := check(req, now); err != nil {
		return quota.Decision{}, err
	}
	k := keyOf(req)
	l.mu.Lock()
	defer l.mu.Unlock()
	list, ok := l.lists[k]
	if !ok {
		var err error
		list, err = limits.Compile(limits.Plan{Limits: req.Limits, Overage: req.Overage,
			OveragePriceCentsPer1K: req.OveragePriceCentsPer1K}, req.Meter)
		if err != nil {
			return quota.Decision{}, err
		}
		if len(l.lists) >= maxLists {
			clear(l.lists)
		}
		l.lists[k] = list
	}
	t, ok := l.tenants[req.TenantID]
	if !ok {
		if len(l.tenants) >= l.max {
			l.tenants = map[string]*limits.State{}
			l.n.Store(0)
		}
		t = &limits.State{}
		l.tenants[req.TenantID] = t
		l.n.Add(1)
	}
	mode := limits.Admit
	if req.DryRun {
		mode = limits.Dry
	}
	// (no meter: the caller holds the pending usage; no balance: no credit)
	d, err := list.Decide(t, limits.Request{Now: now.UnixMicro(), Mode: mode, Cost: req.Cost})
	if err != nil {
		return quota.Decision{}, err
	}
	return d.Quota(list), nil
}
