package ratelimit

import (
	"context"
	"io/fs"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/lua"
)

// calendarScript is lua/calendar.lua with a body that returns what cal_at
// returns (an empty array for nil) for ARGV[1] and now = ARGV[2]: the file
// alone, not the library, sent with EVAL.
func calendarScript(tb testing.TB) string {
	tb.Helper()
	src, err := fs.ReadFile(lua.FS, "calendar.lua")
	if err != nil {
		tb.Fatal(err)
	}
	return string(src) + "\nreturn {cal_at(ARGV[1], tonumber(ARGV[2]))}\n"
}

// calendarLuaZones: ordinary DST, 30- and 45-minute offsets and DST, a
// skipped midnight, a skipped date, a clock set back across midnight.
var calendarLuaZones = []string{
	"UTC", "Etc/GMT+12", "Etc/GMT-14", "America/New_York", "America/St_Johns", "America/Santiago",
	"America/Sao_Paulo", "America/Havana", "Europe/London", "Europe/Dublin", "Africa/Casablanca",
	"Africa/Monrovia", "Asia/Beirut", "Asia/Tehran", "Asia/Kathmandu", "Australia/Lord_Howe",
	"Pacific/Chatham", "Pacific/Apia", "Pacific/Kiritimati", "Antarctica/Troll", "Antarctica/Casey",
}

type calendarCase struct {
	c        quota.Calendar
	goNow    time.Time // Go's clock: Boundaries(goNow)
	redisNow time.Time // the script's
}

// want is what cal_at must return at the script's now: Go's calendar
// there, or nothing when that day is not among those Boundaries encodes
// (the day before Go's to the second after).
func (cc calendarCase) want() []int64 {
	goDay := cc.c.DayID(cc.goNow)
	id := cc.c.DayID(cc.redisNow)
	if id < goDay-1 || id > goDay+2 {
		return nil
	}
	ds, de := cc.c.Day(cc.redisNow)
	ps, pe := cc.c.Period(cc.redisNow)
	return []int64{id, ds.UnixMicro(), de.UnixMicro(), int64(cc.c.PeriodID(cc.redisNow)), ps.UnixMicro(), pe.UnixMicro()}
}

// runCalendarCases evaluates cal_at for every case, pipelined, and
// compares it with Go's calendar; it returns how many cases were outside
// the encoded days.
func runCalendarCases(t *testing.T, c redis.UniversalClient, sc string, cases []calendarCase) (outside int) {
	t.Helper()
	ctx := context.Background()
	for len(cases) > 0 {
		batch := cases[:min(500, len(cases))]
		cases = cases[len(batch):]
		args := make([]string, len(batch))
		cmds := make([]*redis.Cmd, len(batch))
		pipe := c.Pipeline()
		for i, cc := range batch {
			args[i] = cc.c.Boundaries(cc.goNow)
			cmds[i] = pipe.Eval(ctx, sc, nil, args[i], cc.redisNow.UnixMicro())
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("EVAL: %v", err)
		}
		for i, cc := range batch {
			got, err := cmds[i].Int64Slice()
			if err != nil {
				t.Fatalf("cal_at: %v", err)
			}
			want := cc.want()
			zone := cc.c.Zone
			if zone == nil {
				zone = time.UTC
			}
			if want == nil {
				outside++
				t.Logf("outside: %s, Go at %s, Redis at %s", zone, cc.goNow.In(zone).Format(time.RFC3339), cc.redisNow.In(zone).Format(time.RFC3339))
			}
			if !equalInt64s(got, want) {
				t.Fatalf("%s anchor %d, Go at %s, Redis at %s (%s local), %q: got %v, want %v",
					cc.c.Zone, cc.c.AnchorDay, cc.goNow.UTC().Format(time.RFC3339Nano),
					cc.redisNow.UTC().Format(time.RFC3339Nano), cc.redisNow.In(zone).Format(time.RFC3339),
					args[i], got, want)
			}
		}
	}
	return outside
}

func equalInt64s(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCalendarLuaMatchesGo holds lua/calendar.lua's cal_at to Go's
// calendar: for random zones, anchors and instants from 1971 to 2100, the
// script given Boundaries(t) at t plus up to 20 hours either way (Redis's
// clock against Go's) must return Go's day and period there; half the
// instants are within seconds of a day's start, where an off-by-one would
// show. A now outside the encoded days returns nil (an empty array here).
func TestCalendarLuaMatchesGo(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	sc := calendarScript(t)
	seed := uint64(20261125) // fixed: a failure repeats
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x1a))
	locs := make([]*time.Location, len(calendarLuaZones))
	for i, n := range calendarLuaZones {
		loc, err := quota.LoadZone(n)
		if err != nil {
			t.Fatal(err)
		}
		locs[i] = loc
	}
	lo, hi := time.Date(1971, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro(), time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	var cases []calendarCase
	for i := range 6000 {
		cal := quota.Calendar{AnchorDay: rng.IntN(29), Zone: locs[rng.IntN(len(locs))]}
		goNow := time.UnixMicro(lo + rng.Int64N(hi-lo))
		skew := time.Duration(rng.Int64N(int64(40*time.Hour))) - 20*time.Hour
		if i%2 == 1 {
			// At a day's start, or a period's, give or take seconds.
			var edge time.Time
			if i%6 == 1 {
				_, edge = cal.Period(goNow)
			} else {
				_, edge = cal.Day(goNow)
			}
			goNow = edge.Add(time.Duration(rng.Int64N(int64(10*time.Second))) - 5*time.Second)
			skew = time.Duration(rng.Int64N(int64(10*time.Second))) - 5*time.Second
		}
		cases = append(cases, calendarCase{cal, goNow, goNow.Add(skew).Truncate(time.Microsecond)})
	}
	// Pacific/Apia's skipped 2011-12-30 and Casey's hours set back across
	// midnight, by the microsecond.
	apia, _ := quota.LoadZone("Pacific/Apia")
	casey, _ := quota.LoadZone("Antarctica/Casey")
	for _, e := range []struct {
		loc *time.Location
		at  time.Time
	}{
		{apia, time.Date(2011, 12, 31, 0, 0, 0, 0, apia)},
		{casey, time.Date(2010, 3, 4, 15, 0, 0, 0, time.UTC)},
		{casey, time.Date(2010, 3, 4, 13, 0, 0, 0, time.UTC)},
	} {
		for _, d := range []time.Duration{-time.Hour, -time.Microsecond, 0, time.Microsecond, time.Hour} {
			cases = append(cases, calendarCase{quota.Calendar{Zone: e.loc}, e.at, e.at.Add(d)},
				calendarCase{quota.Calendar{Zone: e.loc}, e.at.Add(-20 * time.Hour), e.at.Add(d)})
		}
	}
	start := time.Now()
	outside := runCalendarCases(t, c, sc, cases)
	t.Logf("%d cases in %v, %d outside the encoded days", len(cases), time.Since(start).Round(time.Millisecond), outside)
	if outside > len(cases)/1000 {
		t.Errorf("%d of %d cases outside the encoded days: more than short days explain", outside, len(cases))
	}
}

// TestCalendarLuaRange checks cal_at at the ends of the encoded days: the
// first and last microseconds inside, and one outside either way, which
// return nil; and that a malformed argument is an error.
func TestCalendarLuaRange(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	sc := calendarScript(t)
	ctx := context.Background()
	ny, _ := quota.LoadZone("America/New_York")
	var cases []calendarCase
	for _, cal := range []quota.Calendar{{}, {AnchorDay: 9, Zone: ny}} {
		goNow := time.Date(2026, 11, 1, 12, 0, 0, 0, ny) // a 25-hour day
		parts := strings.FieldsFunc(cal.Boundaries(goNow), func(r rune) bool { return r == ',' || r == '|' })
		s0, _ := strconv.ParseInt(parts[1], 10, 64)
		s4, _ := strconv.ParseInt(parts[5], 10, 64)
		first, end := time.Unix(s0, 0), time.Unix(s4, 0)
		if d, _ := cal.Day(first); !d.Equal(first) || cal.DayID(first) != cal.DayID(goNow)-1 {
			t.Fatalf("s0 %v is not the start of the day before %v", first, goNow)
		}
		for _, now := range []time.Time{first.Add(-time.Microsecond), first, end.Add(-time.Microsecond), end} {
			cases = append(cases, calendarCase{cal, goNow, now})
		}
	}
	if outside := runCalendarCases(t, c, sc, cases); outside != 4 {
		t.Errorf("%d cases outside the encoded days, want 4", outside)
	}
	for _, arg := range []string{"", "1,2,3", "20781,1,2,3,4,5|202610,1,202611,2,202612,3", "x,1,2,3,4,5|1,1,2,2,3,3,4"} {
		err := c.Eval(ctx, sc, nil, arg, 1).Err()
		if err == nil || !strings.Contains(err.Error(), "calendar: malformed boundaries") {
			t.Errorf("cal_at(%q): %v, want an error", arg, err)
		}
	}
}
