package quota

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"
)

// TestLoadZoneRefusesWhatIsNoZoneName: a time zone is stored and shown
// as the tenant sent it, so only IANA names are taken: a path that the
// zone database happens to resolve ("Europe/./Paris" reads the file of
// Europe/Paris) is refused, and names up to MaxZoneNameLen bytes are
// looked up, longer ones refused for their length.
func TestLoadZoneRefusesWhatIsNoZoneName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		want string // a substring of the error's message; "" for a zone
	}{
		{"Europe/Paris", ""},
		{"Etc/GMT+5", ""},
		{"Europe/./Paris", "IANA time zone name"},
		{"./UTC", "IANA time zone name"},
		{"Europe/Paris ", "IANA time zone name"},
		{"Europe/" + strings.Repeat("a", MaxZoneNameLen-len("Europe/")), "unknown time zone"},
		{"Europe/" + strings.Repeat("a", MaxZoneNameLen+1-len("Europe/")), "at most 64 bytes"},
	} {
		loc, err := LoadZone(tc.name)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if tc.want == "" && err != nil || tc.want != "" && (!strings.Contains(got, tc.want) || errorField(err) != "time_zone") {
			t.Errorf("LoadZone(%q) = %v, %q; want an error naming time_zone with %q", tc.name, loc, got, tc.want)
		}
	}
}

// TestDefaultCalendarBefore1970: the default calendar's days are UTC
// days, numbered from 1970-01-01 and rounded down before it, so that a
// midnight before 1970 starts its day rather than ending the one before.
func TestDefaultCalendarBefore1970(t *testing.T) {
	t.Parallel()
	var c Calendar
	day := func(s string) time.Time { d, _ := time.Parse(time.RFC3339, s); return d }
	for _, tc := range []struct {
		at, start string
		id        int64
	}{
		{"1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z", 0},
		{"1969-12-31T23:59:59Z", "1969-12-31T00:00:00Z", -1},
		{"1969-12-31T00:00:00Z", "1969-12-31T00:00:00Z", -1},
		{"1969-12-30T12:00:00Z", "1969-12-30T00:00:00Z", -2},
		{"1900-03-01T00:00:00Z", "1900-03-01T00:00:00Z", -25508},
	} {
		at := day(tc.at)
		start, end := c.Day(at)
		if id := c.DayID(at); id != tc.id || !start.Equal(day(tc.start)) || end.Sub(start) != 24*time.Hour {
			t.Errorf("%s: got day %d [%s, %s), want %d from %s, 24 hours", tc.at, id, start, end, tc.id, tc.start)
		}
	}
}

// tzif returns zone data (RFC 8536, version 2) with no transitions and
// the POSIX TZ rule rule, which then holds at every instant.
func tzif(rule string) []byte {
	header := func(typecnt, charcnt uint32) []byte {
		b := append([]byte("TZif2"), make([]byte, 15)...)
		for _, n := range []uint32{0, 0, 0, 0, typecnt, charcnt} { // isut, isstd, leap, time, type, char
			b = binary.BigEndian.AppendUint32(b, n)
		}
		return b
	}
	// one local time type (UTC, standard, designation "XST"), in the
	// version 1 block and again in the version 2 block
	types := []byte{0, 0, 0, 0, 0, 0, 'X', 'S', 'T', 0}
	b := append(header(1, 4), types...)
	b = append(b, header(1, 4)...)
	b = append(b, types...)
	return append(b, "\n"+rule+"\n"...)
}

// TestCalendarYearEndOfALeapYear: days start at local midnight in a zone
// whose rule changes its clock on the last and the first day of the year,
// across the end of a leap year, where Go reports the last interval of the
// year as ending a day early (see firstAtWall): the local day starts where
// the clock reads midnight, whatever it read the day before.
func TestCalendarYearEndOfALeapYear(t *testing.T) {
	t.Parallel()
	// UTC+1, and UTC+2 from Jan 1 01:00 to Dec 31 23:00 local time: the
	// clock goes back an hour at 23:00 on Dec 31 and forward at 01:00 on
	// Jan 1, an hour later.
	loc, err := time.LoadLocationFromTZData("Test/YearEnd", tzif("XST-1XDT-2,J1/1,J365/23"))
	if err != nil {
		t.Fatal(err)
	}
	c := Calendar{Zone: loc}
	at := func(s string) time.Time { d, _ := time.Parse(time.RFC3339, s); return d }
	for _, tc := range []struct{ at, start, end string }{
		// Jan 2 begins at 00:00 of UTC+2: 22:00 UTC
		{"2025-01-01T23:00:00Z", "2025-01-01T22:00:00Z", "2025-01-02T22:00:00Z"},
		{"2025-01-01T12:00:00Z", "2024-12-31T23:00:00Z", "2025-01-01T22:00:00Z"},
		{"2024-12-31T12:00:00Z", "2024-12-30T22:00:00Z", "2024-12-31T23:00:00Z"},
	} {
		start, end := c.Day(at(tc.at))
		if !start.Equal(at(tc.start)) || !end.Equal(at(tc.end)) {
			t.Errorf("day of %s: got [%s, %s), want [%s, %s)", tc.at, start.Format(time.RFC3339), end.Format(time.RFC3339), tc.start, tc.end)
		}
		if l := start.In(loc); l.Hour() != 0 || l.Minute() != 0 {
			t.Errorf("day of %s starts at %s local time, want midnight", tc.at, l)
		}
	}
}

// TestFloorMod: the offset of an instant into its UTC day (firstAtWall's
// next UTC midnight) is in 0..86399 before 1970 too.
func TestFloorMod(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ a, want int64 }{
		{0, 0}, {1, 1}, {daySeconds - 1, daySeconds - 1}, {daySeconds, 0}, {daySeconds + 5, 5},
		{-1, daySeconds - 1}, {-daySeconds, 0}, {-daySeconds - 5, daySeconds - 5},
	} {
		if got := floorMod(tc.a, daySeconds); got != tc.want {
			t.Errorf("floorMod(%d, %d) = %d, want %d", tc.a, daySeconds, got, tc.want)
		}
	}
}
