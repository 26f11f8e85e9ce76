package quota

import (
	"strconv"
	"strings"
	"sync"
	"time"
	_ "time/tzdata" // the zone database, for machines without /usr/share/zoneinfo
)

// Calendar is a tenant's billing calendar.
//
// Its days run from local midnight to the next local midnight in Zone: 23 or
// 25 hours across a DST change, other lengths where a zone changed its offset
// by another amount (Pacific/Apia skipped 2011-12-30 altogether). Its billing
// months (periods) run from the local midnight of the anchor day to that of
// the anchor day of the next month; anchors stop at 28 so that every month
// has one.
//
// A day starts at the first instant whose local date is that date or later.
// That is local midnight, except where a zone's clock skips midnight (it
// jumps from 23:59:59 to 01:00: America/Santiago, America/Havana, Asia/Beirut,
// Asia/Tehran have done so), where the day starts at the jump, its clock
// reading 01:00; and a date the clock skips entirely has no instant, its day
// is empty and the day before ends where the day after starts. time.Date is
// no help there: for a skipped midnight it answers 23:00 of the day before in
// some zones (America/Santiago, America/Sao_Paulo) and 01:00 in others
// (Asia/Beirut), and Apia's 2011-12-30 00:00 comes out as 2011-12-29 00:00.
//
// "Or later" matters only where a zone's clock went back across midnight
// (America/St_Johns every autumn until 2011, from 00:01 back to 23:01;
// Antarctica/Casey on 2010-03-05, from 02:00 back to 23:00 of the 4th): the
// local date then reads the day before again for a while, but a day once
// over does not come back (its counters have been reset): those instants
// belong to the later day. So days, and periods, tile time without gaps or
// overlaps, and DayID never decreases.
//
// The zero Calendar is the default: anchor 1 in UTC, UTC days and calendar
// months, which is what DayStart and MonthStart compute and lua/state.lua's
// month_at.
type Calendar struct {
	AnchorDay int            // 1..28; 0 means 1
	Zone      *time.Location // nil means UTC
}

// MaxAnchorDay is the latest billing anchor day: every month has a 28th.
const MaxAnchorDay = 28

// MaxZoneNameLen bounds a time zone name (the longest IANA name,
// America/Argentina/ComodRivadavia, has 32 bytes).
const MaxZoneNameLen = 64

// ValidAnchorDay reports whether d is a valid billing anchor day, 1..28.
func ValidAnchorDay(d int) bool { return d >= 1 && d <= MaxAnchorDay }

// LoadZone returns the location of an IANA time zone name; "" is UTC. It
// rejects "Local" and "localtime" (the machine's zone: not the same on
// every node), names longer than MaxZoneNameLen or of other bytes than
// letters, digits and "/_+-", the system database's "posix/" and "right/"
// copies (not IANA names; right/ counts leap seconds) and anything
// time.LoadLocation rejects, with a CodeInvalid *Error on field time_zone.
// Names are looked up in the system's zone database first, then in the
// copy embedded in the binary (time/tzdata), once per process: a zone
// loaded is kept (time.LoadLocation reads and parses the zone's data on
// every call; the names that load are the database's, a few hundred), so
// callers on hot paths need no cache of their own.
func LoadZone(name string) (*time.Location, error) {
	if name == "" {
		return time.UTC, nil
	}
	if loc, ok := loadedZones.Load(name); ok {
		return loc.(*time.Location), nil
	}
	if len(name) > MaxZoneNameLen {
		return nil, FieldError("time_zone", "must be at most %d bytes", MaxZoneNameLen)
	}
	if !zoneNameOK(name) {
		return nil, FieldError("time_zone", "must be an IANA time zone name such as Europe/Berlin")
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, FieldError("time_zone", "unknown time zone %q", name)
	}
	loadedZones.Store(strings.Clone(name), loc)
	return loc, nil
}

// loadedZones holds the zones LoadZone loaded: name -> *time.Location.
var loadedZones sync.Map

func zoneNameOK(name string) bool {
	if name == "Local" || name == "localtime" || name == "posixrules" ||
		strings.HasPrefix(name, "posix/") || strings.HasPrefix(name, "right/") ||
		name[0] == '/' || name[len(name)-1] == '/' || strings.Contains(name, "//") {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch b := name[i]; {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9',
			b == '/', b == '_', b == '+', b == '-':
		default:
			return false
		}
	}
	return true
}

// utcNames are the zone names whose clock is UTC at all times: a calendar
// in one of them is the default one.
var utcNames = map[string]bool{
	"UTC": true, "Etc/UTC": true, "UCT": true, "Etc/UCT": true,
	"Universal": true, "Etc/Universal": true, "Zulu": true, "Etc/Zulu": true,
	"GMT": true, "Etc/GMT": true, "GMT0": true, "Etc/GMT0": true,
	"GMT+0": true, "Etc/GMT+0": true, "GMT-0": true, "Etc/GMT-0": true,
	"Greenwich": true, "Etc/Greenwich": true,
}

// IsDefault reports whether c is the default calendar, anchor 1 in UTC (or
// a zone that is UTC under another name, such as Etc/UTC): UTC days and
// calendar months, as before calendars existed.
func (c Calendar) IsDefault() bool {
	return c.anchor() == 1 && (c.Zone == nil || c.Zone == time.UTC || utcNames[c.Zone.String()])
}

// anchor is c's anchor day, 0 read as 1; values out of range (which
// validation keeps out) are clamped rather than trusted.
func (c Calendar) anchor() int {
	return min(max(c.AnchorDay, 1), MaxAnchorDay)
}

func (c Calendar) loc() *time.Location {
	if c.Zone == nil {
		return time.UTC
	}
	return c.Zone
}

// Day returns the local day containing t, as UTC instants: start <= t < end.
func (c Calendar) Day(t time.Time) (start, end time.Time) {
	_, s, e := c.dayAt(t)
	return time.Unix(s, 0).UTC(), time.Unix(e, 0).UTC()
}

// DayID returns the local date of t as days since 1970-01-01 (a civil day
// number, negative before 1970): for the default calendar, Unix seconds
// divided by 86400, rounded down. (Where a zone's clock went back across
// midnight, the later date: see Calendar.)
func (c Calendar) DayID(t time.Time) int64 {
	id, _, _ := c.dayAt(t)
	return id
}

// Period returns the billing month containing t, as UTC instants: from the
// start of the last anchor day at or before t's local date to the start of
// the anchor day of the month after.
func (c Calendar) Period(t time.Time) (start, end time.Time) {
	id, _, _ := c.dayAt(t)
	y, m := c.periodOf(id)
	a := c.anchor()
	return time.Unix(c.firstAt(y, m, a), 0).UTC(), time.Unix(c.firstAt(y, m+1, a), 0).UTC()
}

// PeriodID returns year*100+month of the local date of Period(t)'s start:
// the month its anchor day is in (e.g. 202611 for the period from
// 2026-11-15). For the default calendar, lua/state.lua's month id.
func (c Calendar) PeriodID(t time.Time) int {
	id, _, _ := c.dayAt(t)
	y, m := c.periodOf(id)
	return y*100 + int(m)
}

// periodOf returns the year and month of the anchor day that starts the
// period containing day id.
func (c Calendar) periodOf(id int64) (int, time.Month) {
	y, m, d := time.Unix(id*daySeconds, 0).UTC().Date()
	if d < c.anchor() {
		m--
		if m < time.January {
			y, m = y-1, time.December
		}
	}
	return y, m
}

const daySeconds = 86400

// zoneSlack exceeds the magnitude of every UTC offset (the tz database's
// reach ±15:56 in local mean times before 1900; POSIX allows ±24:59:59):
// no instant zoneSlack before a local wall time reads that time or later.
const zoneSlack = 2 * daySeconds

// dayAt returns the day id of t and the Unix seconds of the start of that
// day and of the next.
func (c Calendar) dayAt(t time.Time) (id, start, next int64) {
	loc := c.loc()
	if loc == time.UTC {
		s := t.Unix()
		id = s / daySeconds
		if s%daySeconds < 0 {
			id--
		}
		return id, id * daySeconds, (id + 1) * daySeconds
	}
	y, m, d := t.In(loc).Date()
	id = civilDay(y, m, d)
	start, next = c.firstAtWall(id*daySeconds), c.firstAtWall((id+1)*daySeconds)
	// The clock went back across midnight after the next day had begun:
	// still the next day (see Calendar). The loop also steps over a date
	// the clock skipped, whose start is the next date's.
	for u := t.Unix(); next <= u; {
		id, start = id+1, next
		next = c.firstAtWall((id + 1) * daySeconds)
	}
	return id, start, next
}

// civilDay returns the date's day number since 1970-01-01; time.Date
// normalizes a day or month out of range (y, m+1, d) as usual.
func civilDay(y int, m time.Month, d int) int64 {
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / daySeconds // exact: a multiple of 86400
}

// firstAt returns the Unix seconds of the start of a local date (y, m, d
// normalized as time.Date does).
func (c Calendar) firstAt(y int, m time.Month, d int) int64 {
	return c.firstAtWall(civilDay(y, m, d) * daySeconds)
}

// firstAtWall returns the first instant (Unix seconds) at which the local
// clock reads wall (seconds since 1970-01-01 00:00 local) or later. It walks
// the zone's offset intervals from zoneSlack before wall: the first interval
// whose clock reaches wall holds the instant, at wall minus its offset, or
// at its own start if its clock starts past wall (a skipped midnight).
// Offsets and transitions are whole seconds, and so is the answer.
func (c Calendar) firstAtWall(wall int64) int64 {
	loc := c.loc()
	if loc == time.UTC {
		return wall
	}
	u := wall - zoneSlack
	for {
		at := time.Unix(u, 0).In(loc)
		_, off := at.Zone()
		_, end := at.ZoneBounds()
		if end.IsZero() {
			return max(u, wall-int64(off))
		}
		e := end.Unix()
		if e <= u {
			// Past a zone's last listed transition, where its rule
			// applies, Go (as of 1.26, time/zoneinfo.go's tzset) ends the
			// year's last interval 365 days after the year's start: on
			// the last UTC day of a leap year the end it returns is
			// already past. The interval lasts to the year's end, the
			// next UTC midnight.
			e = u - floorMod(u, daySeconds) + daySeconds
		}
		if e+int64(off) > wall {
			return max(u, wall-int64(off))
		}
		u = e
	}
}

// floorMod is a modulo b (b > 0) in 0..b-1.
func floorMod(a, b int64) int64 {
	if r := a % b; r < 0 {
		return r + b
	}
	return a % b
}

// Boundaries encodes, for the Lua scripts, the calendar around t: the local
// days from t's local date - 1 to + 2 and the periods from t's period - 1 to
// + 1, so that a Redis clock within about a day of Go's picks correctly.
// Redis scripts take the time from Redis TIME, and Lua knows no zones: the
// caller passes this, lua/calendar.lua's cal_at picks the day and period of
// the script's now from it.
//
// The format, decimal integers in ASCII:
//
//	<d0>,<s0>,<s1>,<s2>,<s3>,<s4>|<p0>,<q0>,<p1>,<q1>,<p2>,<q2>,<q3>
//
// d0 is the id (DayID) of the first day, t's local date - 1; days d0..d0+3
// start at s0..s3 (Unix seconds) and day d0+3 ends at s4. p0, p1, p2 are the
// ids (PeriodID) of t's period - 1, t's period and the next; they start at
// q0, q1, q2 and the last ends at q3. A skipped date has the start of the
// date after (si = si+1), so no instant is in it. The days reach from a
// whole day before t's to two whole days after it: a Redis clock 23 hours
// behind Go's or 46 hours ahead still finds its day (less only around a
// day shorter than DST makes, such as the day after a skipped date), and
// its period, as the periods span more. Seconds suffice: every offset and
// transition in the tz database is a whole number of seconds, if not
// always of minutes (Africa/Monrovia kept -0:44:30 until 1972-01-07).
// About 120 bytes for dates of this century; an argument, never stored.
// It costs about a microsecond (nine day starts) and depends only on t's
// day: a caller may keep it until Day(t)'s end.
func (c Calendar) Boundaries(t time.Time) string {
	id, start, next := c.dayAt(t)
	y, m := c.periodOf(id)
	a := c.anchor()
	b := make([]byte, 0, 160)
	d0 := id - 1
	b = strconv.AppendInt(b, d0, 10)
	for i := int64(0); i <= 4; i++ {
		s := start // i == 1
		switch i {
		case 0, 3, 4:
			s = c.firstAtWall((d0 + i) * daySeconds)
		case 2:
			s = next
		}
		b = append(b, ',')
		b = strconv.AppendInt(b, s, 10)
	}
	b = append(b, '|')
	for i := -1; i <= 2; i++ {
		if i > -1 {
			b = append(b, ',')
		}
		py, pm := normMonth(y, m+time.Month(i))
		if i < 2 {
			b = strconv.AppendInt(b, int64(py*100+int(pm)), 10)
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, c.firstAt(py, pm, a), 10)
	}
	return string(b)
}

// normMonth normalizes a month out of 1..12 into the year before or after,
// as time.Date does.
func normMonth(y int, m time.Month) (int, time.Month) {
	d := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
	return d.Year(), d.Month()
}
