package api

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// TestTierEditCannotBreakItsTenantsLimits: a tier change that would leave a
// tenant's effective limits (the tier's with the tenant's overrides)
// invalid is refused with 409 naming the tenant and the reason, and changes
// nothing: before the fix it was stored, and every call of that tenant then
// answered 400.
func TestTierEditCannotBreakItsTenantsLimits(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(31, quota.Limits{BurstRate: quota.Ptr(1000.0), Burst: quota.Ptr(int64(20)), DailyQuota: quota.Ptr(int64(1000))})
	tierURL := base + "/admin/v1/tiers/" + tier.Slug

	// half overrides one half of the GCRA pair; wide overrides the burst
	// to a size whose window only a fast rate keeps within the bounds;
	// both overrides both halves and so does not depend on the tier's.
	half, halfKey := s.tenant(tier.Slug)
	wide, wideKey := s.tenant(tier.Slug)
	both, bothKey := s.tenant(tier.Slug)
	_, plainKey := s.tenant(tier.Slug)
	for _, o := range []struct{ id, overrides string }{
		{half.ID, `{"burst_rate": 500}`},
		{wide.ID, fmt.Sprintf(`{"burst": %d}`, quota.MaxQuantity)},
		{both.ID, `{"burst_rate": 2, "burst": 3}`},
	} {
		if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+o.id, `{"overrides": `+o.overrides+`}`); r.status != 200 {
			t.Fatalf("overrides %s: %d %s", o.overrides, r.status, r.body)
		}
	}
	for _, tc := range []struct {
		name, patch string
		bad         []string // the tenants the change must name
		reason      string   // in the problem's detail
	}{
		{"the pair set to null", `{"burst_rate": null, "burst": null}`, []string{half.ID}, "burst_rate and burst are both set or both null"},
		{"a window beyond the bounds", `{"burst_rate": 1}`, []string{wide.ID}, "burst / burst_rate must be at most"},
	} {
		r := admin(t, "PATCH", tierURL, tc.patch)
		if r.status != 409 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: status %d (%s), want 409 problem+json", tc.name, r.status, r.body)
			continue
		}
		detail, _ := r.json(t)["detail"].(string)
		for _, id := range tc.bad {
			if !strings.Contains(detail, id) {
				t.Errorf("%s: detail %q does not name tenant %s", tc.name, detail, id)
			}
		}
		for _, id := range []string{both.ID} {
			if strings.Contains(detail, id) {
				t.Errorf("%s: detail %q names tenant %s, whose limits stay valid", tc.name, detail, id)
			}
		}
		if !strings.Contains(detail, tc.reason) {
			t.Errorf("%s: detail %q does not give the reason %q", tc.name, detail, tc.reason)
		}
	}
	// Nothing changed: the tier is as it was and every tenant is served.
	got := admin(t, "GET", tierURL, "").json(t)
	if got["burst_rate"] != 1000.0 || got["burst"] != 20.0 {
		t.Errorf("tier after the refused changes: burst_rate %v burst %v, want 1000 and 20", got["burst_rate"], got["burst"])
	}
	for _, key := range []string{halfKey, wideKey, bothKey, plainKey} {
		if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
			t.Errorf("a tenant's call after the refused changes: %d %s, want 200", r.status, r.body)
		}
	}
	// A change every tenant's limits survive still goes through.
	if r := admin(t, "PATCH", tierURL, `{"burst_rate": 1200, "daily_quota": 900}`); r.status != 200 {
		t.Fatalf("a harmless change: %d %s, want 200", r.status, r.body)
	}
	if r := do(t, "GET", base+"/api/demo/echo", halfKey, ""); r.status != 200 || !strings.Contains(r.header.Get("RateLimit-Policy"), `"daily";q=900;`) {
		t.Errorf("after the harmless change: %d policy %q, want 200 with daily 900", r.status, r.header.Get("RateLimit-Policy"))
	}
}
