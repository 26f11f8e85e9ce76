package ratelimit

import (
	"fmt"
	"strconv"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Model is the pure-Go reference of lua/admit.lua and lua/grant.lua for one
// tenant: the same state, the same integer arithmetic, the same semantics
// (period rollover, grants, overage, all or nothing, dry runs, idempotency).
// Tests feed the same requests to both and require identical decisions, so
// the model is written for clarity, independently of the Lua: it uses Go's
// calendar for periods where the script has its own.
//
// Units, epoch, precision: times are int64 microseconds since the Unix epoch,
// UTC; GCRA and the token bucket work on the whole-microsecond intervals of
// quota.IntervalMicros; quotas count cost units. Nothing is rounded except
// the floor divisions the script also does.
//
// The zero Model is a tenant with no state. A Model is not safe for
// concurrent use. It never forgets: idempotency entries stop replaying after
// 24 h but stay in memory, and Pending only grows; a long-lived Model (an
// in-process limiter) should use no idempotency keys and clear Pending.
type Model struct {
	TAT  int64 // GCRA theoretical arrival time, us (the gcra key)
	Full int64 // time the token bucket is full again, us (the bucket key)
	// Under names the burst limits TAT and Full were written under (the v2
	// hash's field L: "T,B,U,C"), "" before any; see "Limit changes" in
	// lua/admit.lua.
	Under string
	Day   Period
	Month Period
	// Pending mirrors the pending usage hash: "<hour unix s>|<meter>|u", "|r",
	// "|x", "|o" to counts.
	Pending map[string]int64
	idem    map[string]*idemRecord // idemHash -> record
}

// idemRecord mirrors admit.lua's idempotency hash.
type idemRecord struct {
	fp        string
	done      bool
	dec       []int64
	lease, at int64 // us
}

// Period is the state of a daily or monthly quota hash. ID is the day since
// the epoch or year*100+month; a Period whose ID is not the current one
// counts as empty.
type Period struct {
	ID, Used, Grant, Overage int64
}

const (
	dayMicros  = int64(24 * time.Hour / time.Microsecond)
	hourMicros = int64(time.Hour / time.Microsecond)
)

// current returns p as seen at period id: empty when stale.
func (p Period) current(id int64) Period {
	if p.ID != id {
		return Period{ID: id}
	}
	return p
}

// periodsAt returns the day id, the next day's start, the month id and the
// next month's start for now (us), from Go's calendar.
func periodsAt(now int64) (day, dayNext, month, monthNext int64) {
	day = floorDiv(now, dayMicros)
	t := time.UnixMicro(now).UTC()
	ms := quota.MonthStart(t)
	return day, (day + 1) * dayMicros, int64(t.Year())*100 + int64(t.Month()), ms.AddDate(0, 1, 0).UnixMicro()
}

// floorDiv is integer division rounding toward minus infinity (Go's /
// truncates toward zero), as the script's idiv; b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// Admit decides on req at now as lua/admit.lua would (req.Now is ignored).
// It panics on limits that Runner.Admit would reject: the model is a test
// oracle and assumes valid input.
func (m *Model) Admit(req quota.Request, now time.Time) quota.Decision {
	p, err := requestParams(req)
	if err != nil {
		panic("ratelimit: model: " + err.Error())
	}
	if p.mq != "" {
		panic("ratelimit: model: meter quotas are not modelled (their tests check exact answers)")
	}
	if !req.Calendar.IsDefault() {
		panic("ratelimit: model: billing calendars are not modelled (the model counts UTC days and months; their tests check the script against quota.Calendar)")
	}
	mode, idem := "admit", ""
	switch {
	case req.DryRun:
		mode = "dry"
	case req.IdempotencyKey != "":
		idem = idemHash(req.IdempotencyKey)
	}
	return decode(m.run(now.UnixMicro(), mode, req.Cost, req.Meter, req.Overage == quota.OverageBill,
		idemArgs{idem, req.IdempotencyFingerprint, req.IdempotencyLease.Microseconds()}, p), p, quota.Calendar{}, nil)
}

// Peek reports the limits as they stand, as Runner.Peek does.
func (m *Model) Peek(limits quota.Limits, now time.Time) quota.Decision {
	p, err := paramsOf(limits)
	if err != nil {
		panic("ratelimit: model: " + err.Error())
	}
	return decode(m.run(now.UnixMicro(), "peek", 1, "-", false, idemArgs{}, p), p, quota.Calendar{}, nil)
}

// Grant adds units to the current "day" or "month", as lua/grant.lua does.
func (m *Model) Grant(period string, units int64, now time.Time) {
	day, _, month, _ := periodsAt(now.UnixMicro())
	if period == "day" {
		m.Day = m.Day.current(day)
		m.Day.Grant += units
	} else {
		m.Month = m.Month.current(month)
		m.Month.Grant += units
	}
}

// StoreAnswer marks the record of key answered, as lua/idem.lua 'store'
// does (the model keeps no answer itself).
func (m *Model) StoreAnswer(key, fp string) bool {
	r, ok := m.idem[idemHash(key)]
	if !ok || r.fp != fp || r.done {
		return false
	}
	r.done = true
	return true
}

// idemArgs are a request's idempotency inputs: the hashed key ("" = none),
// the fingerprint and the in-flight lease in us.
type idemArgs struct {
	key, fp string
	lease   int64
}

// run is admit.lua in Go; it returns the script's flat answer.
func (m *Model) run(now int64, mode string, cost int64, meter string, bill bool, ia idemArgs, p params) []int64 {
	var replay []int64
	if mode == "admit" && ia.key != "" {
		if r, ok := m.idem[ia.key]; ok && r.at+int64(idemWindow/time.Microsecond) > now {
			code := int64(0)
			switch {
			case r.fp != ia.fp:
				code = 3
			case !r.done && r.lease > now:
				code = 2
			}
			if code > 0 {
				out := make([]int64, resultLen)
				out[4], out[5] = now, code
				return out
			}
			if r.done {
				replay = r.dec
			}
		}
	}

	ok, mask, retry := true, int64(0), int64(0)
	refuse := func(bit, wait int64) {
		ok = false
		mask |= bit
		if retry != -1 && (wait < 0 || wait > retry) {
			retry = wait
		}
	}

	// A change of the burst limits (see "Limit changes" in lua/admit.lua):
	// each limit at least as large in rate and burst as those the state
	// was written under starts fresh; the others are clamped below.
	tat, full := m.TAT, m.Full
	sig, relim := "", false
	if p.gcraT > 0 || p.bucketU > 0 {
		sig = fmt.Sprintf("%d,%d,%d,%d", p.gcraT, p.burst, p.bucketU, p.capacity)
		if m.Under != sig {
			relim = true
			var lT, lB, lU, lC int64
			if n, _ := fmt.Sscanf(m.Under, "%d,%d,%d,%d", &lT, &lB, &lU, &lC); n == 4 {
				if p.gcraT > 0 && lT > 0 && p.gcraT <= lT && p.burst >= lB {
					tat = 0
				}
				if p.bucketU > 0 && lU > 0 && p.bucketU <= lU && p.capacity >= lC {
					full = 0
				}
			}
		}
	}

	// GCRA: one emission interval T per request, burst B.
	var gtat, gnew int64
	if p.gcraT > 0 {
		// Clamped to the most indebted state the current limits allow.
		gtat = min(max(tat, now), now+p.burst*p.gcraT)
		gnew = gtat + p.gcraT
		if gnew-now > p.burst*p.gcraT {
			refuse(bitBurst, gnew-p.burst*p.gcraT-now)
		}
	}

	// Token bucket: U per unit, capacity C, state = time full again.
	var bf, bnew int64
	if p.bucketU > 0 {
		bf = min(max(full, now), now+p.capacity*p.bucketU)
		if cost > p.capacity {
			refuse(bitBucket, -1)
		} else {
			bnew = bf + cost*p.bucketU
			if bnew-now > p.capacity*p.bucketU {
				refuse(bitBucket, bnew-p.capacity*p.bucketU-now)
			}
		}
	}

	day, dayNext, month, monthNext := periodsAt(now)
	d := m.Day.current(day)
	if p.daily >= 0 && replay == nil && d.Used+cost > p.daily+d.Grant {
		if cost > p.daily {
			refuse(bitDaily, -1)
		} else {
			refuse(bitDaily, dayNext-now)
		}
	}
	mo := m.Month.current(month)
	var overage int64
	if p.monthly >= 0 && replay == nil && mo.Used+cost > p.monthly+mo.Grant {
		switch {
		case bill:
			overage = min(cost, mo.Used+cost-(p.monthly+mo.Grant))
			// the spend cap: the month's overage units at most p.ocap
			if p.ocap >= 0 && mo.Overage+overage > p.ocap {
				if cost > p.monthly+p.ocap {
					refuse(bitSpendCap, -1)
				} else {
					refuse(bitSpendCap, monthNext-now)
				}
			}
		case cost > p.monthly:
			refuse(bitMonthly, -1)
		default:
			refuse(bitMonthly, monthNext-now)
		}
	}
	if !ok || mode == "peek" {
		overage = 0
	}

	if ok && mode == "admit" {
		m.TAT, m.Full = tat, full
		if p.gcraT > 0 {
			m.TAT = gnew
		}
		if p.bucketU > 0 {
			m.Full = bnew
		}
		if relim {
			m.Under = sig
		}
		if p.daily >= 0 && replay == nil {
			m.Day = Period{ID: day, Used: d.Used + cost, Grant: d.Grant, Overage: d.Overage}
		}
		if p.monthly >= 0 && replay == nil {
			m.Month = Period{ID: month, Used: mo.Used + cost, Grant: mo.Grant, Overage: mo.Overage + overage}
		}
	}
	if !ok && mode == "admit" {
		// A clamp is kept even on a refusal: it consumes nothing. The state
		// is then written whole, as read (a fresh start included), with
		// the limits it now stands for.
		gclamp, bclamp := p.gcraT > 0 && tat > gtat, p.bucketU > 0 && full > bf
		if gclamp || bclamp {
			m.TAT, m.Full = tat, full
			if gclamp {
				m.TAT = gtat
			}
			if bclamp {
				m.Full = bf
			}
			if relim {
				m.Under = sig
			}
		}
	}
	if mode == "admit" && !(ok && replay != nil) {
		if m.Pending == nil {
			m.Pending = map[string]int64{}
		}
		f := strconv.FormatInt(floorDiv(now, hourMicros)*3600, 10) + "|" + meter + "|"
		if ok {
			m.Pending[f+"u"] += cost
			m.Pending[f+"r"]++
			if overage > 0 {
				m.Pending[f+"o"] += overage
			}
		} else {
			m.Pending[f+"x"]++
		}
	}

	consumed := ok && mode != "peek"
	if ok {
		retry = 0
	}
	res := []int64{b2i(ok), mask, retry, overage, now, 0}
	add := func(active bool, limit, remaining, reset int64) {
		if !active {
			res = append(res, 0, 0, 0, 0)
			return
		}
		res = append(res, 1, limit, max(0, remaining), reset)
	}
	switch {
	case p.gcraT == 0:
		add(false, 0, 0, 0)
	case consumed:
		add(true, p.burst, floorDiv(p.burst*p.gcraT-(gnew-now), p.gcraT), gnew)
	default:
		add(true, p.burst, floorDiv(p.burst*p.gcraT-(gtat-now), p.gcraT), gtat)
	}
	switch {
	case p.bucketU == 0:
		add(false, 0, 0, 0)
	case consumed:
		add(true, p.capacity, floorDiv(p.capacity*p.bucketU-(bnew-now), p.bucketU), bnew)
	default:
		add(true, p.capacity, floorDiv(p.capacity*p.bucketU-(bf-now), p.bucketU), bf)
	}
	var spent int64
	if consumed {
		spent = cost
	}
	add(p.daily >= 0, p.daily+d.Grant, p.daily+d.Grant-d.Used-spent, dayNext)
	add(p.monthly >= 0, p.monthly+mo.Grant, p.monthly+mo.Grant-mo.Used-spent, monthNext)

	if ok && replay != nil {
		out := append([]int64(nil), replay...)
		copy(out[headLen:headLen+2*perLimit], res[headLen:headLen+2*perLimit])
		out[4], out[5] = now, 1
		return out
	}
	if ok && mode == "admit" && ia.key != "" {
		if m.idem == nil {
			m.idem = map[string]*idemRecord{}
		}
		m.idem[ia.key] = &idemRecord{fp: ia.fp, done: ia.lease == 0, dec: append([]int64(nil), res...),
			lease: now + ia.lease, at: now}
	}
	return res
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
