package pages

import (
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

func TestPeriodLabel(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		anchor int
		loc    *time.Location
		at     time.Time
		want   string
	}{
		{15, ny, time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC), "Nov 15 – Dec 15, 2026 (America/New_York)"},
		{15, ny, time.Date(2026, 12, 20, 12, 0, 0, 0, time.UTC), "Dec 15, 2026 – Jan 15, 2027 (America/New_York)"},
		// 03:00 UTC on the 15th is still the 14th in New York: the period before.
		{15, ny, time.Date(2026, 11, 15, 3, 0, 0, 0, time.UTC), "Oct 15 – Nov 15, 2026 (America/New_York)"},
		{1, time.UTC, time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC), "Feb 1 – Mar 1, 2026 (UTC)"},
	} {
		start, end := quota.Calendar{AnchorDay: tc.anchor, Zone: tc.loc}.Period(tc.at)
		if got := periodLabel(start, end, tc.loc); got != tc.want {
			t.Errorf("anchor %d in %s at %s: got %q, want %q", tc.anchor, tc.loc, tc.at, got, tc.want)
		}
	}
}

func TestCreditAmount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int64 // 0: refused
	}{
		{"25", 2500}, {"25.5", 2550}, {"25.50", 2550}, {"$1,250.05", 125005}, {" 0.01 ", 1},
		{"0", 0}, {"0.00", 0}, {"-5", 0}, {"2.555", 0}, {"1,25", 0}, {"1e3", 0}, {"", 0}, {".5", 0}, {"5.", 0},
		{"10995116277.76", 1099511627776}, {"10995116277.77", 0}, {"99999999999999999999", 0},
	} {
		errs := formErrors{}
		got := creditAmount(errs, map[string]string{"amount": tc.in})
		if got != tc.want || (tc.want == 0) != (errs["amount"] != "") {
			t.Errorf("%q: got %d (error %q), want %d", tc.in, got, errs["amount"], tc.want)
		}
	}
}

func TestMeterQuotasFromForm(t *testing.T) {
	t.Parallel()
	f := map[string]string{
		"mq-0-meter": "search", "mq-0-daily_quota": "1,000", "mq-0-overage": "block", "mq-0-overage_price_cents_per_1k": "0",
		"mq-1-meter": "", "mq-1-daily_quota": "", "mq-1-overage": "block", "mq-1-overage_price_cents_per_1k": "0", // blank
		"mq-2-meter": "export", "mq-2-monthly_quota": "5", "mq-2-remove": "on",
		"mq-3-meter": "search", "mq-3-monthly_quota": "7", "mq-3-overage": "block",
	}
	errs := formErrors{}
	qs, rows := meterQuotasFromForm(errs, f)
	if len(qs) != 2 || len(rows) != 2 || rows[1] != 3 || *qs[0].DailyQuota != 1000 {
		t.Fatalf("got %+v from rows %v", qs, rows)
	}
	if got := errs["mq-3-meter"]; got == "" {
		t.Errorf("the duplicate meter of row 3 has no error beside it: %v", errs)
	}
	// an error the store names is shown beside the row it came from
	err := meterQuotaError(quota.FieldError("meter_quotas[1].overage", "bad"), rows)
	var qe *quota.Error
	if !errors.As(err, &qe) || qe.Field != "mq-3-overage" {
		t.Errorf("meter_quotas[1].overage became %v", err)
	}
}
