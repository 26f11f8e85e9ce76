package quota

import (
	"testing"
	"time"
)

// errorField returns the field a *Error names, "" for another error.
func errorField(err error) string {
	if e, ok := err.(*Error); ok {
		return e.Field
	}
	return ""
}

func TestCheckCalendar(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		day   int
		zone  string
		field string // "" for valid
	}{
		{1, "UTC", ""}, {28, "Europe/Paris", ""}, {15, "America/Argentina/ComodRivadavia", ""},
		{0, "UTC", "billing_anchor_day"}, {29, "UTC", "billing_anchor_day"}, {-1, "UTC", "billing_anchor_day"},
		{1, "", "time_zone"}, {1, "Local", "time_zone"}, {1, "Mars/Olympus", "time_zone"},
		{1, "Europe/" + string(make([]byte, 60)), "time_zone"}, {1, "../etc/passwd", "time_zone"},
	} {
		err := CheckCalendar(tc.day, tc.zone)
		var got string
		if e, ok := err.(*Error); ok {
			got = e.Field
		} else if err != nil {
			got = "?" + err.Error()
		}
		if got != tc.field {
			t.Errorf("CheckCalendar(%d, %q): got field %q (%v), want %q", tc.day, tc.zone, got, err, tc.field)
		}
	}
}

func TestPlanRequest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		eff      Effective
		from, to int
		want     Effective
	}{
		{"", 0, 10, EffectiveNow}, {"", 10, 0, EffectiveNextPeriod}, {"", 10, 10, EffectiveNow},
		{EffectiveNextPeriod, 0, 10, EffectiveNextPeriod}, {EffectiveNow, 10, 0, EffectiveNow},
	} {
		if got := (PlanRequest{Effective: tc.eff}).EffectiveFor(tc.from, tc.to); got != tc.want {
			t.Errorf("effective %q from rank %d to %d: got %q, want %q", tc.eff, tc.from, tc.to, got, tc.want)
		}
	}
	if err := (PlanRequest{Effective: "later"}).Validate(); errorField(err) != "effective" {
		t.Errorf("effective later: got %v, want an error naming effective", err)
	}
	if err := (PlanRequest{Quota: "keep"}).Validate(); errorField(err) != "quota" {
		t.Errorf("quota keep: got %v, want an error naming quota", err)
	}
	if got := (PlanRequest{}).QuotaMode(); got != QuotaCarry {
		t.Errorf("default quota: got %q, want carry", got)
	}
}

func TestNextPeriodStart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 18, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		day  int
		zone string
		want time.Time
	}{
		{1, "UTC", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{0, "", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{28, "UTC", time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)},
		{15, "UTC", time.Date(2026, 12, 15, 0, 0, 0, 0, time.UTC)},
		{1, "Europe/Paris", time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)},
	} {
		got := Tenant{BillingAnchorDay: tc.day, TimeZone: tc.zone}.NextPeriodStart(now)
		if !got.Equal(tc.want) {
			t.Errorf("anchor %d in %q: got %s, want %s", tc.day, tc.zone, got, tc.want)
		}
	}
}
