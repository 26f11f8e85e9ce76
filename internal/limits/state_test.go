package limits

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// fullState holds every field Redis may hold of a tenant.
func fullState() State {
	day := int64(22000)
	return State{
		Counters: Counters{Exists: true, TAT: day*dayUS + 5, Full: day*dayUS - 7, Day: day, DayUsed: 3, DayGrant: 2,
			Month: 203103, MonthUsed: 40, MonthGrant: 5, MonthOver: 6, Marks: 1, Expiry: 5 * hourUS, MonthEnd: 22010 * dayUS,
			Before: MonthCount{203102, 9, 8, 7}, Under: "1,2,3,4"},
		Grants: map[string]int64{"gr1": 5}, ResetStamp: 77,
		Usage: map[string][2]int64{"p528000|a|": {4, 2}}, Counts: map[string]int64{"p1900800000|a|o": 3, "p1900800000|a|u": -2},
		Meters: map[string]MeterCount{"a": {day, 1, 203103, 2, 3}}, MetersBefore: map[string]MeterMonth{"a": {203102, 4, 5}},
		Spent: Spend{203103, 900}, SpentBefore: Spend{203102, 100}, Draws: Draws{203103, 1, 203102, 2},
		Idem: map[string]IdemRecord{"k": {Fingerprint: "fp", Done: true, Decision: []int64{1, 0, 5}, Lease: 9, At: 8}},
	}
}

func TestFormatParse(t *testing.T) {
	t.Parallel()
	s := fullState()
	tenant, meters, idem := s.Format()
	want := map[string]string{"t": "5,-7", "q": "22000,3,2,203103,40,5,6,1", "c": "5,22010", "w": "203102,9,8,7",
		"L": "1,2,3,4", "rs": "77", "g:gr1": "5", "p528000|a|": "4,2", "p1900800000|a|o": "3", "p1900800000|a|u": "-2"}
	if !reflect.DeepEqual(tenant, want) {
		t.Errorf("tenant %v\nwant %v", tenant, want)
	}
	if want := map[string]string{"a": "22000,1,203103,2,3", "a|w": "203102,4,5", "$": "203103,900", "$w": "203102,100",
		"P": "203103,1,203102,2"}; !reflect.DeepEqual(meters, want) {
		t.Errorf("meters %v\nwant %v", meters, want)
	}
	if want := map[string]string{"fp": "fp", "st": "done", "dec": "1,0,5", "lease": "9", "at": "8"}; !reflect.DeepEqual(idem["k"], want) {
		t.Errorf("idem %v\nwant %v", idem["k"], want)
	}
	idem["k"]["status"] = "200" // (the stored answer: ignored)
	back, err := Parse(tenant, meters, idem)
	if err != nil || !reflect.DeepEqual(back, s) {
		t.Fatalf("Parse(Format()) = %+v, %v\nwant %+v", back, err, s)
	}
	if back.String() != s.String() || !strings.Contains(s.String(), "q=22000,3,2,203103,40,5,6,1 ") {
		t.Errorf("String: %s", s.String())
	}
	// a state of no limits: t empty both sides, a run record
	s = State{Counters: Counters{Exists: true, Day: 1, Month: 197001}, Idem: map[string]IdemRecord{"k": {Decision: []int64{1}}}}
	tenant, meters, idem = s.Format()
	if tenant["t"] != "," || len(meters) != 0 || idem["k"]["st"] != "run" {
		t.Errorf("an empty state: %v %v %v", tenant, meters, idem)
	}
	if back, err := Parse(tenant, meters, idem); err != nil || !reflect.DeepEqual(back, s) {
		t.Errorf("Parse: %+v %v", back, err)
	}
	if tenant, meters, idem := (&State{}).Format(); len(tenant)+len(meters)+len(idem) != 0 {
		t.Errorf("no state: %v %v %v", tenant, meters, idem)
	}
}

func TestParseRefusesMalformedFields(t *testing.T) {
	t.Parallel()
	ok := map[string]string{"t": "1,2", "q": "1,2,3,4,5,6,7,8", "c": "1,2"}
	for _, tc := range []struct {
		tenant, meters map[string]string
		idem           map[string]string
	}{
		{tenant: map[string]string{"t": "1,2", "q": "1,2,3", "c": "1,2"}},
		{tenant: map[string]string{"t": "1,2", "q": "1,2,3,4,5,6,7,8", "c": "1"}},
		{tenant: map[string]string{"t": "12", "q": "1,2,3,4,5,6,7,8", "c": "1,2"}},
		{tenant: map[string]string{"t": "x,2", "q": "1,2,3,4,5,6,7,8", "c": "1,2"}},
		{tenant: map[string]string{"t": "1,x", "q": "1,2,3,4,5,6,7,8", "c": "1,2"}},
		{tenant: map[string]string{"w": "1,2,3"}},
		{tenant: map[string]string{"rs": "x"}},
		{tenant: map[string]string{"g:a": "x"}},
		{tenant: map[string]string{"p1|a|": "1"}},
		{tenant: map[string]string{"p1|a|u": "1,2"}},
		{tenant: map[string]string{"other": "1"}},
		{meters: map[string]string{"$": "1"}},
		{meters: map[string]string{"$w": "1,2,3"}},
		{meters: map[string]string{"P": "1,2,3"}},
		{meters: map[string]string{"a|w": "1,2"}},
		{meters: map[string]string{"a": "1,2,3,4"}},
		{idem: map[string]string{"fp": "a", "st": "maybe", "dec": "1", "lease": "1", "at": "1"}},
		{idem: map[string]string{"fp": "a", "st": "run", "dec": "x", "lease": "1", "at": "1"}},
		{idem: map[string]string{"fp": "a", "st": "run", "dec": "1", "lease": "", "at": "1"}},
		{idem: map[string]string{"fp": "a", "st": "run", "dec": "1", "lease": "1"}},
	} {
		var idem map[string]map[string]string
		if tc.idem != nil {
			idem = map[string]map[string]string{"k": tc.idem}
		}
		if s, err := Parse(tc.tenant, tc.meters, idem); err == nil {
			t.Errorf("Parse(%v, %v, %v) = %+v, want an error", tc.tenant, tc.meters, tc.idem, s)
		}
	}
	if _, err := Parse(ok, nil, nil); err != nil {
		t.Errorf("Parse(%v): %v", ok, err)
	}
}

func TestStoreAnswer(t *testing.T) {
	t.Parallel()
	s := State{Idem: map[string]IdemRecord{"run": {Fingerprint: "a"}, "done": {Fingerprint: "a", Done: true}}}
	for _, tc := range []struct {
		key, fp string
		want    bool
	}{{"none", "a", false}, {"run", "b", false}, {"done", "a", false}, {"run", "a", true}, {"run", "a", false}} {
		if got := s.StoreAnswer(tc.key, tc.fp); got != tc.want {
			t.Errorf("StoreAnswer(%s, %s) = %t, want %t", tc.key, tc.fp, got, tc.want)
		}
	}
	if !s.Idem["run"].Done || s.Idem["run"].Fingerprint != "a" {
		t.Errorf("the record after storing: %+v", s.Idem["run"])
	}
}

// TestPeriods: the default calendar's month end is cached in the state and
// trusted within 31 days before it (a clock set back less than that
// across the month's start is not seen, as the scripts do); a calendar's
// ids are its own and it caches no end.
func TestPeriods(t *testing.T) {
	t.Parallel()
	us := func(s string) int64 {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v.UnixMicro()
	}
	v := Counters{Day: -1, Month: -1}
	p := at(quota.Calendar{}, &v, us("2031-06-30T23:00:00Z"))
	if p.day != us("2031-06-30T00:00:00Z")/dayUS || p.month != 203106 || p.monthNext != us("2031-07-01T00:00:00Z") ||
		!p.moved || !p.rolled || p.before || v.MonthEnd != p.monthNext {
		t.Fatalf("a new state: %+v %+v", p, v)
	}
	v.MonthUsed, v.DayUsed = 5, 2
	p = at(quota.Calendar{}, &v, us("2031-06-30T23:30:00Z"))
	if p.moved || p.rolled || v.MonthUsed != 5 || v.DayUsed != 2 {
		t.Fatalf("the same day: %+v %+v", p, v)
	}
	// set back two days (in June still): cached
	p = at(quota.Calendar{}, &v, us("2031-06-28T23:30:00Z"))
	if p.month != 203106 || p.rolled || v.DayUsed != 0 || !p.moved {
		t.Fatalf("two days back: %+v %+v", p, v)
	}
	// set back into May 31, within 31 days of July 1: still June (the
	// cache; June has 30 days)
	if p = at(quota.Calendar{}, &v, us("2031-05-31T12:00:00Z")); p.month != 203106 || p.rolled {
		t.Fatalf("set back past the month's start by less than 31 days: %+v, want June (the cache)", p)
	}
	// the next month: the month before kept
	p = at(quota.Calendar{}, &v, us("2031-07-01T00:00:00Z"))
	if p.month != 203107 || !p.rolled || !p.before || v.Before != (MonthCount{203106, 5, 0, 0}) || v.MonthUsed != 0 {
		t.Fatalf("July: %+v %+v", p, v)
	}
	// far back: the month computed again, earlier: no month before
	v.MonthUsed = 3
	p = at(quota.Calendar{}, &v, us("2031-05-20T00:00:00Z"))
	if p.month != 203105 || p.before || v.Before.Month != 203106 || v.MonthUsed != 0 {
		t.Fatalf("set back to May: %+v %+v", p, v)
	}
	ny, err := quota.LoadZone("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	cal := quota.Calendar{Zone: ny, AnchorDay: 15}
	p = at(cal, &v, us("2031-03-15T03:59:00Z"))
	if p.month != 203102 || p.monthNext != us("2031-03-15T04:00:00Z") || p.dayNext != us("2031-03-15T04:00:00Z") ||
		v.MonthEnd != 0 || !p.moved || !p.calMode {
		t.Fatalf("New York: %+v %+v", p, v)
	}
	if p = at(cal, &v, us("2031-03-15T03:59:30Z")); p.moved {
		t.Fatalf("New York, the same day: %+v", p)
	}
}

// TestNeedAndExpire: a state lives to the end of its day and month + 1 h,
// its TAT and FULL; its expiry moves a day beyond what it needs, and only
// when it needs more.
func TestNeedAndExpire(t *testing.T) {
	t.Parallel()
	now := int64(1000 * dayUS)
	v := Counters{Day: 1000, Month: 197309, TAT: now + 5*dayUS, MonthEnd: 0}
	if got := need(&v, now, 0, 0); got != now+5*dayUS {
		t.Errorf("need %d, want the TAT %d", got, now+5*dayUS)
	}
	v.TAT = 0
	if got := need(&v, now, 0, 0); got != 1001*dayUS+hourUS {
		t.Errorf("need %d, want the day's end + 1 h", got)
	}
	// the month's end: the cached one, else the UTC month's when it is
	// the state's (1972-09-27 is in 197209)
	v.Month = 197209
	if got, want := need(&v, now, 0, 0), time.Date(1972, 10, 1, 1, 0, 0, 0, time.UTC).UnixMicro(); got != want {
		t.Errorf("need %d, want the UTC month's end + 1 h %d", got, want)
	}
	if got := need(&v, now, 0, now+40*dayUS); got != now+40*dayUS+hourUS {
		t.Errorf("need with a given month end: %d", got)
	}
	v.Day, v.Month = -1, -1
	if got := need(&v, now, 0, 0); got != now+hourUS {
		t.Errorf("need of no periods %d, want now + 1 h", got)
	}
	v = Counters{Exists: true, Day: -1, Month: -1, Expiry: now + 3*dayUS}
	expire(&v, now+2*dayUS, now, 0, 0)
	if v.Expiry != now+3*dayUS {
		t.Errorf("an expiry that suffices moved: %d", v.Expiry)
	}
	expire(&v, now+3*dayUS+1, now, 0, 0)
	if v.Expiry != now+4*dayUS+hourUS {
		t.Errorf("expiry %d, want a day beyond, rounded up to the hour %d", v.Expiry, now+4*dayUS+hourUS)
	}
	v = Counters{Day: 1000, Month: -1}
	expire(&v, 0, now, 1001*dayUS, 0)
	if v.Expiry != 1002*dayUS+hourUS {
		t.Errorf("a new state's expiry %d, want its day's end + 1 h + a day", v.Expiry)
	}
}
