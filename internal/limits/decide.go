package limits

import (
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Mode is what Decide does with a request.
type Mode uint8

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

// claim is a quota entry's overage claim while a decision is made.
type claim struct {
	e             *Entry
	claim, billed int64 // units
	fresh         int64 // the billed claim of the cost alone in a fresh period
}

// Decide decides r on s, all or nothing, as lua/admit.lua does: every
// entry is checked, and only when all pass (Admit) is each committed;
// refusals commit nothing but a clamp of the burst limits and the count of
// the refusal. It changes s as the script changes Redis, and returns a
// *quota.PrepaidStaleError, changing nothing, when r's balance is of
// another period than now's.
func (l *List) Decide(s *State, r Request) (Decision, error) {
	now := r.Now
	var replay []int64
	if rec, ok := s.Idem[r.IdemKey]; ok && r.Mode == Admit && r.IdemKey != "" && rec.At+idemUS > now {
		if rec.Fingerprint != r.Fingerprint {
			return Decision{Now: now, Idem: quota.IdemMismatch}, nil
		}
		if !rec.Done && rec.Lease > now {
			return Decision{Now: now, Idem: quota.IdemInFlight}, nil
		}
		if rec.Done {
			replay = rec.Decision
		}
	}
	v := s.view()
	p := at(l.Calendar, &v, now)
	d := Decision{Allowed: true, Now: now}
	refuse := func(bit, wait int64) {
		d.Allowed, d.Mask = false, d.Mask|bit
		if d.Retry != -1 && (wait < 0 || wait > d.Retry) {
			d.Retry = wait
		}
	}
	relim := l.limitChange(&v)

	// the burst limits
	var gcra, bucket burstCheck
	var qbuf [4]claim
	quotas := qbuf[:0]
	var capE, creditE *Entry
	for i := range l.Entries {
		e := &l.Entries[i]
		switch e.Kind {
		case Rate:
			gcra = check(e, v.TAT, now, 1)
			if gcra.wait != 0 {
				refuse(BitBurst, gcra.wait)
			}
		case Bucket:
			bucket = check(e, v.Full, now, r.Cost)
			if bucket.wait != 0 {
				refuse(BitBucket, bucket.wait)
			}
		case Quota:
			quotas = append(quotas, claim{e: e})
		case Cap:
			capE = e
		case Credit:
			creditE = e
		}
	}

	// the quotas, and the attribution of their overage claims
	m := meterView(s, l.meterName(), p)
	claimed, freshClaimed := int64(0), int64(0)
	for i := range quotas {
		c := &quotas[i]
		if replay != nil {
			continue
		}
		used, limit := v.quotaRoom(c.e, m)
		if used+r.Cost <= limit {
			continue
		}
		if c.e.Price < 0 {
			wait := p.dayNext - now
			if c.e.Monthly {
				wait = p.monthNext - now
			}
			if r.Cost > c.e.Limit {
				wait = -1
			}
			refuse(quotaBit(c.e), wait)
			continue
		}
		c.claim = min(r.Cost, used+r.Cost-limit)
		c.billed = c.claim - min(c.claim, claimed)
		claimed = max(claimed, c.claim)
		fresh := max(0, r.Cost-c.e.Limit)
		c.fresh = fresh - min(fresh, freshClaimed)
		freshClaimed = max(freshClaimed, fresh)
	}

	// the money
	spentM := int64(0) // the meters' overage millicents of the month ('$')
	if s.Spent.Month == p.month {
		spentM = s.Spent.Millicents
	}
	add, fresh, tierBilled, meterBilled := int64(0), int64(0), int64(0), int64(0)
	for _, c := range quotas {
		add, fresh = add+c.billed*c.e.Price, fresh+c.fresh*c.e.Price
		if c.e.Meter == "" {
			tierBilled += c.billed
		} else {
			meterBilled += c.billed
		}
	}
	if capE != nil && claimed > 0 {
		// the month's overage: the tier's units at its price now, and the
		// meters' millicents, whatever plan billed them (today's
		// admit.lua counts the latter only while the tenant's plan has a
		// billing meter quota or credit: a plan change within the month
		// let the month bill past its cap)
		if v.MonthOver*capE.Price+spentM+add > capE.Limit {
			wait := p.monthNext - now
			if fresh > capE.Limit {
				wait = -1
			}
			refuse(BitSpendCap, wait)
		}
	}
	var draws Draws
	if pp := r.Prepaid; creditE != nil && pp != nil {
		if int64(pp.PeriodID) != p.month {
			return Decision{}, &quota.PrepaidStaleError{Now: time.UnixMicro(now).UTC()}
		}
		draws = s.Draws
		if draws.Month == 0 {
			draws = Draws{-1, 0, -1, 0}
		}
		if draws.Month != p.month {
			// a period's first draw: the tier's overage already admitted in
			// it (a move onto a prepaid tier) is drawn too, at its price now
			draws = Draws{p.month, v.MonthOver * creditE.Price, draws.Month, draws.Millicents}
		}
		lines := int64(max(pp.Lines, 1))
		held := draws.Millicents + 999*(lines-1)
		if pp.PrevID != 0 && draws.PrevMonth == int64(pp.PrevID) && draws.PrevMillicents > 0 {
			held += max(0, draws.PrevMillicents+999*lines-pp.ExpiringMillicents)
		}
		if add > 0 && replay == nil && held+add > pp.BalanceMillicents {
			d.Allowed, d.Mask, d.Retry = false, d.Mask|BitCredit, -1
		}
	}
	pv := r.Policies
	if pv.Refused {
		refuse(BitPolicy, pv.Wait)
	} else if pv.Degraded && d.Allowed {
		d.Allowed, d.Mask = false, d.Mask|BitDegraded
	}
	if !d.Allowed || r.Mode == Peek {
		add, tierBilled, meterBilled = 0, 0, 0
	}
	if d.Allowed {
		d.Retry = 0
	}
	d.Overage, d.MeterOverage = tierBilled, meterBilled
	consumed := d.Allowed && r.Mode != Peek
	d.report(&v, m, quotas, gcra, bucket, p, r.Cost, consumed)
	if r.Mode == Admit {
		if creditE == nil || r.Prepaid == nil {
			add = 0
		}
		c := commit{r: r, p: p, d: d, m: m, gcra: gcra, bucket: bucket, relim: relim,
			replay: replay != nil, cap: capE, spentM: spentM, draws: draws, add: add}
		c.apply(s, &v, l, quotas)
	}
	if d.Allowed && replay != nil {
		first := decodeFlat(replay)
		first.Items[ItemBurst], first.Items[ItemBucket] = d.Items[ItemBurst], d.Items[ItemBucket]
		first.Items[ItemMeterDaily], first.Items[ItemMeterMonthly] = d.Items[ItemMeterDaily], d.Items[ItemMeterMonthly]
		first.Now, first.Idem, first.MeterOverage = now, quota.IdemReplayed, 0
		return first, nil
	}
	if d.Allowed && r.Mode == Admit && r.IdemKey != "" {
		s.Idem = put(s.Idem, r.IdemKey, IdemRecord{Fingerprint: r.Fingerprint, Done: r.Lease == 0,
			Decision: d.Flat(false), Lease: now + r.Lease, At: now})
	}
	return d, nil
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
	e                *Entry
	start, next      int64
	wait             int64
	clamped, checked bool
}

// check is the virtual-scheduling check of GCRA (weight 1) and of the
// token bucket (weight cost): the state t is the time the limit is empty
// of debt again; each unit of weight adds Interval; the debt may reach
// Size*Interval.
func check(e *Entry, t, now, weight int64) burstCheck {
	window := e.Size * e.Interval
	c := burstCheck{e: e, start: max(t, now), checked: true}
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

// quotaRoom returns a quota entry's used units and limit (with the
// period's grants for the tier-wide ones) in the view v and the meter's m.
func (v *Counters) quotaRoom(e *Entry, m meterState) (used, limit int64) {
	switch {
	case e.Meter != "" && e.Monthly:
		return m.c.Used, e.Limit
	case e.Meter != "":
		return m.c.DayUsed, e.Limit
	case e.Monthly:
		return v.MonthUsed, e.Limit + v.MonthGrant
	}
	return v.DayUsed, e.Limit + v.DayGrant
}

func quotaBit(e *Entry) int64 {
	return [2][2]int64{{BitDaily, BitMonthly}, {BitMeterDaily, BitMeterMonthly}}[b2i(e.Meter != "")][b2i(e.Monthly)]
}

func quotaItem(e *Entry) int {
	return [2][2]int{{ItemDaily, ItemMonthly}, {ItemMeterDaily, ItemMeterMonthly}}[b2i(e.Meter != "")][b2i(e.Monthly)]
}

// report fills d's items.
func (d *Decision) report(v *Counters, m meterState, quotas []claim, g, b burstCheck, p periods, cost int64, consumed bool) {
	if g.checked {
		d.Items[ItemBurst] = g.item(d.Now, consumed)
	}
	if b.checked {
		d.Items[ItemBucket] = b.item(d.Now, consumed)
	}
	spent := int64(0)
	if consumed {
		spent = cost
	}
	for _, c := range quotas {
		used, limit := v.quotaRoom(c.e, m)
		reset := p.dayNext
		if c.e.Monthly {
			reset = p.monthNext
		}
		d.Items[quotaItem(c.e)] = Item{Active: true, Limit: limit, Remaining: max(0, limit-used-spent), Reset: reset}
	}
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

// Flat is d as lua/admit.lua answers it (ratelimit's result positions,
// Results): the head, the four limits' items, and, with meter, the
// meter's two items and its overage.
func (d Decision) Flat(meter bool) []int64 {
	out := make([]int64, 0, resultMeterLen)
	out = append(out, b2i(d.Allowed), d.Mask, d.Retry, d.Overage, d.Now, int64(d.Idem))
	n := ItemMeterDaily
	if meter {
		n = nItems
	}
	for _, it := range d.Items[:n] {
		out = append(out, b2i(it.Active), it.Limit, it.Remaining, it.Reset)
	}
	if meter {
		out = append(out, d.MeterOverage)
	}
	return out
}

// decodeFlat reads Flat's answer (22 or 31 values).
func decodeFlat(f []int64) Decision {
	d := Decision{Allowed: f[0] == 1, Mask: f[1], Retry: f[2], Overage: f[3], Now: f[4], Idem: quota.IdemOutcome(f[5])}
	for i := 0; i < nItems && resultHead+4*i+4 <= len(f); i++ {
		g := f[resultHead+4*i:]
		d.Items[i] = Item{Active: g[0] == 1, Limit: g[1], Remaining: g[2], Reset: g[3]}
	}
	if len(f) >= resultMeterLen {
		d.MeterOverage = f[resultMeterLen-1]
	}
	return d
}

// pendingField is the name of a pending counter of the hour of now.
func pendingField(hourStart int64, meter, kind string) string {
	return "p" + strconv.FormatInt(hourStart, 10) + "|" + meter + "|" + kind
}

// commit is what Decide writes of an admission (Admit mode).
type commit struct {
	r             Request
	p             periods
	d             Decision
	m             meterState
	gcra, bucket  burstCheck
	relim, replay bool
	cap           *Entry
	spentM, add   int64 // the month's '$' as read; the credit's draw
	draws         Draws
}

// apply writes c into s: the counters of the view v only when something
// of them changed (an admission, a clamp kept on a refusal, pending usage
// counted), then, whole, as the script's one HSET; the meter's field, the
// spend and the draws with an admission; the pending counters.
func (c *commit) apply(s *State, v *Counters, l *List, quotas []claim) {
	r, p, d := c.r, c.p, c.d
	now, ok, dirty, n := r.Now, d.Allowed, false, int64(0)
	if ok {
		for _, b := range [2]*burstCheck{&c.gcra, &c.bucket} {
			if b.checked {
				n, dirty = max(n, b.next), true
			}
		}
		v.TAT, v.Full = pick(c.gcra.checked, c.gcra.next, v.TAT), pick(c.bucket.checked, c.bucket.next, v.Full)
	} else {
		for _, b := range [2]*burstCheck{&c.gcra, &c.bucket} {
			if b.clamped {
				n, dirty = max(n, b.start), true
			}
		}
		v.TAT, v.Full = pick(c.gcra.clamped, c.gcra.start, v.TAT), pick(c.bucket.clamped, c.bucket.start, v.Full)
	}
	counted := ok && !c.replay
	var meterPrice int64
	hasMeter := false
	for _, q := range quotas {
		switch {
		case q.e.Meter != "":
			hasMeter = true
			if q.e.Monthly {
				meterPrice = q.e.Price
			}
		case !counted:
		case q.e.Monthly:
			v.MonthUsed, v.MonthOver = v.MonthUsed+r.Cost, v.MonthOver+d.Overage
			n, dirty = max(n, p.monthNext+hourUS), true
		default:
			v.DayUsed = v.DayUsed + r.Cost
			n, dirty = max(n, p.dayNext+hourUS), true
		}
	}
	if counted && hasMeter {
		mc := c.m.c
		mc.DayUsed, mc.Used, mc.Over = mc.DayUsed+r.Cost, mc.Used+r.Cost, mc.Over+d.MeterOverage
		s.Meters = put(s.Meters, c.m.meter, mc)
		if d.MeterOverage > 0 && c.cap != nil {
			if s.Spent.Month != 0 && s.Spent.Month < p.month {
				s.SpentBefore = s.Spent
			}
			s.Spent = Spend{p.month, c.spentM + d.MeterOverage*meterPrice}
		}
		if c.m.fresh && c.m.hasOld {
			s.MetersBefore = put(s.MetersBefore, c.m.meter, c.m.old)
		}
	}
	if counted && c.add > 0 {
		s.Draws = c.draws
		s.Draws.Millicents += c.add
	}
	hour := floorDiv(now, hourUS)
	if counted && r.Meter != "" {
		f := "p" + strconv.FormatInt(hour, 10) + "|" + r.Meter + "|"
		u := s.Usage[f]
		s.Usage = put(s.Usage, f, [2]int64{u[0] + r.Cost, u[1] + 1})
		n, dirty = max(n, now+pendingUS), true
	}
	if dirty {
		if c.relim {
			v.Under = l.burstLimits()
		}
		if p.rolled && s.Exists && v.Marks > 0 {
			s.Grants, v.Marks = nil, 0 // a new month: the past months' grant marks go
		}
		expire(v, n, now, p.dayNext, p.monthNext)
		v.Exists = true
		s.Counters = *v
	}
	if r.Meter == "" || !s.Exists && ok && c.replay {
		return
	}
	hs := hour * 3600
	if counted && d.Overage > 0 {
		add(&s.Counts, pendingField(hs, r.Meter, "o"), d.Overage)
	}
	if counted && d.MeterOverage > 0 {
		add(&s.Counts, pendingField(hs, r.Meter, "m"), d.MeterOverage)
	}
	switch {
	case !ok && d.Mask&BitDegraded != 0:
		add(&s.Counts, pendingField(hs, r.Meter, "d"), 1)
	case !ok:
		add(&s.Counts, pendingField(hs, r.Meter, "x"), 1)
	}
	if r.Policies.Shadowed {
		add(&s.Counts, pendingField(hs, r.Meter, "s"), 1)
	}
}

// pick is a if cond, else b.
func pick(cond bool, a, b int64) int64 {
	if cond {
		return a
	}
	return b
}
