package api

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// meterItem matches a RateLimit item of a meter quota.
var meterItem = regexp.MustCompile(`"([a-z0-9_.-]+\.(?:daily|monthly))";r=(\d+);t=(\d+)`)

// TestMeterQuotasThroughTheAPI: a tier's meter quotas, set through the admin
// API (bad ones refused with the field named, nothing stored), are enforced
// on metered requests with their own RateLimit items, a 429 naming
// demo.daily with Retry-After to the next UTC midnight, /v1/usage rows, and
// go away when the list is emptied.
func TestMeterQuotasThroughTheAPI(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	if quota.DayStart(now).AddDate(0, 0, 1).Sub(now) < 2*time.Minute {
		t.Skip("too close to midnight UTC: the daily quota would roll over during the test")
	}
	s := mustStack(t)
	base := s.start()
	slug := "metered-" + testenv.RandomHex(3)
	tier := func(mq string) string {
		return `{"slug": "` + slug + `", "name": "Metered", "rank": 61, "price_cents": 0, "burst_rate": null, "burst": null,
		"bucket_capacity": null, "bucket_refill_per_sec": null, "daily_quota": 1000, "monthly_quota": null,
		"overage": "block", "overage_price_cents_per_1k": 0, "fail_open": false, "upgrade_url": "", "meter_quotas": ` + mq + `}`
	}
	for _, bad := range []struct{ mq, field string }{
		{`[{"meter": "de\"mo", "daily_quota": 3, "monthly_quota": null, "overage": "block", "overage_price_cents_per_1k": 0}]`, "meter_quotas[0].meter"},
		{`[{"meter": "demo", "daily_quota": -1, "monthly_quota": null, "overage": "block", "overage_price_cents_per_1k": 0}]`, "meter_quotas[0].daily_quota"},
		{`[{"meter": "demo", "daily_quota": null, "monthly_quota": null, "overage": "block", "overage_price_cents_per_1k": 0}]`, "meter_quotas[0].daily_quota"},
		{`[{"meter": "demo", "daily_quota": 3, "monthly_quota": null, "overage": "bill", "overage_price_cents_per_1k": 5}]`, "meter_quotas[0].overage"},
		{`[{"meter": "demo", "daily_quota": 3, "monthly_quota": null, "overage": "block", "overage_price_cents_per_1k": 0},
		   {"meter": "demo", "daily_quota": 4, "monthly_quota": null, "overage": "block", "overage_price_cents_per_1k": 0}]`, "meter_quotas[1].meter"},
		{`[{"meter": "demo", "daily_quota": 3, "monthly_quota": null, "overage": "block", "overage_price_cents_per_1k": 0, "extra": 1}]`, ""},
		{`{"meter": "demo"}`, ""},
	} {
		r := admin(t, "POST", base+"/admin/v1/tiers", tier(bad.mq))
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.body), bad.field) {
			t.Fatalf("meter_quotas %s: %d %s, want 400 problem naming %q", bad.mq, r.status, r.body, bad.field)
		}
	}
	if r := admin(t, "GET", base+"/admin/v1/tiers/"+slug, ""); r.status != 404 {
		t.Fatalf("a refused tier exists: %d %s", r.status, r.body)
	}
	r := admin(t, "POST", base+"/admin/v1/tiers", tier(`[{"meter": "demo", "daily_quota": 3, "monthly_quota": null,
		"overage": "block", "overage_price_cents_per_1k": 0}]`))
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if mq, _ := r.json(t)["meter_quotas"].([]any); len(mq) != 1 {
		t.Fatalf("created tier's meter_quotas: %s", r.body)
	}
	_, key := s.tenant(slug)
	for i := range 3 {
		r := do(t, "GET", base+"/api/demo/echo", key, "")
		if r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		if p := r.header.Get("RateLimit-Policy"); !strings.Contains(p, `"demo.daily";q=3;w=86400`) {
			t.Fatalf("RateLimit-Policy %q lacks demo.daily", p)
		}
		m := meterItem.FindStringSubmatch(r.header.Get("RateLimit"))
		if m == nil || m[1] != "demo.daily" || m[2] != strconv.Itoa(2-i) {
			t.Fatalf("request %d: RateLimit %q, want demo.daily r=%d", i, r.header.Get("RateLimit"), 2-i)
		}
	}
	r = do(t, "GET", base+"/api/demo/echo", key, "")
	if r.status != 429 {
		t.Fatalf("4th request: %d %s", r.status, r.body)
	}
	p := r.json(t)
	if v, _ := p["violated-policies"].([]any); len(v) != 1 || v[0] != "demo.daily" {
		t.Fatalf("violated-policies %v, want [demo.daily]", p["violated-policies"])
	}
	ra, _ := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
	if want := quota.DayStart(time.Now()).AddDate(0, 0, 1).Unix() - time.Now().Unix(); ra < want-5 || ra > want+5 {
		t.Fatalf("Retry-After %d, want about %d (to midnight UTC)", ra, want)
	}
	u := do(t, "GET", base+"/v1/usage", key, "")
	var row map[string]any
	for _, l := range u.json(t)["limits"].([]any) {
		if l.(map[string]any)["name"] == "demo.daily" {
			row = l.(map[string]any)
		}
	}
	if row == nil || row["limit"] != 3.0 || row["remaining"] != 0.0 || row["window_seconds"] != 86400.0 {
		t.Fatalf("/v1/usage demo.daily row %v in %s", row, u.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tiers/"+slug, `{"meter_quotas": null}`); r.status != 200 || !strings.Contains(string(r.body), `"meter_quotas":[]`) {
		t.Fatalf("clear: %d %s", r.status, r.body)
	}
	deadline := time.Now().Add(10 * time.Second) // the catalog's invalidation reaches the api
	for {
		r := do(t, "GET", base+"/api/demo/echo", key, "")
		if r.status == 200 {
			if strings.Contains(r.header.Get("RateLimit-Policy"), "demo.daily") {
				t.Fatalf("cleared meter quota still in headers: %s", r.header.Get("RateLimit-Policy"))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after clearing the meter quotas: %d %s", r.status, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
