package limits

import (
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Mode is what Decide does with a request.
type Mode uint8

// The modes of Decide.
const (
	Admit Mode = iota // decide and, when admitted, consume and count
	Dry               // decide, write nothing
	Peek              // report the limits as they stand (cost 1, nothing written)
)

// Request is one decision's dynamic inputs: what is not in the list.
type Request struct {
	Now  int64 // µs
	Mode Mode
	Cost int64 // units, 1..quota.MaxQuantity
	// Meter names the pending usage counted (fields p<hour>|<meter>|);
	// "" counts none (an in-process limiter keeps no pending usage).
	Meter string
	// IdemKey is an idempotency key's hash ("" none; Admit only), with the
	// request's fingerprint and how long it may stay in flight (µs).
	IdemKey, Fingerprint string
	Lease                int64
	// Prepaid is the balance a Credit entry draws on.
	Prepaid *quota.Prepaid
	// Policies is what the policies decided (their reference is
	// internal/policyalg; they are decided with the list, all or nothing).
	Policies PolicyVerdict
}

// PolicyVerdict is the policies' part of a decision: an enforced one
// refused (waiting Wait µs, -1 never), a degrade one refused (the request
// is degraded when nothing else refuses), a shadow one refused (counted
// only).
type PolicyVerdict struct {
	Refused, Degraded, Shadowed bool
	Wait                        int64
}

// Refusal bits of Decision.Mask (lua/admit.lua's violated bitmask).
const (
	BitBurst        = 1
	BitBucket       = 2
	BitDaily        = 4
	BitMonthly      = 8
	BitPolicy       = 16
	BitDegraded     = 32
	BitSpendCap     = 64
	BitMeterDaily   = 128
	BitMeterMonthly = 256
	BitCredit       = 512
)

// Item is one limit's report: its size, the room left, and when it is
// full again or its period ends (µs).
type Item struct {
	Active                  bool
	Limit, Remaining, Reset int64
}

// Items of a Decision, in the order of the headers.
const (
	ItemBurst = iota
	ItemBucket
	ItemDaily
	ItemMonthly
	ItemMeterDaily
	ItemMeterMonthly
	nItems
)

// Decision is Decide's answer. After an admission the items describe the
// state after it; after a refusal, a dry run's refusal or a peek, as it is.
type Decision struct {
	Allowed bool
	Mask    int64 // the refusing limits' bits
	Retry   int64 // µs until the request would pass; -1 never; 0 when allowed
	// Overage and MeterOverage are the units billed past the tier-wide
	// monthly quota and past the meter's.
	Overage, MeterOverage int64
	Now                   int64
	Idem                  quota.IdemOutcome
	Items                 [nItems]Item
}

// decision is one Decide call at work: the state's counters moved to
// now's periods (v, the meter's m), the checks of the entries, and the
// answer taking shape.
type decision struct {
	l      *List
	s      *State
	r      Request
	v      Counters
	p      periods
	m      meterState
	d      Decision
	replay []int64 // the stored decision a replay answers
	relim  bool    // the burst limits changed
	burst  [2]burstCheck
	quotas [4]claim // (Compile makes at most four: the tier's and the meter's day and month)
	nq     int
	cap    *Entry
	spentM int64 // the meters' overage millicents of the month ('$'), as read
	// billed is the millicents the claims bill; claimed the widest claim
	// (units); fresh the millicents the cost alone would bill in a fresh
	// month, freshClaimed its widest claim
	billed, claimed, fresh, freshClaimed int64
	credit                               *Entry
	draws                                Draws
}

// claim is a quota entry's overage claim: the units of the request past
// its limit, those it bills (less what entries before it claimed), and
// those the cost alone would bill in a fresh period.
type claim struct {
	e                    *Entry
	claim, billed, fresh int64
}

// Decide decides r on s, all or nothing, as lua/admit.lua does: every
// entry is checked, in the list's order, and only when all pass (Admit)
// is each committed; a refusal commits nothing but a clamp of the burst
// limits and the count of the refusal. It changes s as the script changes
// Redis, and returns a *quota.PrepaidStaleError, changing nothing, when
// r's balance is of another period than now's.
func (l *List) Decide(s *State, r Request) (Decision, error) {
	x := decision{l: l, s: s, r: r, d: Decision{Allowed: true, Now: r.Now}}
	if rec, ok := s.Idem[r.IdemKey]; ok && r.Mode == Admit && r.IdemKey != "" && rec.At+idemUS > r.Now {
		switch {
		case rec.Fingerprint != r.Fingerprint:
			return Decision{Now: r.Now, Idem: quota.IdemMismatch}, nil
		case !rec.Done && rec.Lease > r.Now:
			return Decision{Now: r.Now, Idem: quota.IdemInFlight}, nil
		case rec.Done:
			x.replay = rec.Decision
		}
	}
	x.v = s.view()
	x.p = at(l.Calendar, &x.v, r.Now)
	x.relim = l.limitChange(&x.v)
	x.m = meterView(s, l.meterName(), x.p)
	if s.Spent.Month == x.p.month {
		x.spentM = s.Spent.Millicents
	}
	for i := range l.Entries {
		switch e := &l.Entries[i]; e.Kind {
		case Rate:
			x.checkBurst(0, e, x.v.TAT, 1, BitBurst)
		case Bucket:
			x.checkBurst(1, e, x.v.Full, r.Cost, BitBucket)
		case Quota:
			x.checkQuota(e)
		case Cap:
			x.checkCap(e)
		case Credit:
			if err := x.checkCredit(e); err != nil {
				return Decision{}, err
			}
		}
	}
	if pv := r.Policies; pv.Refused {
		x.refuse(BitPolicy, pv.Wait)
	} else if pv.Degraded && x.d.Allowed {
		x.d.Allowed, x.d.Mask = false, x.d.Mask|BitDegraded
	}
	x.settle()
	if r.Mode == Admit {
		x.commit()
	}
	return x.answer(), nil
}

// refuse records a limit's refusal: the longest wait wins, and never (-1)
// over any.
func (x *decision) refuse(bit, wait int64) {
	x.d.Allowed, x.d.Mask = false, x.d.Mask|bit
	if x.d.Retry != -1 && (wait < 0 || wait > x.d.Retry) {
		x.d.Retry = wait
	}
}

func (x *decision) checkBurst(i int, e *Entry, t, weight, bit int64) {
	x.burst[i] = check(e, t, x.r.Now, weight)
	if w := x.burst[i].wait; w != 0 {
		x.refuse(bit, w)
	}
}

// checkQuota checks a quota entry (none on a replay, which counts no
// quota): past its limit it refuses (retry at the period's end; never
// when the cost passes the quota alone) or claims overage.
func (x *decision) checkQuota(e *Entry) {
	c := &x.quotas[x.nq]
	*c, x.nq = claim{e: e}, x.nq+1
	used, limit := x.room(e)
	if e.Price >= 0 {
		// (a fresh period has no grant: the cost alone may claim where
		// the request does not)
		fresh := max(0, x.r.Cost-e.Limit)
		c.fresh = fresh - min(fresh, x.freshClaimed)
		x.freshClaimed = max(x.freshClaimed, fresh)
		x.fresh += c.fresh * e.Price
	}
	if x.replay != nil || used+x.r.Cost <= limit {
		return
	}
	if e.Price < 0 {
		wait := x.p.dayNext - x.r.Now
		if e.Monthly {
			wait = x.p.monthNext - x.r.Now
		}
		if x.r.Cost > e.Limit {
			wait = -1
		}
		x.refuse(quotaBit(e), wait)
		return
	}
	c.claim = min(x.r.Cost, used+x.r.Cost-limit)
	c.billed = c.claim - min(c.claim, x.claimed)
	x.claimed = max(x.claimed, c.claim)
	x.billed += c.billed * e.Price
}

// checkCap checks the spend cap against the month's overage: the tier's
// units at its price now and the meters' millicents, whatever plan billed
// them (today's admit.lua counts the latter only while the plan has a
// billing meter quota, the meter's quota or credit: a plan change within
// the month let it bill past its cap), with what the request bills.
func (x *decision) checkCap(e *Entry) {
	x.cap = e
	if x.claimed > 0 && x.v.MonthOver*e.Price+x.spentM+x.billed > e.Limit {
		wait := x.p.monthNext - x.r.Now
		if x.fresh > e.Limit {
			wait = -1
		}
		x.refuse(BitSpendCap, wait)
	}
}

// checkCredit checks a prepaid tenant's balance against the period's
// draws (and the previous period's, while its invoice is open, past what
// it may draw), 999 millicents held back per invoice line past the first
// that may round up, and what the request bills: without credit for it,
// it is refused for good (no wait brings credit back).
func (x *decision) checkCredit(e *Entry) error {
	pp := x.r.Prepaid
	if pp == nil {
		return nil
	}
	if int64(pp.PeriodID) != x.p.month {
		return &quota.PrepaidStaleError{Now: time.UnixMicro(x.r.Now).UTC()}
	}
	x.credit, x.draws = e, x.s.Draws
	if x.draws.Month == 0 {
		x.draws = Draws{-1, 0, -1, 0}
	}
	if x.draws.Month != x.p.month {
		// a period's first draw: the tier's overage already admitted in it
		// (a move onto a prepaid tier) is drawn too, at its price now
		x.draws = Draws{x.p.month, x.v.MonthOver * e.Price, x.draws.Month, x.draws.Millicents}
	}
	lines := int64(max(pp.Lines, 1))
	held := x.draws.Millicents + 999*(lines-1)
	if pp.PrevID != 0 && x.draws.PrevMonth == int64(pp.PrevID) && x.draws.PrevMillicents > 0 {
		held += max(0, x.draws.PrevMillicents+999*lines-pp.ExpiringMillicents)
	}
	if x.billed > 0 && x.replay == nil && held+x.billed > pp.BalanceMillicents {
		x.d.Allowed, x.d.Mask, x.d.Retry = false, x.d.Mask|BitCredit, -1
	}
	return nil
}

// settle fixes the answer's overage (none when refused or peeking) and
// reports every limit: after an admission as it leaves them, else as
// they stand.
func (x *decision) settle() {
	d := &x.d
	consumed := d.Allowed && x.r.Mode != Peek
	if !consumed {
		x.billed = 0
	}
	if d.Allowed {
		d.Retry = 0
	}
	spent := int64(0)
	if consumed {
		spent = x.r.Cost
	}
	for i, b := range x.burst {
		if b.e != nil {
			d.Items[i] = b.item(x.r.Now, consumed)
		}
	}
	for _, c := range x.quotas[:x.nq] {
		if consumed && c.e.Meter == "" {
			d.Overage += c.billed
		} else if consumed {
			d.MeterOverage += c.billed
		}
		used, limit := x.room(c.e)
		reset := x.p.dayNext
		if c.e.Monthly {
			reset = x.p.monthNext
		}
		d.Items[quotaItem(c.e)] = Item{Active: true, Limit: limit, Remaining: max(0, limit-used-spent), Reset: reset}
	}
}

// answer is the decision, or for a replay the stored one with the burst
// limits and the meter's items of now; a first request with a key leaves
// its record.
func (x *decision) answer() Decision {
	d := x.d
	if d.Allowed && x.replay != nil {
		first := decodeFlat(x.replay)
		first.Items[ItemBurst], first.Items[ItemBucket] = d.Items[ItemBurst], d.Items[ItemBucket]
		first.Items[ItemMeterDaily], first.Items[ItemMeterMonthly] = d.Items[ItemMeterDaily], d.Items[ItemMeterMonthly]
		first.Now, first.Idem = d.Now, quota.IdemReplayed
		return first
	}
	if r := x.r; d.Allowed && r.Mode == Admit && r.IdemKey != "" {
		x.s.Idem = put(x.s.Idem, r.IdemKey, IdemRecord{Fingerprint: r.Fingerprint, Done: r.Lease == 0,
			Decision: d.Flat(false), Lease: r.Now + r.Lease, At: r.Now})
	}
	return d
}

// room returns a quota entry's used units and limit (with the period's
// grants for the tier-wide ones).
func (x *decision) room(e *Entry) (used, limit int64) {
	switch {
	case e.Meter != "" && e.Monthly:
		return x.m.c.Used, e.Limit
	case e.Meter != "":
		return x.m.c.DayUsed, e.Limit
	case e.Monthly:
		return x.v.MonthUsed, e.Limit + x.v.MonthGrant
	}
	return x.v.DayUsed, e.Limit + x.v.DayGrant
}

func quotaBit(e *Entry) int64 {
	return [2][2]int64{{BitDaily, BitMonthly}, {BitMeterDaily, BitMeterMonthly}}[b2i(e.Meter != "")][b2i(e.Monthly)]
}

func quotaItem(e *Entry) int {
	return [2][2]int{{ItemDaily, ItemMonthly}, {ItemMeterDaily, ItemMeterMonthly}}[b2i(e.Meter != "")][b2i(e.Monthly)]
}

// Report returns the limits of l as they stand on s at now: the items of
// a peek, whose Allowed says whether one more unit fits every limit.
func (l *List) Report(s *State, now int64) Decision {
	d, _ := l.Decide(s, Request{Now: now, Mode: Peek, Cost: 1})
	return d
}

// limitChange compares the burst limits of l with those v was written
// under (lua/admit.lua, "Limit changes"): a limit at least as large in
// rate and in burst as before starts fresh (no debt carried); any other
// change keeps the state, which the checks clamp to the most indebted one
// the current limits allow. It reports whether they changed.
func (l *List) limitChange(v *Counters) bool {
	g, b := l.find(Rate, false, false), l.find(Bucket, false, false)
	var buf [80]byte
	if g == nil && b == nil || string(l.burstLimitsTo(buf[:0])) == v.Under {
		return false
	}
	old, err := parseInts(v.Under, 4)
	if err == nil && !strings.Contains(v.Under, "-") {
		if g != nil && old[0] > 0 && g.Interval <= old[0] && g.Size >= old[1] {
			v.TAT = 0
		}
		if b != nil && old[2] > 0 && b.Interval <= old[2] && b.Size >= old[3] {
			v.Full = 0
		}
	}
	return true
}

// burstLimits is the field L of l's burst limits, "T,B,U,C" (0 for a
// limit l has not).
func (l *List) burstLimits() string { return string(l.burstLimitsTo(nil)) }

func (l *List) burstLimitsTo(b []byte) []byte {
	var lim [4]int64
	if g := l.find(Rate, false, false); g != nil {
		lim[0], lim[1] = g.Interval, g.Size
	}
	if k := l.find(Bucket, false, false); k != nil {
		lim[2], lim[3] = k.Interval, k.Size
	}
	for i, n := range lim {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, n, 10)
	}
	return b
}

// burstCheck is a Rate or Bucket entry's check: the state's time (TAT or
// FULL) clamped to the most indebted one the limits allow, the time after
// the request, and the wait (0: it passes; -1: never).
type burstCheck struct {
	e           *Entry
	start, next int64
	wait        int64
	clamped     bool
}

// check is the virtual-scheduling check of GCRA (weight 1) and of the
// token bucket (weight cost): the state t is the time the limit is empty
// of debt again; each unit of weight adds Interval; the debt may reach
// Size*Interval.
func check(e *Entry, t, now, weight int64) burstCheck {
	window := e.Size * e.Interval
	c := burstCheck{e: e, start: max(t, now)}
	if c.start > now+window {
		c.start, c.clamped = now+window, true
	}
	if weight > e.Size {
		c.wait = -1
		return c
	}
	c.next = c.start + weight*e.Interval
	if c.next-now > window {
		c.wait = c.next - window - now
	}
	return c
}

// item reports a burst limit at t, its state after (or before) the request.
func (c burstCheck) item(now int64, consumed bool) Item {
	t := c.start
	if consumed {
		t = c.next
	}
	w := c.e.Size * c.e.Interval
	return Item{Active: true, Limit: c.e.Size, Remaining: max(0, floorDiv(w-(t-now), c.e.Interval)), Reset: t}
}

// meterState is a meter quota's field as an admission reads it: moved to
// now's day and month (fresh: its month changed; before: the month it
// held, kept as <meter>|w).
type meterState struct {
	meter         string
	c             MeterCount
	fresh, hasOld bool
	old           MeterMonth
}

func meterView(s *State, meter string, p periods) meterState {
	m := meterState{meter: meter, c: MeterCount{-1, 0, -1, 0, 0}}
	if c, ok := s.Meters[meter]; ok && meter != "" {
		m.c = c
	}
	if m.c.Day != p.day {
		m.c.Day, m.c.DayUsed = p.day, 0
	}
	if m.fresh = m.c.Month != p.month; m.fresh {
		if m.c.Month >= 0 && m.c.Month < p.month {
			m.old, m.hasOld = MeterMonth{m.c.Month, m.c.Used, m.c.Over}, true
		}
		m.c.Month, m.c.Used, m.c.Over = p.month, 0, 0
	}
	return m
}
