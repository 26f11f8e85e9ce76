package ratelimit

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// Billing calendars in the scripts (lua/admit.lua, "Calendars"). A tenant
// whose quota.Calendar is not the default passes the scripts that find the
// current period (admit.lua, grant.lua) the calendar's Boundaries around
// Go's now; they pick the day and period of their own now (Redis TIME)
// from it with lua/calendar.lua. The default calendar passes nothing and
// takes the UTC path of before.

// calBounds is a calendar's Boundaries for one of its local days, with the
// bounds it encodes read back as Unix seconds: what the scripts take, and
// the windows a decision's quotas report.
type calBounds struct {
	from, until int64 // the local day it was made for: [from, until), Unix s
	arg         string
	days        [5]int64 // starts of the four days, then the end of the last
	periods     [4]int64 // starts of the three periods, then the end of the last
}

// calKey names a calendar in the cache: its zone's name and anchor day.
type calKey struct {
	zone   string
	anchor int
}

// calCache keeps each calendar's bounds for the local day they were made
// for (Boundaries costs about a microsecond and depends only on the day):
// one entry per calendar, replaced when a request falls outside its day,
// the whole map dropped past maxCalendars.
var (
	calCache    sync.Map // calKey -> *calBounds
	calCacheLen atomic.Int64
)

const maxCalendars = 10_000

// boundsOf returns the bounds of cal around t (Go's now, or a request's
// explicit time); nil for the default calendar, which the scripts compute
// themselves.
func boundsOf(cal quota.Calendar, t time.Time) *calBounds {
	if cal.IsDefault() {
		return nil
	}
	k := calKey{zone: cal.Zone.String(), anchor: max(cal.AnchorDay, 1)}
	u := t.Unix()
	if v, ok := calCache.Load(k); ok {
		if b := v.(*calBounds); b.from <= u && u < b.until {
			return b
		}
	}
	b := makeBounds(cal, t)
	if _, loaded := calCache.Swap(k, b); !loaded && calCacheLen.Add(1) > maxCalendars {
		calCache.Clear()
		calCacheLen.Store(0)
	}
	return b
}

// makeBounds computes cal's Boundaries around t and reads them back.
func makeBounds(cal quota.Calendar, t time.Time) *calBounds {
	arg := cal.Boundaries(t)
	b := &calBounds{arg: arg}
	days, periods, _ := strings.Cut(arg, "|")
	var d [6]int64
	for i, f := range strings.Split(days, ",") {
		if i < len(d) {
			d[i], _ = strconv.ParseInt(f, 10, 64)
		}
	}
	copy(b.days[:], d[1:])
	var p [7]int64
	for i, f := range strings.Split(periods, ",") {
		if i < len(p) {
			p[i], _ = strconv.ParseInt(f, 10, 64)
		}
	}
	b.periods = [4]int64{p[1], p[3], p[5], p[6]}
	// t's own day is the second of the four (Boundaries starts a day
	// before it)
	b.from, b.until = b.days[1], b.days[2]
	return b
}

// windows returns the length of the local day and of the billing month
// containing now (us), from b's bounds, or from cal when now is outside
// them (a Redis clock far from Go's).
func (b *calBounds) windows(cal quota.Calendar, now int64) (day, month time.Duration) {
	s := redisfn.FloorDiv(now, 1e6)
	day, month = -1, -1
	for i := range 4 {
		if b.days[i] <= s && s < b.days[i+1] {
			day = time.Duration(b.days[i+1]-b.days[i]) * time.Second
		}
	}
	for i := range 3 {
		if b.periods[i] <= s && s < b.periods[i+1] {
			month = time.Duration(b.periods[i+1]-b.periods[i]) * time.Second
		}
	}
	if day < 0 || month < 0 {
		t := time.UnixMicro(now)
		ds, de := cal.Day(t)
		ps, pe := cal.Period(t)
		day, month = de.Sub(ds), pe.Sub(ps)
	}
	return day, month
}

// calendarNow reads the script's now from its "CALENDAR <now us>" error
// (its days did not reach it): 0 when err is another error.
func calendarNow(err error) int64 { return errorNow(err, "CALENDAR ") }

// errorNow reads the script's now from its error "<tag><now us>": 0 when
// err is another error.
func errorNow(err error, tag string) int64 {
	var re redis.Error
	if !errors.As(err, &re) {
		return 0
	}
	msg := re.Error()
	i := strings.Index(msg, tag)
	if i < 0 {
		return 0
	}
	rest := msg[i+len(tag):]
	if j := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' }); j >= 0 {
		rest = rest[:j]
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
