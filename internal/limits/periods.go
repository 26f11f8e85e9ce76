package limits

import (
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Units, epoch, precision: integer µs since the Unix epoch, UTC. Every
// quantity is an int64 as the scripts hold it in a double: exact below
// 2^53 (quota.MaxQuantity and quota.MaxWindowMicros bound limits and
// windows so that sums stay below it); the only divisions are floor
// divisions, as the scripts' idiv.
const (
	hourUS = int64(time.Hour / time.Microsecond)
	dayUS  = 24 * hourUS
	// pendingUS is how long a tenant's hash lives after it counts pending
	// usage; idemUS how long an idempotency record decides.
	pendingUS = 14 * dayUS
	idemUS    = dayUS
)

// floorDiv is integer division rounding toward minus infinity; b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 { return -floorDiv(-a, b) }

// periods are the day and billing month of a time: their ids and the
// next ones' starts (µs).
type periods struct {
	day, dayNext, month, monthNext int64
	moved                          bool // the state's day, month or cached month end changed
	rolled                         bool // the state's month changed
	before                         bool // the month it held (earlier) became the month before (Before)
	calMode                        bool // a calendar that is not the default
}

// monthAt is the UTC month of now: its id and the next month's start.
func monthAt(now int64) (id, next int64) {
	t := time.UnixMicro(now).UTC()
	y, m, _ := t.Date()
	return int64(y)*100 + int64(m), time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
}

// at returns the periods of now in cal and moves v, a state's view, into
// them as the scripts do: a past day's or month's counters start from
// zero, a month that ends (earlier than now's) is kept as the month
// before. The default calendar keeps the month's end cached in the state
// (MonthEnd) and trusts it within 31 days before it: a clock set back
// less than that across the month's start is not seen (lua/state.lua's
// month_of); a calendar's ids are computed for each call, and it keeps no
// cached end (MonthEnd 0).
func at(cal quota.Calendar, v *Counters, now int64) periods {
	var p periods
	if cal.IsDefault() {
		p.day = floorDiv(now, dayUS)
		p.dayNext = (p.day + 1) * dayUS
	} else {
		t := time.UnixMicro(now)
		_, de := cal.Day(t)
		_, pe := cal.Period(t)
		p.day, p.dayNext, p.month, p.monthNext = cal.DayID(t), de.UnixMicro(), int64(cal.PeriodID(t)), pe.UnixMicro()
		p.calMode = true
	}
	if p.day != v.Day {
		v.Day, v.DayUsed, v.DayGrant, p.moved = p.day, 0, 0, true
	}
	if !p.calMode {
		if now < v.MonthEnd && now >= v.MonthEnd-31*dayUS && v.Month >= 0 {
			p.month, p.monthNext = v.Month, v.MonthEnd
			return p
		}
		p.month, p.monthNext = monthAt(now)
	}
	if p.month != v.Month {
		if v.Month >= 0 && v.Month < p.month {
			v.Before, p.before = MonthCount{v.Month, v.MonthUsed, v.MonthGrant, v.MonthOver}, true
		}
		v.Month, v.MonthUsed, v.MonthGrant, v.MonthOver = p.month, 0, 0, 0
		p.moved, p.rolled = true, true
	}
	end := p.monthNext
	if p.calMode {
		end = 0
	}
	if v.MonthEnd != end {
		p.moved = true
	}
	if !p.calMode {
		p.moved = true // (the default calendar's month was computed: its end is written)
	}
	v.MonthEnd = end
	return p
}

// need is when a state is empty again (lua/state.lua's state_need): the
// end of its day and month + 1 h, its TAT and FULL; dayNext and monthNext
// the ends the caller knows (0: the state's own), now the script's time.
func need(v *Counters, now, dayNext, monthNext int64) int64 {
	n := max(now+hourUS, v.TAT, v.Full)
	if dayNext == 0 {
		dayNext = (v.Day + 1) * dayUS
	}
	if v.Day >= 0 {
		n = max(n, dayNext+hourUS)
	}
	if v.Month >= 0 {
		if monthNext == 0 {
			monthNext = v.MonthEnd
		}
		if monthNext == 0 {
			if id, next := monthAt(now); id == v.Month {
				monthNext = next
			}
		}
		n = max(n, monthNext+hourUS)
	}
	return n
}

// expire moves v's expiry past n, a day beyond so that it moves about once
// a day, not on every call; a state new to Redis lives at least until it
// is empty again (need at now).
func expire(v *Counters, n, now, dayNext, monthNext int64) {
	if !v.Exists {
		n = max(n, need(v, now, dayNext, monthNext))
	}
	if n > v.Expiry {
		v.Expiry = ceilDiv(n+dayUS, hourUS) * hourUS
	}
}
