package limits

import "strconv"

// commit writes an admission's decision into the state (Admit mode): the
// counters of the view only when something of them changes (an admission,
// a clamp kept on a refusal, pending usage counted), then whole, as the
// script's one HSET; the meter's field, the spend and the draws with an
// admission; the pending counters.
func (x *decision) commit() {
	s, v, r, p, d := x.s, &x.v, x.r, x.p, x.d
	counted := d.Allowed && x.replay == nil
	need, dirty := int64(0), false
	for i, b := range x.burst {
		t, changed := b.next, d.Allowed
		if !d.Allowed {
			t, changed = b.start, b.clamped // a clamp consumes nothing: kept
		}
		if b.e == nil || !changed {
			continue
		}
		if i == 0 {
			v.TAT = t
		} else {
			v.Full = t
		}
		need, dirty = max(need, t), true
	}
	hasMeter, meterPrice := false, int64(0)
	for _, c := range x.quotas[:x.nq] {
		switch {
		case c.e.Meter != "":
			hasMeter = true
			if c.e.Monthly {
				meterPrice = c.e.Price
			}
		case !counted:
		case c.e.Monthly:
			v.MonthUsed, v.MonthOver = v.MonthUsed+r.Cost, v.MonthOver+d.Overage
			need, dirty = max(need, p.monthNext+hourUS), true
		default:
			v.DayUsed += r.Cost
			need, dirty = max(need, p.dayNext+hourUS), true
		}
	}
	if counted && hasMeter {
		x.commitMeter(meterPrice)
	}
	if counted && x.credit != nil && x.billed > 0 {
		s.Draws = x.draws
		s.Draws.Millicents += x.billed
	}
	hour := floorDiv(r.Now, hourUS)
	if counted && r.Meter != "" {
		f := "p" + strconv.FormatInt(hour, 10) + "|" + r.Meter + "|"
		u := s.Usage[f]
		s.Usage = put(s.Usage, f, [2]int64{u[0] + r.Cost, u[1] + 1})
		need, dirty = max(need, r.Now+pendingUS), true
	}
	if dirty {
		if x.relim {
			v.Under = x.l.burstLimits()
		}
		if p.rolled && s.Exists && v.Marks > 0 {
			s.Grants, v.Marks = nil, 0 // a new month: the past months' grant marks go
		}
		expire(v, need, r.Now, p.dayNext, p.monthNext)
		v.Exists = true
		s.Counters = *v
	}
	x.countPending(hour*3600, counted)
}

// commitMeter counts the admission in its meter's field, and its meter
// overage in the month's spend when there is a cap.
func (x *decision) commitMeter(price int64) {
	s, m, d := x.s, x.m, x.d
	m.c.DayUsed, m.c.Used, m.c.Over = m.c.DayUsed+x.r.Cost, m.c.Used+x.r.Cost, m.c.Over+d.MeterOverage
	s.Meters = put(s.Meters, m.meter, m.c)
	if d.MeterOverage > 0 && x.cap != nil {
		if s.Spent.Month != 0 && s.Spent.Month < x.p.month {
			s.SpentBefore = s.Spent
		}
		s.Spent = Spend{x.p.month, x.spentM + d.MeterOverage*price}
	}
	if m.fresh && m.hasOld {
		s.MetersBefore = put(s.MetersBefore, m.meter, m.old)
	}
}

// countPending counts the request's pending counters of the hour: its
// overage, or its refusal (degraded or not), and a shadow policy's
// refusal. A tenant Redis holds no state of counts them beside it, but
// not a replay.
func (x *decision) countPending(hourStart int64, counted bool) {
	s, r, d := x.s, x.r, x.d
	if r.Meter == "" || !s.Exists && d.Allowed && x.replay != nil {
		return
	}
	count := func(kind string, n int64) {
		if n > 0 {
			add(&s.Counts, pendingField(hourStart, r.Meter, kind), n)
		}
	}
	if counted {
		count("o", d.Overage)
		count("m", d.MeterOverage)
	}
	if !d.Allowed {
		count(string("xd"[b2i(d.Mask&BitDegraded != 0)]), 1)
	}
	if r.Policies.Shadowed {
		count("s", 1)
	}
}

// pendingField is the name of a pending counter of an hour and meter.
func pendingField(hourStart int64, meter, kind string) string {
	return "p" + strconv.FormatInt(hourStart, 10) + "|" + meter + "|" + kind
}
