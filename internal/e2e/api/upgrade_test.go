package api

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// upgradeOf returns the tier slug of the upgrade hint of a problem or
// usage body, or "" for none.
func upgradeOf(tb testing.TB, body []byte) string {
	tb.Helper()
	var v struct {
		Upgrade *struct {
			Tier string `json:"tier"`
		} `json:"upgrade"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		tb.Fatalf("%s: %v", body, err)
	}
	if v.Upgrade == nil {
		return ""
	}
	return v.Upgrade.Tier
}

// TestUpgradeHintNeverProposesLess: the upgrade hint names the cheapest
// tier ranked higher that gives more room for the limit that refused and
// no less of any other limit, or none; never merely the next rank. The
// tiers are the test's own (ranked 1 to 5) beside the seeded ones (free 0,
// pro 10, enterprise 20), which all have burst limits these do not, and so
// give less.
func TestUpgradeHintNeverProposesLess(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	demo := func(daily int64) func(*quota.Tier) {
		return func(t *quota.Tier) {
			t.MeterQuotas = []quota.MeterQuota{{Meter: "demo", DailyQuota: quota.Ptr(daily), Overage: quota.OverageBlock}}
		}
	}
	price := func(cents int64) func(*quota.Tier) { return func(t *quota.Tier) { t.PriceCents = cents } }
	base := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(4))}, demo(2), price(0))
	// tiny: ranked above base, but 1 a day.
	s.tier(2, quota.Limits{DailyQuota: quota.Ptr(int64(1))}, price(100))
	// more: 50 a day, the same 2 of demo, the cheapest with more room a day.
	more := s.tier(3, quota.Limits{DailyQuota: quota.Ptr(int64(50))}, demo(2), price(200))
	// demo: more of demo too, dearer.
	demoTier := s.tier(4, quota.Limits{DailyQuota: quota.Ptr(int64(50))}, demo(10), price(900))
	// dearer: more of everything, dearest.
	s.tier(5, quota.Limits{DailyQuota: quota.Ptr(int64(500))}, demo(20), price(5000))
	_, key := s.tenant(base.Slug)
	api := s.start()

	if up := getUsage(t, api, key).Upgrade; up == nil || up.Tier != more.Slug {
		t.Errorf("/v1/usage upgrade %+v, want %s (tiny gives less a day; more is the cheapest that gives more)", up, more.Slug)
	}
	// The daily quota (4) refuses a report (cost 10): any tier with more a
	// day. (It costs more than the quota at all: no deny cache entry.)
	r := do(t, "POST", api+"/api/demo/report", key, "")
	if r.status != 429 || !strings.Contains(string(r.body), `"daily"`) {
		t.Fatalf("report: %d %s, want 429 by daily", r.status, r.body)
	}
	if got := upgradeOf(t, r.body); got != more.Slug {
		t.Errorf("daily refusal: upgrade %q, want %s: %s", got, more.Slug, r.body)
	}
	// /v1/check answers the hint of usage when it admits.
	tenantID := getUsage(t, api, key).TenantID
	c := do(t, "POST", api+"/v1/check", serviceToken, `{"tenant_id": "`+tenantID+`", "meter": "other", "cost": 1, "dry_run": true}`)
	if c.status != 200 || upgradeOf(t, c.body) != more.Slug {
		t.Errorf("/v1/check admitted: %d, upgrade %q, want %s: %s", c.status, upgradeOf(t, c.body), more.Slug, c.body)
	}
	// demo.daily (2) refuses the third echo: only tiers with more demo help.
	for i := range 2 {
		if r := do(t, "GET", api+"/api/demo/echo", key, ""); r.status != 200 {
			t.Fatalf("echo %d: %d %s", i, r.status, r.body)
		}
	}
	r = do(t, "GET", api+"/api/demo/echo", key, "")
	if r.status != 429 || !strings.Contains(string(r.body), "demo.daily") {
		t.Fatalf("third echo: %d %s, want 429 by demo.daily", r.status, r.body)
	}
	if got := upgradeOf(t, r.body); got != demoTier.Slug {
		t.Errorf("demo.daily refusal: upgrade %q, want %s: %s", got, demoTier.Slug, r.body)
	}
	// /v1/check answers the refusal's hint.
	c = do(t, "POST", api+"/v1/check", serviceToken, `{"tenant_id": "`+tenantID+`", "meter": "demo", "cost": 1, "dry_run": true}`)
	if c.status != 200 || upgradeOf(t, c.body) != demoTier.Slug {
		t.Errorf("/v1/check refused by demo.daily: %d, upgrade %q, want %s: %s", c.status, upgradeOf(t, c.body), demoTier.Slug, c.body)
	}
}

// TestConsoleWarnsOfTiersThatGiveLess: the console's tier list and editor
// warn of a tier ranked above one it gives less than, naming the limit.
func TestConsoleWarnsOfTiersThatGiveLess(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	tiny := s.tier(2, quota.Limits{DailyQuota: quota.Ptr(int64(5))})
	fine := s.tier(3, quota.Limits{DailyQuota: quota.Ptr(int64(5000))})
	api := s.start()
	c := newWebClient(t, api)
	c.mustSignIn("console", adminToken)
	list := string(c.get("/console/tiers").body)
	row := func(slug string) string {
		i := strings.Index(list, `<tr id="tier-`+slug+`"`)
		if i < 0 {
			t.Fatalf("no row of %s on the tier list", slug)
		}
		end := strings.Index(list[i:], "</tr>")
		return list[i : i+end]
	}
	if w := row(tiny.Slug); !strings.Contains(w, `class="warning"`) || !strings.Contains(w, base.Name) || !strings.Contains(w, "daily quota") {
		t.Errorf("tiny's row warns of nothing naming %s and its daily quota: %s", base.Name, w)
	}
	if w := row(fine.Slug); strings.Contains(w, `class="warning"`) {
		t.Errorf("fine's row warns: %s", w)
	}
	page := string(c.get("/console/tiers/" + tiny.Slug).body)
	if !strings.Contains(page, `class="warning"`) || !strings.Contains(page, base.Name) {
		t.Errorf("tiny's editor warns of nothing naming %s", base.Name)
	}
}
