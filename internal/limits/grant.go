package limits

import "github.com/tollgate/tollgate/internal/quota"

// Grant adds units to the tenant-wide quota of the day or billing month
// (monthly) of now in cal, as lua/grant.lua does: until the period ends
// its limit is quota + grants. A state of an earlier period starts the
// period's (a month that ends is kept as the month before). A grant with
// an id is applied once (its mark, Grants[id], stays until the next
// month), and only in its period (periodID, the period's id; 0: any): it
// answers 1 when added, 0 when the id was applied before, -1 when the
// period is not now's (then nothing is written).
func Grant(s *State, cal quota.Calendar, now int64, monthly bool, units int64, id string, periodID int64) int {
	v := s.view()
	p := at(cal, &v, now)
	pid, end := p.day, p.dayNext
	if monthly {
		pid, end = p.month, p.monthNext
	}
	if periodID != 0 && periodID != pid {
		return -1
	}
	if _, ok := s.Grants[id]; ok && id != "" {
		return 0
	}
	if monthly {
		v.MonthGrant += units
	} else {
		v.DayGrant += units
	}
	if id != "" {
		v.Marks++
	}
	if p.rolled && s.Exists && v.Marks > 0 {
		// the past months' marks go, and the count with them: the new
		// mark is written after (lua/state.lua's save_state), uncounted
		s.Grants, v.Marks = nil, 0
	}
	expire(&v, end+hourUS, now, p.dayNext, p.monthNext)
	v.Exists = true
	s.Counters = v
	if id != "" {
		s.Grants = put(s.Grants, id, units)
	}
	return 1
}

// Reset empties the used units of the day and month (ids day, month) of a
// tier change with quota reset, stamped stamp (µs, > 0), as lua/reset.lua
// does: the counters of those periods, the tenant's and each meter's; the
// grants, the overage and its money stay (a reset gives a fresh quota,
// not a fresh cap). Applied once per stamp (ResetStamp): it answers 1
// when applied, 0 when this reset or a later one was, -1 when there is
// nothing to reset (no state; its periods are later ones). now is the
// script's time (it moves only the state's expiry).
func Reset(s *State, stamp, day, month, now int64) int {
	if s.ResetStamp >= stamp {
		return 0
	}
	if !s.Exists {
		return -1
	}
	for m, c := range s.Meters {
		if c.Day == day {
			c.DayUsed = 0
		}
		if c.Month == month {
			c.Used = 0
		}
		s.Meters[m] = c
	}
	if s.Day != day && s.Month != month {
		return -1
	}
	if s.Day == day {
		s.DayUsed = 0
	}
	if s.Month == month {
		s.MonthUsed = 0
	}
	expire(&s.Counters, need(&s.Counters, now, 0, 0), now, 0, 0)
	s.ResetStamp = stamp
	return 1
}
