package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestApplyGrantAddsOnce: a recorded grant applied any number of times adds
// its units once; a grant of another period writes nothing; a grant without
// an id adds at every call, as before.
func TestApplyGrantAddsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	day, month := quota.DayStart(now), quota.MonthStart(now)
	grantOf := func(period string) int64 {
		t.Helper()
		st := stateOf(t, c, r, tenant)
		if period == "day" {
			return st.Day.Grant
		}
		return st.Month.Grant
	}
	for _, tc := range []struct {
		name, id, period string
		start            time.Time
		units            int64
		wantApplied      bool
		wantDay, wantMon int64
	}{
		{"a day grant", "g1", "day", day, 5, true, 5, 0},
		{"the same again", "g1", "day", day, 5, true, 5, 0},
		{"another grant", "g2", "day", day, 7, true, 12, 0},
		{"a month grant", "g3", "month", month, 100, true, 12, 100},
		{"the month grant again", "g3", "month", month, 100, true, 12, 100},
		{"yesterday's grant", "g4", "day", day.AddDate(0, 0, -1), 50, false, 12, 100},
		{"last month's grant", "g5", "month", month.AddDate(0, -1, 0), 50, false, 12, 100},
	} {
		applied, err := r.ApplyGrant(ctx, tenant, quota.Calendar{}, tc.id, tc.period, tc.start, tc.units)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if applied != tc.wantApplied {
			t.Errorf("%s: got applied %v, want %v", tc.name, applied, tc.wantApplied)
		}
		if tc.wantMon == 0 {
			if got := grantOf("day"); got != tc.wantDay {
				t.Errorf("%s: got day grant %d, want %d", tc.name, got, tc.wantDay)
			}
			continue
		}
		if d, m := grantOf("day"), grantOf("month"); d != tc.wantDay || m != tc.wantMon {
			t.Errorf("%s: got day grant %d month %d, want %d and %d", tc.name, d, m, tc.wantDay, tc.wantMon)
		}
	}
	for range 2 {
		if err := r.Grant(ctx, tenant, "day", 1, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := grantOf("day"); got != 14 {
		t.Errorf("after two grants without an id: got day grant %d, want 14", got)
	}
	if _, err := r.ApplyGrant(ctx, tenant, quota.Calendar{}, "", "day", day, 1); quota.ErrorCode(err) != quota.CodeInvalid {
		t.Errorf("a grant without an id: got %v, want a %s error", err, quota.CodeInvalid)
	}
}
