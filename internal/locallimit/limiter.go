// Package locallimit holds Tollgate's production in-process limiters: the
// ones an API node decides with when Redis cannot (Limiter, for the tenants
// of fail-open tiers during an outage), and the per-key GCRA table that
// limits failed authentication attempts (Keyed). They keep their state in
// the node's memory, bounded, and return errors, never panic.
//
// They are not ratelimit.Model: the model is the tests' reference of the
// admission script and assumes valid input; these take what production
// sends them.
package locallimit

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Units, epoch, precision: times are int64 microseconds since the Unix
// epoch, UTC; GCRA and the token bucket work on the whole-microsecond
// intervals of quota.IntervalMicros; quotas count cost units; periods are
// UTC calendar days and months, whatever the tenant's billing calendar
// (quota.Request.Calendar, which the admission script follows): its quotas
// start from zero during an outage anyway, and an outage that spans a
// tenant's local midnight but not UTC's (or the reverse) counts one day
// where Redis would count two. Every quantity is an exact integer: the
// only divisions are floor divisions, as in lua/admit.lua, so that a
// decision taken here is the one Redis would have taken from the same
// state.

const dayMicros = int64(24 * time.Hour / time.Microsecond)

// Limiter decides on requests in process, per tenant, over the four limits
// of quota.Limits: GCRA on requests, the token bucket on cost units, the
// daily and the monthly quota. It keeps no idempotency records, no grants
// and no pending usage (the caller holds the usage it admits until Redis
// or the ledger records it: internal/admission), and its quotas start from
// zero on this node.
//
// A Limiter is safe for concurrent use.
type Limiter struct {
	max int

	mu      sync.Mutex
	tenants map[string]*tenant
	n       atomic.Int64 // len(tenants), read without the lock
}

// tenant is a tenant's state, as the script keeps it in Redis.
type tenant struct {
	tat   int64 // GCRA theoretical arrival time, us
	full  int64 // time the token bucket is full again, us
	day   period
	month period
	// under are the burst limits tat and full were written under (zero:
	// none yet), for the fresh start of an upgrade (see admit)
	under burstLimits
}

// burstLimits are the GCRA's and the bucket's parameters, in params' units.
type burstLimits struct{ gcraT, burst, bucketU, capacity int64 }

// period is a quota period's usage. id is the day since the epoch or
// year*100+month; a period whose id is not the current one counts as empty.
type period struct {
	id, used int64
	over     int64 // overage units (the month's; the spend cap counts them)
}

func (p period) at(id int64) period {
	if p.id != id {
		return period{id: id}
	}
	return p
}

// NewLimiter returns a Limiter that keeps at most maxTenants tenants (at
// least 1). Past the bound it starts afresh rather than grow: memory stays
// bounded, and a tenant forgotten that way gets its burst and quotas again
// on this node, a bounded allowance.
func NewLimiter(maxTenants int) *Limiter {
	return &Limiter{max: max(1, maxTenants), tenants: map[string]*tenant{}}
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

// params are limits in integer form. A zero interval or a negative quota
// means unlimited.
type params struct {
	gcraT, burst      int64 // us per request, requests
	bucketU, capacity int64 // us per unit, units
	daily, monthly    int64 // units; -1 = unlimited
	ocap              int64 // spend cap, overage units a month; -1 = none
}

// check validates what Admit reads of req and converts its limits. Every
// bound is one the Redis runner enforces too, so that no request this
// refuses would have been admitted there.
func check(req quota.Request, now time.Time) (params, error) {
	if err := req.Limits.Validate(); err != nil {
		return params{}, err
	}
	if req.Cost < 1 || req.Cost > quota.MaxQuantity {
		return params{}, quota.FieldError("cost", "must be an integer between 1 and %d", quota.MaxQuantity)
	}
	switch req.Overage {
	case quota.OverageBlock, quota.OverageBill, "":
	default:
		return params{}, quota.FieldError("overage", `must be "block" or "bill"`)
	}
	if req.TenantID == "" {
		return params{}, quota.FieldError("tenant_id", "must not be empty")
	}
	if us := now.UnixMicro(); us <= 0 || us > 1<<60 {
		// Past 2^60 us (year 38000) now plus a window could overflow.
		return params{}, quota.FieldError("now", "must be after 1970-01-01 and before the year 38000")
	}
	p := params{daily: -1, monthly: -1,
		ocap: quota.SpendCapUnits(req.Limits.MaxOverageCents, req.Overage, req.OveragePriceCentsPer1K)}
	lim := req.Limits
	if lim.BurstRate != nil {
		p.gcraT, p.burst = quota.IntervalMicros(*lim.BurstRate), *lim.Burst
	}
	if lim.BucketCapacity != nil {
		p.bucketU, p.capacity = quota.IntervalMicros(*lim.BucketRefillPerSec), *lim.BucketCapacity
	}
	if lim.DailyQuota != nil {
		p.daily = *lim.DailyQuota
	}
	if lim.MonthlyQuota != nil {
		p.monthly = *lim.MonthlyQuota
	}
	return p, nil
}

// Admit decides on req at now (req.Now is ignored): the decision
// lua/admit.lua would take on the same state, without an idempotency key
// (req.IdempotencyKey is ignored too). A dry run decides without consuming.
// It returns a CodeInvalid *quota.Error, and changes nothing, for a request
// it cannot decide: invalid limits, a cost out of range, an unknown overage
// policy, a time before 1970.
func (l *Limiter) Admit(req quota.Request, now time.Time) (quota.Decision, error) {
	p, err := check(req, now)
	if err != nil {
		return quota.Decision{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.tenants[req.TenantID]
	if !ok {
		if len(l.tenants) >= l.max {
			l.tenants = map[string]*tenant{}
			l.n.Store(0)
		}
		t = &tenant{}
		l.tenants[req.TenantID] = t
		l.n.Add(1)
	}
	return t.admit(p, req.Cost, req.Overage == quota.OverageBill, req.DryRun, now.UnixMicro()), nil
}

// admit is lua/admit.lua's decision for one tenant, at now (us).
func (t *tenant) admit(p params, cost int64, bill, dry bool, now int64) quota.Decision {
	ok, retry := true, int64(0) // retry: us, -1 = never
	var violated []quota.LimitName
	refuse := func(name quota.LimitName, wait int64) {
		ok = false
		violated = append(violated, name)
		if retry != -1 && (wait < 0 || wait > retry) {
			retry = wait
		}
	}

	// A change of the burst limits (lua/admit.lua, "Limit changes"): a
	// limit at least as large in rate and burst as the one the state was
	// written under starts fresh; any other is clamped below.
	tat, full := t.tat, t.full
	newLim := burstLimits{p.gcraT, p.burst, p.bucketU, p.capacity}
	relim := (p.gcraT > 0 || p.bucketU > 0) && t.under != newLim
	if relim && t.under != (burstLimits{}) {
		u := t.under
		if p.gcraT > 0 && u.gcraT > 0 && p.gcraT <= u.gcraT && p.burst >= u.burst {
			tat = 0
		}
		if p.bucketU > 0 && u.bucketU > 0 && p.bucketU <= u.bucketU && p.capacity >= u.capacity {
			full = 0
		}
	}

	// GCRA: one emission interval T per request, burst B; the state is
	// clamped to the most indebted one the current limits allow, so that
	// lowering a limit never leaves a tenant waiting longer than it allows.
	var gtat, gnew int64
	if p.gcraT > 0 {
		gtat = min(max(tat, now), now+p.burst*p.gcraT)
		gnew = gtat + p.gcraT
		if gnew-now > p.burst*p.gcraT {
			refuse(quota.LimitBurst, gnew-p.burst*p.gcraT-now)
		}
	}

	// Token bucket: U per unit, capacity C; the state is when it is full.
	var bf, bnew int64
	if p.bucketU > 0 {
		bf = min(max(full, now), now+p.capacity*p.bucketU)
		if cost > p.capacity {
			refuse(quota.LimitBucket, -1)
		} else {
			bnew = bf + cost*p.bucketU
			if bnew-now > p.capacity*p.bucketU {
				refuse(quota.LimitBucket, bnew-p.capacity*p.bucketU-now)
			}
		}
	}

	dayID := floorDiv(now, dayMicros)
	dayNext := (dayID + 1) * dayMicros
	nowT := time.UnixMicro(now).UTC()
	monthStart := quota.MonthStart(nowT)
	monthID := int64(nowT.Year())*100 + int64(nowT.Month())
	monthNext := monthStart.AddDate(0, 1, 0).UnixMicro()

	d := t.day.at(dayID)
	if p.daily >= 0 && d.used+cost > p.daily {
		if cost > p.daily {
			refuse(quota.LimitDaily, -1)
		} else {
			refuse(quota.LimitDaily, dayNext-now)
		}
	}
	mo := t.month.at(monthID)
	var overage int64
	if p.monthly >= 0 && mo.used+cost > p.monthly {
		switch {
		case bill:
			overage = min(cost, mo.used+cost-p.monthly)
			if p.ocap >= 0 && mo.over+overage > p.ocap {
				if cost > p.monthly+p.ocap {
					refuse(quota.LimitSpendCap, -1)
				} else {
					refuse(quota.LimitSpendCap, monthNext-now)
				}
			}
		case cost > p.monthly:
			refuse(quota.LimitMonthly, -1)
		default:
			refuse(quota.LimitMonthly, monthNext-now)
		}
	}

	switch {
	case ok && !dry:
		t.tat, t.full = tat, full
		if p.gcraT > 0 {
			t.tat = gnew
		}
		if p.bucketU > 0 {
			t.full = bnew
		}
		if relim {
			t.under = newLim
		}
		if p.daily >= 0 {
			t.day = period{id: dayID, used: d.used + cost}
		}
		if p.monthly >= 0 {
			t.month = period{id: monthID, used: mo.used + cost, over: mo.over + overage}
		}
	case !ok && !dry:
		// A clamp is kept even on a refusal: it consumes nothing. The
		// state is then written whole, as read (a fresh start included),
		// with the limits it now stands for.
		gclamp, bclamp := p.gcraT > 0 && tat > gtat, p.bucketU > 0 && full > bf
		if gclamp || bclamp {
			t.tat, t.full = tat, full
			if gclamp {
				t.tat = gtat
			}
			if bclamp {
				t.full = bf
			}
			if relim {
				t.under = newLim
			}
		}
	}

	dec := quota.Decision{Allowed: ok, Violated: violated, Now: nowT}
	if ok {
		dec.OverageUnits = overage
	} else {
		dec.RetryAfter = time.Duration(retry) * time.Microsecond
	}
	// A decision that admits shows the limits after the request, a dry
	// run's included; a refusal shows them as they stand.
	var spent int64
	if ok {
		spent = cost
	} else {
		gnew, bnew = gtat, bf
	}
	lim := func(name quota.LimitName, limit, remaining, reset int64, window time.Duration) {
		dec.Limits = append(dec.Limits, quota.LimitState{Name: name, Limit: limit, Remaining: max(0, remaining),
			Reset: time.UnixMicro(reset).UTC(), Window: window})
	}
	if p.gcraT > 0 {
		lim(quota.LimitBurst, p.burst, floorDiv(p.burst*p.gcraT-(gnew-now), p.gcraT), gnew,
			time.Duration(p.burst*p.gcraT)*time.Microsecond)
	}
	if p.bucketU > 0 {
		lim(quota.LimitBucket, p.capacity, floorDiv(p.capacity*p.bucketU-(bnew-now), p.bucketU), bnew,
			time.Duration(p.capacity*p.bucketU)*time.Microsecond)
	}
	if p.daily >= 0 {
		lim(quota.LimitDaily, p.daily, p.daily-d.used-spent, dayNext, 24*time.Hour)
	}
	if p.monthly >= 0 {
		lim(quota.LimitMonthly, p.monthly, p.monthly-mo.used-spent, monthNext, monthStart.AddDate(0, 1, 0).Sub(monthStart))
	}
	return dec
}

// floorDiv is integer division rounding toward minus infinity, as the
// script's; b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
