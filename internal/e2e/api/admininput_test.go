package api

import (
	"context"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// TestAdminRefusesBadInputOnEveryRoute: on every admin create and patch
// route, a blank name (or one with whitespace around it), a member named
// twice (in any case, at any depth) and a body that is not an object
// (null) are 400 problems naming what is wrong, and change nothing (no
// audit entry). The same holds for the service routes' bodies.
func TestAdminRefusesBadInputOnEveryRoute(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tenant, _ := s.tenant("free")
	key := admin(t, "POST", base+"/admin/v1/tenants/"+tenant.ID+"/keys", `{"name": "k"}`).json(t)["id"].(string)
	if r := admin(t, "POST", base+"/admin/v1/policies", `{"name": "p1", "algorithm": "fixed_window", "limit": 5, "window_seconds": 60}`); r.status != 201 {
		t.Fatalf("create policy: %d %s", r.status, r.body)
	}
	tiers := "/admin/v1/tiers"
	tenants := "/admin/v1/tenants"
	one := tenants + "/" + tenant.ID
	tierBody := func(name string) string {
		return `{"slug": "t-blank", "name": ` + name + `, "rank": 31, "price_cents": 0, "overage": "block"}`
	}
	before := auditCount(t, s)
	for _, tc := range []struct {
		method, path, body, field string
		token                     string // default: the admin token
	}{
		// blank names, and names with whitespace around them
		{"POST", tiers, tierBody(`"   "`), "name", ""},
		{"POST", tiers, tierBody(`"\t\n"`), "name", ""},
		{"POST", tiers, tierBody(`"\u200b"`), "name", ""},
		{"POST", tiers, tierBody(`" Gold"`), "name", ""},
		{"PATCH", tiers + "/free", `{"name": " "}`, "name", ""},
		{"PATCH", tiers + "/free", `{"name": "Free\u00a0"}`, "name", ""},
		{"POST", tenants, `{"name": "   ", "tier": "free"}`, "name", ""},
		{"POST", tenants, `{"name": "Acme ", "tier": "free"}`, "name", ""},
		{"POST", tenants, `{"name": "Ac\u0007me", "tier": "free"}`, "name", ""},
		{"PATCH", one, `{"name": "  "}`, "name", ""},
		{"POST", one + "/keys", `{"name": "   "}`, "name", ""},
		{"POST", "/admin/v1/keys/" + key + "/rotate", `{"grace_seconds": 0, "name": " "}`, "name", ""},
		{"POST", one + "/credits", `{"amount_cents": 100, "reason": "  "}`, "reason", ""},
		// a member named twice, in the same spelling or another case
		{"POST", tenants, `{"name": "A", "name": "B", "tier": "free"}`, "name", ""},
		{"POST", tenants, `{"name": "A", "Name": "B", "tier": "free"}`, "Name", ""},
		{"POST", tenants, `{"name": "A", "n\u0061me": "B", "tier": "free"}`, "name", ""},
		{"POST", tenants, `{"name": "A", "tier": "free", "overrides": {"daily_quota": 1, "daily_quota": 2}}`, "overrides.daily_quota", ""},
		{"PATCH", one, `{"status": "active", "status": "suspended"}`, "status", ""},
		{"PATCH", one, `{"overrides": {"burst": 1, "BURST": 2}}`, "overrides.BURST", ""},
		{"POST", tiers, strings.Replace(tierBody(`"T"`), `"rank": 31`, `"rank": 31, "rank": 32`, 1), "rank", ""},
		{"PATCH", tiers + "/free", `{"meter_quotas": [{"meter": "demo", "daily_quota": 1, "daily_quota": 9, "overage": "block"}]}`,
			"meter_quotas[0].daily_quota", ""},
		{"POST", one + "/keys", `{"name": "a", "name": "b"}`, "name", ""},
		{"POST", one + "/grants", `{"period": "day", "units": 1, "units": 1000}`, "units", ""},
		{"POST", one + "/credits", `{"amount_cents": 1, "reason": "x", "amount_cents": 100000}`, "amount_cents", ""},
		{"POST", "/admin/v1/policies", `{"name": "p2", "algorithm": "fixed_window", "limit": 5, "limit": 500, "window_seconds": 60}`, "limit", ""},
		{"PATCH", "/admin/v1/policies/p1", `{"limit": 5, "limit": 500}`, "limit", ""},
		{"POST", "/v1/check", `{"tenant_id": "` + tenant.ID + `", "meter": "demo", "cost": 1, "cost": 0}`, "cost", serviceToken},
		{"POST", "/v1/settle", `{"request_id": "x", "actual_cost": 1, "actual_cost": 2}`, "actual_cost", serviceToken},
		// bodies that are not an object
		{"PATCH", one, `null`, "", ""},
		{"PATCH", tiers + "/free", `null`, "", ""},
		{"PATCH", "/admin/v1/policies/p1", ` null `, "", ""},
		{"POST", tiers, `null`, "", ""},
		{"POST", tenants, `null`, "", ""},
		{"POST", one + "/keys", `null`, "", ""},
		{"POST", "/admin/v1/keys/" + key + "/rotate", `null`, "", ""},
		{"POST", one + "/grants", `null`, "", ""},
		{"POST", one + "/credits", `null`, "", ""},
		{"POST", "/admin/v1/policies", `null`, "", ""},
		{"POST", "/v1/check", `null`, "", serviceToken},
		{"POST", "/v1/settle", `null`, "", serviceToken},
		{"PATCH", one, `"name"`, "", ""},
		{"PATCH", one, `{}{}`, "", ""},
		{"PATCH", one, "\ufeff{\"name\": \"BOM\"}", "", ""},
		{"PATCH", one, `{"pending_change": ` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + "}", "pending_change", ""},
	} {
		tok := tc.token
		if tok == "" {
			tok = adminToken
		}
		r := do(t, tc.method, base+tc.path, tok, tc.body)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s %s: %d, want a 400 problem: %s", tc.method, tc.path, tc.body, r.status, r.body)
			continue
		}
		if got, _ := r.json(t)["field"].(string); got != tc.field {
			t.Errorf("%s %s %s: field %q, want %q: %s", tc.method, tc.path, tc.body, got, tc.field, r.body)
		}
	}
	if after := auditCount(t, s); after != before {
		t.Errorf("refused bodies wrote %d audit entries", after-before)
	}
	if got := admin(t, "GET", base+one, "").json(t); got["name"] != tenant.Name || got["status"] != "active" {
		t.Errorf("the tenant after refused patches: %v", got)
	}

	// Names differing only in case are different keys of a map (a
	// policy's exceptions), and a patch that changes nothing writes
	// nothing.
	r := admin(t, "POST", base+"/admin/v1/policies", `{"name": "per-user", "algorithm": "fixed_window", "limit": 5,
		"window_seconds": 60, "scope": "param", "param": "header:X-User", "exceptions": {"ann": 10, "Ann": 20}}`)
	if r.status != 201 {
		t.Errorf("exceptions differing in case only: %d, want 201: %s", r.status, r.body)
	}
	before = auditCount(t, s)
	for _, path := range []string{one, tiers + "/free", "/admin/v1/policies/p1"} {
		if r := admin(t, "PATCH", base+path, `{}`); r.status != 200 {
			t.Errorf("PATCH %s {}: %d, want 200: %s", path, r.status, r.body)
		}
	}
	if r := admin(t, "PATCH", base+one, `{"name": "`+tenant.Name+`"}`); r.status != 200 {
		t.Errorf("PATCH the same name: %d, want 200: %s", r.status, r.body)
	}
	if after := auditCount(t, s); after != before {
		t.Errorf("patches that change nothing wrote %d audit entries", after-before)
	}
}

// TestAdminConflictsAre409: a create or patch that collides with another
// resource is 409 naming the field, a duplicate rank as a duplicate slug.
func TestAdminConflictsAre409(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	for _, tc := range []struct{ method, path, body, field string }{
		{"POST", "/admin/v1/tiers", `{"slug": "free", "name": "F", "rank": 41, "price_cents": 0, "overage": "block"}`, "slug"},
		{"POST", "/admin/v1/tiers", `{"slug": "r10", "name": "R", "rank": 10, "price_cents": 0, "overage": "block"}`, "rank"},
		{"PATCH", "/admin/v1/tiers/free", `{"rank": 10}`, "rank"},
	} {
		r := admin(t, tc.method, base+tc.path, tc.body)
		if r.status != 409 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s %s: %d, want a 409 problem: %s", tc.method, tc.path, tc.body, r.status, r.body)
			continue
		}
		if got := r.json(t)["field"]; got != tc.field {
			t.Errorf("%s %s %s: field %v, want %q", tc.method, tc.path, tc.body, got, tc.field)
		}
	}
}

// TestAdminCreatedHasLocation: every 201 of the admin API carries
// Location, the path of the new resource, which answers GET with it.
func TestAdminCreatedHasLocation(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tenant, _ := s.tenant("free")
	one := "/admin/v1/tenants/" + tenant.ID
	var keyID string
	for _, tc := range []struct {
		path, body, header string
		location           func(body map[string]any) string
	}{
		{"/admin/v1/tiers", `{"slug": "loc", "name": "Loc", "rank": 42, "price_cents": 0, "overage": "block"}`, "",
			func(b map[string]any) string { return "/admin/v1/tiers/loc" }},
		{"/admin/v1/tenants", `{"name": "Loc", "tier": "free"}`, "",
			func(b map[string]any) string { return "/admin/v1/tenants/" + b["id"].(string) }},
		{one + "/keys", `{"name": "k"}`, "",
			func(b map[string]any) string { keyID = b["id"].(string); return "/admin/v1/keys/" + keyID }},
		{"/admin/v1/policies", `{"name": "loc", "algorithm": "fixed_window", "limit": 5, "window_seconds": 60}`, "",
			func(b map[string]any) string { return "/admin/v1/policies/loc" }},
		{one + "/grants", `{"period": "day", "units": 5}`, "g-1",
			func(b map[string]any) string { return one + "/grants/" + b["id"].(string) }},
		{one + "/credits", `{"amount_cents": 100, "reason": "welcome"}`, "c-1",
			func(b map[string]any) string { return one + "/credits/" + b["id"].(string) }},
	} {
		var headers []string
		if tc.header != "" {
			headers = []string{"Idempotency-Key", tc.header}
		}
		r := do(t, "POST", base+tc.path, adminToken, tc.body, headers...)
		if r.status != 201 {
			t.Errorf("POST %s: %d, want 201: %s", tc.path, r.status, r.body)
			continue
		}
		created := r.json(t)
		want := tc.location(created)
		if got := r.header.Get("Location"); got != want {
			t.Errorf("POST %s: Location %q, want %q", tc.path, got, want)
			continue
		}
		g := admin(t, "GET", base+want, "")
		if g.status != 200 {
			t.Errorf("GET %s (the Location of POST %s): %d, want 200: %s", want, tc.path, g.status, g.body)
			continue
		}
		got := g.json(t)
		for _, id := range []string{"id", "slug", "name"} {
			if created[id] != nil && got[id] != created[id] {
				t.Errorf("GET %s: %s %v, want the created %v", want, id, got[id], created[id])
			}
		}
	}
	if keyID == "" {
		t.Fatal("no key issued")
	}
	r := admin(t, "POST", base+"/admin/v1/keys/"+keyID+"/rotate", `{"grace_seconds": 0}`)
	if r.status != 201 {
		t.Fatalf("rotate: %d %s", r.status, r.body)
	}
	fresh := r.json(t)["new"].(map[string]any)["id"].(string)
	if got := r.header.Get("Location"); got != "/admin/v1/keys/"+fresh {
		t.Errorf("rotate: Location %q, want /admin/v1/keys/%s", got, fresh)
	}
}

// TestConsoleTierRankTakenIs409: in the console's tier editor, a rank
// another tier has is shown beside the rank field and answered 409, as the
// admin API answers it; nothing is saved.
func TestConsoleTierRankTakenIs409(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(43, quota.Limits{DailyQuota: quota.Ptr(int64(10))})
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	path := "/console/tiers/" + tier.Slug
	form := tierFormOf(c.csrf(path), tier)
	form.Set("rank", "10") // pro's
	before := auditCount(t, s)
	r := c.post(path, form.Encode())
	if r.status != 409 || !isHTML(r) || !strings.Contains(fieldErrorOf(r.body, "f-rank"), "ranks are unique") {
		t.Errorf("edit to a rank taken: %d, rank error %q, want 409 with the error beside rank", r.status, fieldErrorOf(r.body, "f-rank"))
	}
	form.Set("slug", "rank-taken")
	r = c.post("/console/tiers", form.Encode())
	if r.status != 409 || !isHTML(r) || !strings.Contains(fieldErrorOf(r.body, "f-rank"), "ranks are unique") {
		t.Errorf("new tier at a rank taken: %d, rank error %q, want 409 with the error beside rank", r.status, fieldErrorOf(r.body, "f-rank"))
	}
	if after := auditCount(t, s); after != before {
		t.Errorf("refused forms wrote %d audit entries", after-before)
	}
}

// TestConsoleShowsBlankNamesByID: a tenant whose stored name shows nothing
// (written before names were checked) is listed, linked and titled by its
// id in the console, never as a blank row nobody can click.
func TestConsoleShowsBlankNamesByID(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tenant, _ := s.tenant("free")
	if _, err := s.pool.Exec(context.Background(), `UPDATE tenants SET name = '   ' WHERE id = $1`, tenant.ID); err != nil {
		t.Fatal(err)
	}
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	link := `<a href="/console/tenants/` + tenant.ID + `">` + tenant.ID + `</a>`
	if list := string(c.get("/console/tenants").body); !strings.Contains(list, link) {
		t.Errorf("the tenant list has no link %s", link)
	}
	if page := string(c.get("/console/tenants/" + tenant.ID).body); !strings.Contains(page, `<h1 id="page-h">`+tenant.ID+`</h1>`) {
		t.Errorf("the tenant's page is not titled by its id")
	}
}

// TestStoredNamesStayUntilChanged: a name stored before names were
// checked ("Acme ") does not stop other changes of its tenant or tier; it
// is checked once it is changed.
func TestStoredNamesStayUntilChanged(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tenant, _ := s.tenant("free")
	tier := s.tier(44, quota.Limits{DailyQuota: quota.Ptr(int64(10))})
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `UPDATE tenants SET name = 'Acme ' WHERE id = $1`, tenant.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE tiers SET name = ' Old' WHERE slug = $1`, tier.Slug); err != nil {
		t.Fatal(err)
	}
	base := s.start()
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"status": "suspended"}`); r.status != 200 {
		t.Errorf("suspend a tenant named %q: %d, want 200: %s", "Acme ", r.status, r.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tiers/"+tier.Slug, `{"price_cents": 700}`); r.status != 200 {
		t.Errorf("reprice a tier named %q: %d, want 200: %s", " Old", r.status, r.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"name": "Acme  "}`); r.status != 400 {
		t.Errorf("rename to %q: %d, want 400: %s", "Acme  ", r.status, r.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"name": "Acme"}`); r.status != 200 {
		t.Errorf("rename to Acme: %d, want 200: %s", r.status, r.body)
	}
}
