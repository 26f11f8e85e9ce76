package admission

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// The usage of fail-open admissions. What the in-process limiter admits
// while Redis is away is served, so it is billed: the node holds it in
// memory, summed per tenant, meter, UTC hour and local day, until Redis
// takes it (Store.RecoverOutage: counted into the quotas and the pending
// usage the worker flushes, exactly once under a batch id), or, when Redis
// stays away for outageLedgerAfter (or the node shuts down), the ledger
// does (OutageLedger, exactly once under the same kind of id).
//
// Exactly once across both: a batch is sent again under the same id until
// one of them answers, and a batch whose send may have landed (any error
// but quota.ErrNotSent) is sent to that one only, never to the other. A
// batch that was not sent goes back into the rows, so that a refund or a
// settlement of a fail-open admission still nets against its units.
//
// The bound: at most maxOutageRows rows (and batches' rows) are held; past
// it, a fail-open admission that needs a new row is refused (unavailable,
// as a fail-closed tier), never served unbilled: OutageRefused counts
// those. A node that dies loses what it holds.

const (
	// maxOutageRows bounds the fail-open usage a node holds.
	maxOutageRows = 100_000
	// outageLedgerAfter is how long a batch waits for Redis before it is
	// written to the ledger directly (without overage and quota counters,
	// which only Redis can count).
	outageLedgerAfter = 5 * time.Minute
	// outageRecent is how long the overage recovered for a row is kept,
	// for a refund or settlement that arrives after it left the node.
	outageRecent = time.Hour
)

// OutageLedger writes fail-open usage to the ledger directly, exactly once
// under the batch's id; *billing.Ledger provides it. An error that wraps
// quota.ErrNotSent never reached Postgres.
type OutageLedger interface {
	RecordOutage(ctx context.Context, b quota.OutageBatch) error
}

type outageKey struct {
	tenant, meter string
	hour, day     int64 // the UTC hour's start, unix s; the tenant's local day id
}

type outageUsage struct {
	units, requests int64
	at              time.Time // an admission's time: its day and period are the row's
	first           time.Time // when the row was first held
}

// outagePath is where a batch may go: anywhere until a send may have
// landed, then only there.
type outagePath int8

const (
	pathAny outagePath = iota
	pathRedis
	pathLedger
)

type outageBatch struct {
	b      quota.OutageBatch
	keys   []outageKey
	usage  []outageUsage
	pinned outagePath
}

type recoveredOverage struct {
	tier, meter int64
	at          time.Time
}

// outageReservation is a fail-open admission of a settle route, which
// settles on this node (Gate.Reserve).
type outageReservation struct {
	req     quota.Request
	at      time.Time
	until   time.Time
	settled quota.SettleStatus // SettleUnknown until settled or refunded
}

// outage is the fail-open usage a Gate holds.
type outage struct {
	flushMu sync.Mutex // one flush at a time

	mu       sync.Mutex
	rows     map[outageKey]*outageUsage
	limits   map[string]quota.Request // the latest limits of each tenant held
	inflight map[string]*outageBatch  // by tenant: at most one batch each
	recent   map[outageKey]recoveredOverage
	reserved map[string]outageReservation // by request id
	held     int                          // rows, the batches' included

	heldRows, heldUnits atomic.Int64
	toRedis, toLedger   atomic.Int64 // units recorded
	refused             atomic.Int64 // admissions refused at the bound
	rowsAny             atomic.Bool  // false: nothing held (FlushOutage's fast path)
}

func newOutage() *outage {
	return &outage{rows: map[outageKey]*outageUsage{}, limits: map[string]quota.Request{},
		inflight: map[string]*outageBatch{}, recent: map[outageKey]recoveredOverage{},
		reserved: map[string]outageReservation{}}
}

// keyOf is the row of req's usage at t.
func outageKeyOf(req quota.Request, t time.Time) outageKey {
	return outageKey{tenant: req.TenantID, meter: req.Meter, hour: t.Unix() / 3600 * 3600, day: req.Calendar.DayID(t)}
}

// room reports whether k can be held: its row exists, or the bound leaves
// room for one more.
func (o *outage) room(k outageKey) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.rows[k]
	return ok || o.held < maxOutageRows
}

// add holds delta units (and requests) of req at t, now on the node's
// clock. A refund or settlement (requests 0) may make a row's units
// negative: they left in an earlier batch.
func (o *outage) add(req quota.Request, t, now time.Time, units, requests int64) {
	k := outageKeyOf(req, t)
	o.mu.Lock()
	defer o.mu.Unlock()
	u := o.rows[k]
	if u == nil {
		u = &outageUsage{at: t, first: now}
		o.rows[k] = u
		o.held++
		o.heldRows.Add(1)
	}
	u.units += units
	u.requests += requests
	o.heldUnits.Add(units)
	o.limits[req.TenantID] = quota.Request{TenantID: req.TenantID, Limits: req.Limits, Overage: req.Overage,
		OveragePriceCentsPer1K: req.OveragePriceCentsPer1K, MeterQuotas: req.MeterQuotas, Calendar: req.Calendar}
	o.rowsAny.Store(true)
}

// cut makes a batch of the rows of every tenant without one in flight.
func (o *outage) cut() []*outageBatch {
	o.mu.Lock()
	defer o.mu.Unlock()
	// Each tenant's rows in the order their usage was admitted (first
	// admission, then hour, meter and day): Redis counts a batch's rows in
	// order, as admission would have counted them, and which units are
	// overage (the tier's or a meter's) and which pass the spend cap
	// depends on it. The earliest go first when they are more than a batch.
	type held struct {
		k outageKey
		u *outageUsage
	}
	var rows []held
	for k, u := range o.rows {
		if _, busy := o.inflight[k.tenant]; !busy {
			rows = append(rows, held{k, u})
		}
	}
	slices.SortFunc(rows, func(a, b held) int {
		return cmp.Or(strings.Compare(a.k.tenant, b.k.tenant), a.u.at.Compare(b.u.at), a.u.first.Compare(b.u.first),
			cmp.Compare(a.k.hour, b.k.hour), strings.Compare(a.k.meter, b.k.meter), cmp.Compare(a.k.day, b.k.day))
	})
	byTenant := map[string]*outageBatch{}
	for _, h := range rows {
		k, u := h.k, h.u
		ob := byTenant[k.tenant]
		if ob == nil {
			ob = &outageBatch{b: quota.OutageBatch{ID: newBatchID(), Request: o.limits[k.tenant]}}
			byTenant[k.tenant] = ob
		}
		if len(ob.keys) >= quota.MaxOutageRows {
			continue // the next batch's
		}
		delete(o.rows, k)
		if u.units == 0 && u.requests == 0 {
			o.held--
			o.heldRows.Add(-1)
			continue
		}
		row := quota.OutageRow{Meter: k.meter, Hour: time.Unix(k.hour, 0).UTC(), At: u.at, Units: u.units, Requests: u.requests}
		if u.units < 0 {
			// the overage recovered for the row, given back as its last
			// units (the meter's first: a unit past both quotas is the
			// meter's), never more than its units: lua/adjust.lua's
			// adjust_give_back, which outage.lua applies in Redis too
			rec := o.recent[k]
			row.MeterOverage = min(rec.meter, -u.units)
			row.Overage = min(rec.tier, -u.units-row.MeterOverage)
		}
		ob.b.Rows = append(ob.b.Rows, row)
		ob.keys = append(ob.keys, k)
		ob.usage = append(ob.usage, *u)
	}
	out := make([]*outageBatch, 0, len(byTenant))
	for tenant, ob := range byTenant {
		if len(ob.keys) == 0 {
			continue
		}
		o.inflight[tenant] = ob
		out = append(out, ob)
	}
	for tenant := range o.inflight {
		if ob := o.inflight[tenant]; ob.pinned != pathAny && byTenant[tenant] == nil {
			out = append(out, ob) // sent before, to be sent again
		}
	}
	return out
}

// done forgets a batch recorded by Redis (redis true) or the ledger,
// keeping what Redis counted of its rows' overage for later give-backs.
func (o *outage) done(ob *outageBatch, redis bool, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.inflight, ob.b.Request.TenantID)
	var units int64
	for i, k := range ob.keys {
		row := ob.b.Rows[i]
		units += row.Units
		if !redis && row.Units >= 0 {
			continue // the ledger counts no overage
		}
		rec := o.recent[k]
		if redis {
			// what Redis counted, given back negative
			rec.tier, rec.meter = rec.tier+row.Overage, rec.meter+row.MeterOverage
		} else {
			// what the row asked the ledger to give back
			rec.tier, rec.meter = rec.tier-row.Overage, rec.meter-row.MeterOverage
		}
		rec.at = now
		if rec.tier > 0 || rec.meter > 0 {
			o.recent[k] = rec
		} else {
			delete(o.recent, k)
		}
	}
	o.held -= len(ob.keys)
	o.heldRows.Add(-int64(len(ob.keys)))
	o.heldUnits.Add(-units)
	if redis {
		o.toRedis.Add(units)
	} else {
		o.toLedger.Add(units)
	}
	o.forgetIdle(now)
}

// unsent puts the rows of a batch that was not sent back, where refunds
// and settlements net against them; the next cut makes a new batch.
func (o *outage) unsent(ob *outageBatch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.inflight, ob.b.Request.TenantID)
	for i, k := range ob.keys {
		u, back := o.rows[k], ob.usage[i]
		if u == nil {
			o.rows[k] = &back
			continue
		}
		// a row held since the cut: one row again
		u.units += back.units
		u.requests += back.requests
		if back.first.Before(u.first) {
			u.first, u.at = back.first, back.at
		}
		o.held--
		o.heldRows.Add(-1)
	}
}

// forgetIdle drops what no row needs any more: the limits of tenants
// without rows or batches, recovered overage older than outageRecent,
// reservations past their window.
func (o *outage) forgetIdle(now time.Time) {
	switch {
	case len(o.rows) == 0 && len(o.inflight) == 0:
		clear(o.limits)
		o.rowsAny.Store(false)
	case len(o.limits) > len(o.rows)+len(o.inflight):
		// tenants without rows or a batch go once they outnumber the
		// rows: the limits held stay bounded by the rows
		keep := make(map[string]quota.Request, len(o.inflight))
		for k := range o.rows {
			keep[k.tenant] = o.limits[k.tenant]
		}
		for tenant := range o.inflight {
			keep[tenant] = o.limits[tenant]
		}
		o.limits = keep
	}
	if len(o.recent) > maxOutageRows {
		clear(o.recent) // later give-backs give back units only
	}
	for k, rec := range o.recent {
		if now.Sub(rec.at) > outageRecent {
			delete(o.recent, k)
		}
	}
	for id, r := range o.reserved {
		if !now.Before(r.until) {
			delete(o.reserved, id)
		}
	}
}

func newBatchID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on the supported platforms
	return "outage-" + hex.EncodeToString(b[:])
}

// OutagePending returns the fail-open usage this node holds, not yet
// recorded by Redis or the ledger: its rows (tenant, meter, hour) and
// units.
func (g *Gate) OutagePending() (rows, units int64) {
	return g.outage.heldRows.Load(), g.outage.heldUnits.Load()
}

// OutageRecorded returns the fail-open units this node had recorded since
// it started: by Redis, and by the ledger directly.
func (g *Gate) OutageRecorded() (redis, ledger int64) {
	return g.outage.toRedis.Load(), g.outage.toLedger.Load()
}

// OutageRefused returns how many fail-open admissions this node refused
// because it held as much fail-open usage as it may.
func (g *Gate) OutageRefused() int64 { return g.outage.refused.Load() }

// FlushOutage sends the fail-open usage the node holds: each tenant's rows
// as one batch to Redis when its shard answers and has not lost its data
// since (the worker restores the quota counters first: Store.EpochLost),
// else, once the batch has waited outageLedgerAfter, or when final (the
// node shuts down), to the ledger. Report calls it about once a second. A
// batch not sent waits for the next call; the errors returned are of sends
// that may have landed, which go again to the same store under the same id.
func (g *Gate) FlushOutage(ctx context.Context, final bool) error {
	o := g.outage
	if !o.rowsAny.Load() {
		return nil
	}
	o.flushMu.Lock()
	defer o.flushMu.Unlock()
	now := g.now()
	batches := o.cut()
	// At shutdown Redis gets half the time left, the ledger the rest.
	rctx := ctx
	if dl, ok := ctx.Deadline(); ok && final && g.Ledger != nil {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
		defer cancel()
	}
	epoch := 0 // 0 unknown, 1 intact, -1 lost or unknown after an error
	var errs []error
	for _, ob := range batches {
		sent, err := g.sendOutage(ctx, rctx, ob, now, final, &epoch)
		if err != nil {
			errs = append(errs, err)
		}
		if !sent && ob.pinned == pathAny {
			o.unsent(ob)
		}
	}
	o.mu.Lock()
	o.forgetIdle(now)
	o.mu.Unlock()
	if len(errs) > 0 {
		return fmt.Errorf("admission: fail-open usage: %w", errors.Join(errs...))
	}
	return nil
}

// sendOutage sends one batch where it may go, to Redis under rctx, to the
// ledger under ctx; sent reports whether a store recorded it. A send that
// may have landed pins the batch to its store.
func (g *Gate) sendOutage(ctx, rctx context.Context, ob *outageBatch, now time.Time, final bool, epoch *int) (sent bool, err error) {
	tenant := ob.b.Request.TenantID
	if ob.pinned != pathLedger && g.redisReady(rctx, tenant, now, epoch) {
		err := g.store.RecoverOutage(rctx, &ob.b)
		switch {
		case err == nil:
			g.outage.done(ob, true, now)
			if g.nBreakers.Load() > 0 {
				g.closeBreaker(g.store.Shard(tenant)) // it answers
			}
			return true, nil
		case quota.ErrorCode(err) == quota.CodeInvalid:
			// a batch Redis can never take (a bug of the node's): the
			// ledger may; it was not applied
		case !errors.Is(err, quota.ErrNotSent):
			ob.pinned = pathRedis
			return false, err
		}
	}
	if ob.pinned == pathRedis || g.Ledger == nil {
		return false, nil
	}
	oldest := now
	for _, u := range ob.usage {
		if u.first.Before(oldest) {
			oldest = u.first
		}
	}
	if ob.pinned != pathLedger && !final && now.Sub(oldest) < outageLedgerAfter {
		return false, nil
	}
	if err := g.Ledger.RecordOutage(ctx, ob.b); err != nil {
		if !errors.Is(err, quota.ErrNotSent) {
			ob.pinned = pathLedger
		}
		return false, err
	}
	g.outage.done(ob, false, now)
	return true, nil
}

// redisReady reports whether the tenant's shard may take outage usage
// now: its breaker is closed, and Redis has not lost data the worker has
// not restored yet (asked once per flush, in *epoch).
func (g *Gate) redisReady(ctx context.Context, tenant string, now time.Time, epoch *int) bool {
	if g.nBreakers.Load() > 0 && g.open(g.store.Shard(tenant), now) {
		return false
	}
	if *epoch == 0 {
		*epoch = -1
		if lost, err := g.store.EpochLost(ctx); err == nil && !lost {
			*epoch = 1
		}
	}
	return *epoch == 1
}

// reserveLocal keeps a fail-open admission of a settle route for Settle on
// this node, for quota.SettleWindow.
func (o *outage) reserveLocal(id string, req quota.Request, d quota.Decision, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.reserved) >= maxLocal {
		o.forgetIdle(now)
		if len(o.reserved) >= maxLocal {
			return // the route cost stands
		}
	}
	o.reserved[id] = outageReservation{req: req, at: d.Now, until: now.Add(quota.SettleWindow)}
}

// settleLocal settles (or, refund, refunds) the local reservation under
// id of tenantID: found reports whether there is one; already whether it
// was settled (SettleAlready) or refunded (SettleRefunded) before, else
// SettleUnknown (the first settle keeps it, marked, until its window
// ends).
func (o *outage) settleLocal(id, tenantID string, now time.Time, refund bool) (r outageReservation, found bool, already quota.SettleStatus) {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, ok := o.reserved[id]
	if !ok || !now.Before(r.until) || r.req.TenantID != tenantID {
		return outageReservation{}, false, quota.SettleUnknown
	}
	if r.settled != quota.SettleUnknown {
		return r, true, r.settled
	}
	r.settled = quota.SettleAlready
	if refund {
		r.settled = quota.SettleRefunded
	}
	o.reserved[id] = r
	return r, true, quota.SettleUnknown
}
