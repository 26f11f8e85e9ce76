package limits

import (
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Admission is what an admitted request took, as a refund or a settlement
// of it needs it: its meter, cost and overage units (the tier's and the
// meter's), and the day, billing month and hour it was admitted in.
type Admission struct {
	Meter                       string
	Cost, Overage, MeterOverage int64
	Day, Month                  int64 // ids in the tenant's calendar
	HourStart                   int64 // Unix s
}

// AdmissionOf is the admission of req by d.
func AdmissionOf(req quota.Request, d quota.Decision) Admission {
	t := d.Now.UTC()
	day, month := t.Unix()/86400, int64(t.Year())*100+int64(t.Month())
	if !req.Calendar.IsDefault() {
		day, month = req.Calendar.DayID(t), int64(req.Calendar.PeriodID(t))
	}
	return Admission{Meter: req.Meter, Cost: req.Cost, Overage: d.OverageUnits, MeterOverage: d.MeterOverageUnits,
		Day: day, Month: month, HourStart: t.Truncate(time.Hour).Unix()}
}

// GiveBack gives back units (1..a.Cost) of the admission a, which l
// decided: a refund of a request whose upstream failed (all of them), a
// settlement down. They are the request's last units: its meter's
// overage first, then the tier's (a unit past both monthly quotas was
// the meter's), never more overage than it took. Its day gets them back
// while it is the state's day, its month while it is the state's or the
// month before it (never a later one), with the money of the overage;
// its hour's pending usage loses them, whenever the give-back comes. It
// returns the change of the tier's overage units (negative).
func (l *List) GiveBack(s *State, a Admission, units int64) int64 {
	mback := min(units, a.MeterOverage)
	ovd := -min(a.Overage, units-mback)
	l.adjust(s, a, -units, ovd, -mback)
	return ovd
}

// Charge charges units more to the admission a (a settlement past its
// cost), in its day and month as GiveBack does: they count whatever the
// limits (a charge may pass a quota; later requests are refused). The
// units past the month's quota + grants are overage, when the quota
// bills, the meter's first claim as Decide attributes them; but a month
// never bills more than its spend cap: the overage is billed, the tier's
// then the meter's, while the cap's room in that month lasts, and the
// units past it count as usage only. It returns the tier's overage units
// billed.
func (l *List) Charge(s *State, a Admission, units int64) int64 {
	c := monthOf(s, a.Month)
	q, _ := l.meterMonth(s, a)
	tier, meter, capE := l.find(Quota, true, false), l.find(Quota, true, true), l.find(Cap, false, false)
	tov, mov := int64(0), int64(0)
	if c != nil && tier != nil && tier.Price >= 0 && c.Used+units > tier.Limit+c.Grant {
		tov = min(units, c.Used+units-(tier.Limit+c.Grant))
	}
	if q != nil && meter != nil && meter.Price >= 0 && q.Used+units > meter.Limit {
		mov = min(units, q.Used+units-meter.Limit)
	}
	tov -= min(tov, mov)
	ovd, mdov := tov, mov
	if capE != nil && (tov > 0 || mov > 0) {
		tprice, over := capE.Price, int64(0)
		if c != nil {
			over = c.Over
		}
		room := capE.Limit - over*tprice - s.spentIn(a.Month)
		if tprice > 0 {
			ovd = min(tov, max(0, floorDiv(room, tprice)))
		}
		room -= ovd * tprice
		if ovd < tov {
			mdov = 0
		} else if meter != nil && meter.Price > 0 {
			mdov = min(mov, max(0, floorDiv(room, meter.Price)))
		}
	}
	l.adjust(s, a, units, ovd, mdov)
	return ovd
}

// Settle settles a to actual units (lua/settle.lua): the difference is
// given back or charged. It returns the difference and the change of the
// tier's overage units.
func (l *List) Settle(s *State, a Admission, actual int64) (delta, overage int64) {
	switch delta = actual - a.Cost; {
	case delta < 0:
		return delta, l.GiveBack(s, a, -delta)
	case delta > 0:
		return delta, l.Charge(s, a, delta)
	}
	return 0, 0
}

// monthCount is a month's counters where the state holds them: its own
// month, or the month before it (before).
type monthCount struct {
	MonthCount
	before bool
}

// monthOf returns the state's counters of month, nil when it holds
// neither it nor it as the month before (a state two months on, or lost).
func monthOf(s *State, month int64) *monthCount {
	switch {
	case s.Exists && s.Month == month:
		return &monthCount{MonthCount: MonthCount{month, s.MonthUsed, s.MonthGrant, s.MonthOver}}
	case s.Exists && s.Before.Month == month:
		return &monthCount{MonthCount: s.Before, before: true}
	}
	return nil
}

// meterMonth returns a's meter's counters of its month, when l has a quota
// of the meter and the hash holds the month (the field's own, with its
// day when it is a's, or the month before it); ok false else.
func (l *List) meterMonth(s *State, a Admission) (c *MeterCount, before bool) {
	if l.meterName() != a.Meter || a.Meter == "" {
		return nil, false
	}
	if f, ok := s.Meters[a.Meter]; ok && f.Month == a.Month {
		return &f, false
	}
	if w, ok := s.MetersBefore[a.Meter]; ok && w.Month == a.Month {
		return &MeterCount{Day: -1, Month: a.Month, Used: w.Used, Over: w.Over}, true
	}
	return nil, false
}

// adjust adds units (negative: given back) and overage units (the tier's
// ovd, the meter's mdov) to a's day, month and meter month, none below 0,
// moves their money, and counts them in a's hour's pending usage.
func (l *List) adjust(s *State, a Admission, units, ovd, mdov int64) {
	if s.Exists && s.Day == a.Day && units != 0 {
		s.DayUsed = max(0, s.DayUsed+units)
	}
	if c := monthOf(s, a.Month); c != nil && (units != 0 || ovd != 0) {
		used, over := max(0, c.Used+units), max(0, c.Over+ovd)
		if c.before {
			s.Before.Used, s.Before.Over = used, over
		} else {
			s.MonthUsed, s.MonthOver = used, over
		}
	}
	if q, before := l.meterMonth(s, a); q != nil {
		if q.Day == a.Day {
			q.DayUsed = max(0, q.DayUsed+units)
		}
		q.Used, q.Over = max(0, q.Used+units), max(0, q.Over+mdov)
		if before {
			s.MetersBefore[a.Meter] = MeterMonth{a.Month, q.Used, q.Over}
		} else {
			s.Meters[a.Meter] = *q
		}
	}
	meter := l.find(Quota, true, true)
	mprice := int64(0)
	if meter != nil && meter.Price >= 0 {
		mprice = meter.Price
		if l.find(Cap, false, false) != nil {
			s.spend(a.Month, mdov*mprice)
		}
	}
	if cr := l.find(Credit, false, false); cr != nil {
		s.draw(a.Month, ovd*cr.Price+mdov*mprice)
	}
	add(&s.Counts, pendingField(a.HourStart, a.Meter, "u"), units)
	if ovd != 0 {
		add(&s.Counts, pendingField(a.HourStart, a.Meter, "o"), ovd)
	}
	if mdov != 0 {
		add(&s.Counts, pendingField(a.HourStart, a.Meter, "m"), mdov)
	}
}

// spentIn is the meters' overage millicents of month ('$' or '$w'), 0 when
// neither holds it.
func (s *State) spentIn(month int64) int64 {
	for _, sp := range [2]Spend{s.Spent, s.SpentBefore} {
		if sp.Month == month {
			return sp.Millicents
		}
	}
	return 0
}

// spend adds dmc millicents (negative: given back, never below 0) to the
// meters' overage of month, where it is held. A charge of a month neither
// field holds takes an earlier one's place ('$' when later than it, which
// moves to '$w'); anything else changes nothing: a later month's total is
// never written over.
func (s *State) spend(month, dmc int64) {
	// (if-chains, not a switch: mutation testing reaches their conditions)
	sp := &s.Spent
	if s.Spent.Month != month {
		if s.SpentBefore.Month == month {
			sp = &s.SpentBefore
		} else if dmc > 0 && month > monthOr(s.Spent.Month) {
			if s.Spent.Month != 0 {
				s.SpentBefore = s.Spent
			}
			s.Spent = Spend{month, 0}
		} else if dmc > 0 && month > monthOr(s.SpentBefore.Month) {
			sp, s.SpentBefore = &s.SpentBefore, Spend{month, 0}
		} else {
			return
		}
	}
	sp.Millicents = max(0, sp.Millicents+dmc)
}

// monthOr is a field's month, -1 for none.
func monthOr(m int64) int64 {
	if m == 0 {
		return -1
	}
	return m
}

// draw changes a prepaid tenant's credit draws of period month by dmc
// millicents: given back (never below 0) or charged (which may pass the
// balance: later requests are refused). A charge of a period later than
// the field's starts it, one between the field's two takes the earlier
// one's place; a give-back of a period it does not hold changes nothing.
func (s *State) draw(month, dmc int64) {
	d := s.Draws
	if d.Month == 0 {
		d = Draws{-1, 0, -1, 0}
	}
	if d.Month == month {
		d.Millicents = max(0, d.Millicents+dmc)
	} else if d.PrevMonth == month {
		d.PrevMillicents = max(0, d.PrevMillicents+dmc)
	} else if dmc > 0 && month > d.Month {
		d = Draws{month, dmc, d.Month, d.Millicents}
	} else if dmc > 0 && month > d.PrevMonth {
		d.PrevMonth, d.PrevMillicents = month, dmc
	} else {
		return
	}
	s.Draws = d
}
