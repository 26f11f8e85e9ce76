package api

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// tenantOf decodes a tenant answer.
func tenantOf(tb testing.TB, r reply) quota.Tenant {
	tb.Helper()
	var t quota.Tenant
	if err := json.Unmarshal(r.body, &t); err != nil {
		tb.Fatalf("tenant %q: %v", r.body, err)
	}
	return t
}

// TestAdminTenantCalendarFields: billing_anchor_day and time_zone default
// to 1 and UTC, are taken on POST and PATCH, shown on GET and in the list,
// and bad values are a 400 problem naming the field that creates or
// changes nothing.
func TestAdminTenantCalendarFields(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	r := admin(t, "POST", base+"/admin/v1/tenants", `{"name": "Plain", "tier": "free"}`)
	if got := tenantOf(t, r); r.status != 201 || got.BillingAnchorDay != 1 || got.TimeZone != "UTC" || got.PendingChange != nil ||
		!strings.Contains(string(r.body), `"pending_change":null`) {
		t.Fatalf("defaults: %d %s, want 201 with anchor 1, UTC and pending_change null", r.status, r.body)
	}
	r = admin(t, "POST", base+"/admin/v1/tenants", `{"name": "Paris", "tier": "free", "billing_anchor_day": 15, "time_zone": "Europe/Paris"}`)
	paris := tenantOf(t, r)
	if r.status != 201 || paris.BillingAnchorDay != 15 || paris.TimeZone != "Europe/Paris" {
		t.Fatalf("create with a calendar: %d %s", r.status, r.body)
	}
	for _, tc := range []struct{ body, field string }{
		{`"billing_anchor_day": 0`, "billing_anchor_day"}, {`"billing_anchor_day": 29`, "billing_anchor_day"},
		{`"time_zone": "Local"`, "time_zone"}, {`"time_zone": ""`, "time_zone"}, {`"time_zone": "Mars/Olympus"`, "time_zone"},
		{`"time_zone": "` + strings.Repeat("A", 65) + `"`, "time_zone"}, {`"time_zone": "posix/UTC"`, "time_zone"},
	} {
		r := admin(t, "POST", base+"/admin/v1/tenants", `{"name": "Refused", "tier": "free", `+tc.body+`}`)
		if r.status != 400 || r.json(t)["field"] != tc.field || !strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
			t.Errorf("POST with %s: %d %s, want a 400 problem naming %s", tc.body, r.status, r.body, tc.field)
		}
		r = admin(t, "PATCH", base+"/admin/v1/tenants/"+paris.ID, `{`+tc.body+`}`)
		if r.status != 400 || r.json(t)["field"] != tc.field {
			t.Errorf("PATCH with %s: %d %s, want 400 naming %s", tc.body, r.status, r.body, tc.field)
		}
	}
	if r := admin(t, "GET", base+"/admin/v1/tenants?q=Refused", ""); !strings.Contains(string(r.body), `"items":[]`) {
		t.Errorf("refused creations left tenants: %s", r.body)
	}
	r = admin(t, "PATCH", base+"/admin/v1/tenants/"+paris.ID, `{"billing_anchor_day": 28, "time_zone": "America/New_York"}`)
	if got := tenantOf(t, r); r.status != 200 || got.BillingAnchorDay != 28 || got.TimeZone != "America/New_York" {
		t.Fatalf("PATCH calendar: %d %s", r.status, r.body)
	}
	if got := tenantOf(t, admin(t, "GET", base+"/admin/v1/tenants/"+paris.ID, "")); got.BillingAnchorDay != 28 || got.TimeZone != "America/New_York" {
		t.Errorf("GET after PATCH: %+v", got)
	}
	if r := admin(t, "GET", base+"/admin/v1/tenants?q="+paris.ID, ""); !strings.Contains(string(r.body), `"billing_anchor_day":28,"time_zone":"America/New_York"`) {
		t.Errorf("list: %s, want the calendar", r.body)
	}
	audit := admin(t, "GET", base+"/admin/v1/audit?entity=tenant&entity_id="+paris.ID, "")
	if !strings.Contains(string(audit.body), `"time_zone":"America/New_York"`) || !strings.Contains(string(audit.body), `"time_zone":"Europe/Paris"`) {
		t.Errorf("audit: %s, want the change from Europe/Paris to America/New_York", audit.body)
	}
}

// TestAdminPlanChanges: a higher rank applies now and a lower one at the
// next period by default, effective overrides either; a pending change is
// shown, replaced, cancelled, and cleared by a change made now; quota
// carry keeps the day's usage and reset empties it, as the next
// admission's RateLimit header shows; bad bodies are 400 naming the field
// and change nothing.
func TestAdminPlanChanges(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tenant, key := s.tenant("free")
	url := base + "/admin/v1/tenants/" + tenant.ID
	call := func() map[string]int64 {
		t.Helper()
		r := do(t, "GET", base+"/api/demo/echo", key, "")
		if r.status != 200 {
			t.Fatalf("request: %d %s", r.status, r.body)
		}
		return remaining(t, r.header)
	}
	patch := func(body string) quota.Tenant {
		t.Helper()
		r := admin(t, "PATCH", url, body)
		if r.status != 200 {
			t.Fatalf("PATCH %s: %d %s", body, r.status, r.body)
		}
		return tenantOf(t, r)
	}
	call()
	if got := call()["daily"]; got != 1000-2 {
		t.Fatalf("free: daily remaining %d, want 998", got)
	}

	// Upgrade: now by default, usage carried.
	if got := patch(`{"tier": "pro"}`); got.Tier != "pro" || got.PendingChange != nil {
		t.Fatalf("upgrade: %+v, want pro now", got)
	}
	if got := call()["daily"]; got != 50000-3 {
		t.Fatalf("after the upgrade: daily remaining %d, want %d (carried)", got, 50000-3)
	}

	// Downgrade: at the next period by default.
	before := time.Now().UTC()
	got := patch(`{"tier": "free"}`)
	next := quota.MonthStart(time.Now()).AddDate(0, 1, 0)
	if p := got.PendingChange; got.Tier != "pro" || p == nil || p.Tier != "free" || !p.EffectiveAt.Equal(next) ||
		p.Quota != quota.QuotaCarry || p.RequestedAt.Before(before.Add(-time.Second)) || p.RequestedAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("downgrade: %+v %+v, want pro with free pending from %s", got, got.PendingChange, next)
	}
	if got := call()["daily"]; got != 50000-4 {
		t.Fatalf("with a pending downgrade: daily remaining %d, want pro's %d", got, 50000-4)
	}
	if r := admin(t, "GET", url, ""); !strings.Contains(string(r.body), `"pending_change":{"tier":"free","effective_at":"`+next.Format(time.RFC3339)) {
		t.Errorf("GET: %s, want the pending change", r.body)
	}
	if r := admin(t, "GET", base+"/admin/v1/tenants?q="+tenant.ID, ""); !strings.Contains(string(r.body), `"pending_change":{"tier":"free"`) {
		t.Errorf("list: %s, want the pending change", r.body)
	}

	// Replaced by another, explicit, with quota reset; cancelled.
	if got := patch(`{"tier": "enterprise", "effective": "next_period", "quota": "reset"}`); got.Tier != "pro" ||
		got.PendingChange == nil || got.PendingChange.Tier != "enterprise" || got.PendingChange.Quota != quota.QuotaReset {
		t.Fatalf("replaced: %+v %+v", got, got.PendingChange)
	}
	if got := patch(`{"pending_change": null}`); got.Tier != "pro" || got.PendingChange != nil {
		t.Fatalf("cancelled: %+v %+v", got, got.PendingChange)
	}
	// The tier it is on: nothing pending, nothing changes.
	patch(`{"tier": "free"}`)
	if got := patch(`{"tier": "pro"}`); got.Tier != "pro" || got.PendingChange != nil {
		t.Fatalf("the same tier: %+v %+v, want pro with nothing pending", got, got.PendingChange)
	}

	// Bad bodies change nothing.
	patch(`{"tier": "free"}`)
	want := admin(t, "GET", url, "").body
	for _, tc := range []struct{ body, field string }{
		{`{"effective": "now"}`, "effective"}, {`{"quota": "reset"}`, "quota"},
		{`{"tier": "enterprise", "effective": "later"}`, "effective"}, {`{"tier": "enterprise", "quota": "keep"}`, "quota"},
		{`{"tier": "enterprise", "effective": null}`, "effective"}, {`{"tier": null}`, "tier"},
		{`{"tier": "nope"}`, "tier"}, {`{"pending_change": {"tier": "enterprise"}}`, "pending_change"},
		{`{"name": "Renamed", "tier": "enterprise", "quota": "later"}`, "quota"},
	} {
		r := admin(t, "PATCH", url, tc.body)
		if r.status != 400 || r.json(t)["field"] != tc.field || !strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
			t.Errorf("PATCH %s: %d %s, want a 400 problem naming %s", tc.body, r.status, r.body, tc.field)
		}
	}
	if got := admin(t, "GET", url, "").body; string(got) != string(want) {
		t.Errorf("after refused PATCHes:\n got %s\nwant %s", got, want)
	}

	// An upgrade now with quota reset clears the pending change and empties
	// the counters: the next admission is the first of the day and month.
	r := admin(t, "PATCH", url, `{"tier": "enterprise", "quota": "reset"}`)
	if got := tenantOf(t, r); r.status != 200 || got.Tier != "enterprise" || got.PendingChange != nil || r.header.Get("Tollgate-Quota-Reset") != "applied" {
		t.Fatalf("upgrade with reset: %d %s, Tollgate-Quota-Reset %q", r.status, r.body, r.header.Get("Tollgate-Quota-Reset"))
	}
	if got := call()["monthly"]; got != 20_000_000-1 {
		t.Fatalf("after the reset: monthly remaining %d, want %d", got, 20_000_000-1)
	}
	// A downgrade made now, carrying: the month's request stays counted
	// (enterprise has no daily quota: its request counted in no day).
	if got := patch(`{"tier": "free", "effective": "now"}`); got.Tier != "free" || got.PendingChange != nil {
		t.Fatalf("downgrade now: %+v", got)
	}
	if got := call(); got["daily"] != 1000-1 || got["monthly"] != 10_000-2 {
		t.Fatalf("after the downgrade now: daily remaining %d, monthly %d; want 999 and 9998 (carried)", got["daily"], got["monthly"])
	}
}

// TestAdminQuotaResetInTheTenantsCalendar: a reset empties the counters of
// the tenant's own day and billing month (anchor 28 in UTC+14, whose days
// and months are not UTC's), as the next admission shows.
func TestAdminQuotaResetInTheTenantsCalendar(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tenant, key := s.tenant("free")
	url := base + "/admin/v1/tenants/" + tenant.ID
	if r := admin(t, "PATCH", url, `{"billing_anchor_day": 28, "time_zone": "Pacific/Kiritimati"}`); r.status != 200 {
		t.Fatalf("calendar: %d %s", r.status, r.body)
	}
	for range 3 {
		do(t, "GET", base+"/api/demo/echo", key, "")
	}
	if got := remaining(t, do(t, "GET", base+"/api/demo/echo", key, "").header); got["daily"] != 1000-4 || got["monthly"] != 10_000-4 {
		t.Fatalf("before: %v, want daily 996 and monthly 9996", got)
	}
	r := admin(t, "PATCH", url, `{"tier": "pro", "quota": "reset"}`)
	if r.status != 200 || r.header.Get("Tollgate-Quota-Reset") != "applied" {
		t.Fatalf("upgrade with reset: %d %s, Tollgate-Quota-Reset %q", r.status, r.body, r.header.Get("Tollgate-Quota-Reset"))
	}
	if got := remaining(t, do(t, "GET", base+"/api/demo/echo", key, "").header); got["daily"] != 50_000-1 || got["monthly"] != 1_000_000-1 {
		t.Fatalf("after the reset: %v, want daily 49999 and monthly 999999", got)
	}
}

// TestUpgradeStartsTheBurstLimitsFresh: a tenant moved to a tier whose
// burst limits are each at least as large (a higher rate and a larger
// burst, for GCRA and the token bucket) is admitted at once, with the new
// tier's whole burst: the old tier's debt (a request per 1,000 s) is not
// carried. A move down still clamps the debt to the new limits' worst
// case: from 3 requests per 300 s spent to 1 per 100 s, the next request
// waits one new interval (100 s), not the old debt.
func TestUpgradeStartsTheBurstLimitsFresh(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	burst := func(rate float64, n int64) quota.Limits {
		return quota.Limits{BurstRate: &rate, Burst: &n, BucketCapacity: &n, BucketRefillPerSec: &rate}
	}
	slow, fast := s.tier(8101, burst(0.001, 1)), s.tier(8102, burst(100, 100))
	big, small := s.tier(8103, burst(0.01, 3)), s.tier(8100, burst(0.01, 1))
	call := func(key string) reply {
		t.Helper()
		return do(t, "GET", base+"/api/demo/echo", key, "")
	}
	move := func(tenant quota.Tenant, tier quota.Tier) {
		t.Helper()
		if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"tier": "`+tier.Slug+`", "effective": "now"}`); r.status != 200 || tenantOf(t, r).Tier != tier.Slug {
			t.Fatalf("move to %s: %d %s", tier.Slug, r.status, r.body)
		}
	}

	up, upKey := s.tenant(slow.Slug)
	if r := call(upKey); r.status != 200 {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	if r := call(upKey); r.status != 429 {
		t.Fatalf("second request on a tier of one request per 1,000 s: %d, want 429", r.status)
	}
	move(up, fast)
	r := call(upKey)
	if r.status != 200 {
		t.Fatalf("after the upgrade: %d (Retry-After %q) %s, want 200", r.status, r.header.Get("Retry-After"), r.body)
	}
	if got := remaining(t, r.header); got["burst"] != 99 || got["bucket"] != 99 {
		t.Fatalf("after the upgrade: %v, want the new tier's burst and bucket, less this request (99 each)", got)
	}

	down, downKey := s.tenant(big.Slug)
	for i := range 3 {
		if r := call(downKey); r.status != 200 {
			t.Fatalf("request %d of a burst of 3: %d %s", i, r.status, r.body)
		}
	}
	move(down, small)
	r = call(downKey)
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if r.status != 429 || err != nil || ra < 99 || ra > 100 {
		t.Fatalf("after a move down: %d, Retry-After %q; want 429 waiting one new interval (100 s), not the old debt (300 s)",
			r.status, r.header.Get("Retry-After"))
	}
}
