package api

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// skipNearMidnight skips a test whose daily quotas must not roll over
// while it runs.
func skipNearMidnight(t *testing.T) {
	t.Helper()
	now := time.Now().UTC()
	if quota.DayStart(now).AddDate(0, 0, 1).Sub(now) < 2*time.Minute {
		t.Skip("too close to midnight UTC: the daily quota would roll over during the test")
	}
}

// TestMeterQuotaRefusalDoesNotBlockOtherMeters: with demo.daily = 1, the
// second echo is refused naming demo.daily, and the deny cache keeps that
// refusal for meter demo only: POST /api/demo/report (meter report) is
// admitted, and echo stays refused.
func TestMeterQuotaRefusalDoesNotBlockOtherMeters(t *testing.T) {
	t.Parallel()
	skipNearMidnight(t)
	s := mustStack(t)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))}, func(t *quota.Tier) {
		t.MeterQuotas = []quota.MeterQuota{{Meter: "demo", DailyQuota: quota.Ptr(int64(1)), Overage: quota.OverageBlock}}
	})
	_, key := s.tenant(tier.Slug)
	base := s.start()
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
		t.Fatalf("first echo: %d %s", r.status, r.body)
	}
	for i := range 2 {
		r := do(t, "GET", base+"/api/demo/echo", key, "")
		if v, _ := r.json(t)["violated-policies"].([]any); r.status != 429 || len(v) != 1 || v[0] != "demo.daily" {
			t.Fatalf("echo %d after the first: %d %s, want 429 naming demo.daily", i+2, r.status, r.body)
		}
	}
	r := do(t, "POST", base+"/api/demo/report", key, "")
	if r.status != 201 {
		t.Fatalf("report after echo was refused by demo.daily: %d %s, want 201 (demo.daily does not limit meter report)", r.status, r.body)
	}
}

// TestTierRefusalFromTheDenyCacheShowsTheRequestsOwnMeter: a tier-wide
// refusal holds for every meter, and a meter answered from the deny cache
// gets the tier's RateLimit items, not those of the meter that was refused
// first.
func TestTierRefusalFromTheDenyCacheShowsTheRequestsOwnMeter(t *testing.T) {
	t.Parallel()
	skipNearMidnight(t)
	s := mustStack(t)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1))}, func(t *quota.Tier) {
		t.MeterQuotas = []quota.MeterQuota{{Meter: "demo", DailyQuota: quota.Ptr(int64(5)), Overage: quota.OverageBlock}}
	})
	_, key := s.tenant(tier.Slug)
	base := s.start()
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
		t.Fatalf("first echo: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 429 {
		t.Fatalf("second echo: %d %s, want 429", r.status, r.body)
	}
	r := do(t, "POST", base+"/api/demo/report", key, "")
	if v, _ := r.json(t)["violated-policies"].([]any); r.status != 429 || len(v) != 1 || v[0] != "daily" {
		t.Fatalf("report: %d %s, want 429 naming daily", r.status, r.body)
	}
	for _, h := range []string{"RateLimit", "RateLimit-Policy"} {
		if v := r.header.Get(h); strings.Contains(v, "demo.") || !strings.Contains(v, `"daily"`) {
			t.Fatalf("report's %s %q: want the daily item and none of meter demo", h, v)
		}
	}
}
