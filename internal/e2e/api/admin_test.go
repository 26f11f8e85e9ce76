package api

import (
	"context"
	"encoding/csv"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/billing"
)

const tierJSON = `{"slug": "gold", "name": "Gold", "rank": 15, "price_cents": 9900, "burst_rate": 20, "burst": 40,
	"bucket_capacity": 500, "bucket_refill_per_sec": 10, "daily_quota": 5000, "monthly_quota": null,
	"overage": "bill", "overage_price_cents_per_1k": 30, "fail_open": true, "upgrade_url": "https://example.test/gold"}`

func admin(t *testing.T, method, url, body string) reply {
	t.Helper()
	return do(t, method, url, adminToken, body)
}

func TestAdminTiersCRUDAndValidation(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	r := admin(t, "POST", base+"/admin/v1/tiers", tierJSON)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if got := r.json(t); got["slug"] != "gold" || got["monthly_quota"] != nil || got["daily_quota"] != 5000.0 {
		t.Fatalf("created tier = %v", got)
	}
	if r := admin(t, "POST", base+"/admin/v1/tiers", tierJSON); r.status != 409 {
		t.Fatalf("duplicate slug: %d, want 409", r.status)
	}
	// pro's rank: ranks are unique, and a rank taken is a conflict as a slug
	// taken is (TestAdminConflictsAre409)
	if r := admin(t, "POST", base+"/admin/v1/tiers", strings.Replace(replaceField(tierJSON, "\"rank\"", `"rank": 10`),
		`"slug": "gold"`, `"slug": "t-rank"`, 1)); r.status != 409 || r.json(t)["field"] != "rank" {
		t.Fatalf("duplicate rank: %d %s, want 409 naming rank", r.status, r.body)
	}
	// Each validation rule: 400 naming the field.
	for _, tc := range []struct{ field, patch string }{
		{"slug", `"slug": "Not A Slug"`},
		{"name", `"name": ""`},
		{"rank", `"rank": -1`},
		{"price_cents", `"price_cents": -1`},
		{"burst_rate", `"burst_rate": 0`},
		{"burst_rate", `"burst_rate": -3`},
		{"burst", `"burst": 0`},
		{"burst", `"burst": null`},
		{"bucket_capacity", `"bucket_capacity": -1`},
		{"bucket_refill_per_sec", `"bucket_refill_per_sec": 0`},
		{"daily_quota", `"daily_quota": -5`},
		{"monthly_quota", `"monthly_quota": 99999999999999999`},
		{"overage", `"overage": "sometimes"`},
		{"overage_price_cents_per_1k", `"overage_price_cents_per_1k": 0`},
		{"upgrade_url", `"upgrade_url": "javascript:alert(1)"`},
		{"price_cents", `"price_cents": "free"`},
		{"fail_open", `"fail_open": "yes"`},
		{"extra", `"extra": 1`},
	} {
		body := strings.Replace(tierJSON, `"slug": "gold"`, `"slug": "t-`+testenvHex()+`"`, 1)
		key := strings.SplitN(tc.patch, ":", 2)[0]
		body = replaceField(body, key, tc.patch)
		r := admin(t, "POST", base+"/admin/v1/tiers", body)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: status %d, want 400 problem+json (%s)", tc.patch, r.status, r.body)
			continue
		}
		if got := r.json(t)["field"]; got != tc.field {
			t.Errorf("%s: field %v, want %q", tc.patch, got, tc.field)
		}
	}
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"malformed", `{"slug": `, 400},
		{"not an object", `[]`, 400},
		{"empty", ``, 415},
		{"oversized", `{"name": "` + strings.Repeat("x", 3000) + `"}`, 413},
	} {
		if r := admin(t, "POST", base+"/admin/v1/tiers", tc.body); r.status != tc.status {
			t.Errorf("%s body: %d, want %d", tc.name, r.status, tc.status)
		}
	}
	// Read, change (null makes a limit unlimited), list, delete.
	if r := admin(t, "GET", base+"/admin/v1/tiers/gold", ""); r.status != 200 {
		t.Fatalf("get: %d", r.status)
	}
	if r := admin(t, "GET", base+"/admin/v1/tiers/nope", ""); r.status != 404 {
		t.Fatalf("get unknown: %d, want 404", r.status)
	}
	p := admin(t, "PATCH", base+"/admin/v1/tiers/gold", `{"daily_quota": null, "price_cents": 9500}`)
	if p.status != 200 || p.json(t)["daily_quota"] != nil || p.json(t)["price_cents"] != 9500.0 || p.json(t)["burst"] != 40.0 {
		t.Fatalf("patch: %d %s", p.status, p.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tiers/gold", `{"name": null}`); r.status != 400 || r.json(t)["field"] != "name" {
		t.Fatalf("patch name null: %d %s, want 400 naming name", r.status, r.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tiers/gold", `{"burst_rate": null}`); r.status != 400 || r.json(t)["field"] != "burst" {
		t.Fatalf("patch half a GCRA: %d %s, want 400", r.status, r.body)
	}
	l := admin(t, "GET", base+"/admin/v1/tiers?limit=2", "").json(t)
	if len(l["items"].([]any)) != 2 || l["next_cursor"] == nil {
		t.Fatalf("list limit 2: %v", l)
	}
	l2 := admin(t, "GET", base+"/admin/v1/tiers?limit=2&cursor="+l["next_cursor"].(string), "").json(t)
	if len(l2["items"].([]any)) != 2 || l2["items"].([]any)[0].(map[string]any)["slug"] == l["items"].([]any)[1].(map[string]any)["slug"] {
		t.Fatalf("second page: %v", l2)
	}
	if r := admin(t, "GET", base+"/admin/v1/tiers?cursor=garbage!", ""); r.status != 400 || r.json(t)["field"] != "cursor" {
		t.Fatalf("bad cursor: %d", r.status)
	}
	if r := admin(t, "GET", base+"/admin/v1/tiers?limit=0", ""); r.status != 400 {
		t.Fatalf("limit 0: %d, want 400", r.status)
	}
	s.tenant("free")
	if r := admin(t, "DELETE", base+"/admin/v1/tiers/free", ""); r.status != 409 {
		t.Fatalf("delete a used tier: %d, want 409", r.status)
	}
	if r := admin(t, "DELETE", base+"/admin/v1/tiers/gold", ""); r.status != 204 {
		t.Fatalf("delete: %d", r.status)
	}
	if r := admin(t, "GET", base+"/admin/v1/tiers/gold", ""); r.status != 404 {
		t.Fatalf("after delete: %d, want 404", r.status)
	}
	// The audit log has each change with before and after.
	a := admin(t, "GET", base+"/admin/v1/audit?entity=tier&entity_id=gold", "").json(t)
	items := a["items"].([]any)
	if len(items) != 3 {
		t.Fatalf("audit of gold: %d entries, want 3 (create, update, delete)", len(items))
	}
	upd := items[1].(map[string]any)
	if upd["action"] != "update" || upd["before"].(map[string]any)["price_cents"] != 9900.0 || upd["after"].(map[string]any)["price_cents"] != 9500.0 {
		t.Fatalf("audit update entry = %v", upd)
	}
}

var hexN int

func testenvHex() string { hexN++; return fmt.Sprintf("%04d", hexN) }

// replaceField replaces `"key": value` in a flat JSON object, or appends it.
func replaceField(body, key, with string) string {
	i := strings.Index(body, key+":")
	if i < 0 {
		return strings.TrimSuffix(strings.TrimSpace(body), "}") + ", " + with + "}"
	}
	j := i + len(key) + 1
	depth := 0
	for ; j < len(body); j++ {
		c := body[j]
		if c == '"' {
			k := strings.IndexByte(body[j+1:], '"')
			j += k + 1
			continue
		}
		if (c == ',' || c == '}') && depth == 0 {
			break
		}
	}
	return body[:i] + with + body[j:]
}

func TestAdminWithoutTokenChangesNothing(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tenant, key := s.tenant("free")
	routes := []struct{ method, path, body string }{
		{"GET", "/admin/v1/tiers", ""}, {"POST", "/admin/v1/tiers", tierJSON},
		{"GET", "/admin/v1/tiers/free", ""}, {"PATCH", "/admin/v1/tiers/free", `{"price_cents": 1}`},
		{"DELETE", "/admin/v1/tiers/pro", ""},
		{"GET", "/admin/v1/tenants", ""}, {"POST", "/admin/v1/tenants", `{"name": "x", "tier": "free"}`},
		{"GET", "/admin/v1/tenants/" + tenant.ID, ""}, {"PATCH", "/admin/v1/tenants/" + tenant.ID, `{"status": "suspended"}`},
		{"DELETE", "/admin/v1/tenants/" + tenant.ID, ""},
		{"GET", "/admin/v1/tenants/" + tenant.ID + "/keys", ""}, {"POST", "/admin/v1/tenants/" + tenant.ID + "/keys", `{}`},
		{"POST", "/admin/v1/tenants/" + tenant.ID + "/grants", `{"period": "day", "units": 5}`},
		{"GET", "/admin/v1/tenants/" + tenant.ID + "/usage", ""}, {"GET", "/admin/v1/invoices?period=2026-11", ""},
		{"GET", "/admin/v1/audit", ""},
	}
	var auditBefore int
	countAudit := func() int {
		var n int
		if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	auditBefore = countAudit()
	for _, rt := range routes {
		for name, tok := range map[string]string{"no token": "", "wrong token": "admin-token-for-tests-012346", "tenant key": key, "service token": serviceToken} {
			// Past 20 failures the address is limited: 429 instead of 401.
			if r := do(t, rt.method, base+rt.path, tok, rt.body); (r.status != 401 && r.status != 429) || r.header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s %s with %s: %d, want 401 or 429 problem+json", rt.method, rt.path, name, r.status)
			}
		}
	}
	if got := countAudit(); got != auditBefore {
		t.Fatalf("audit log grew from %d to %d without the admin token", auditBefore, got)
	}
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
		t.Fatalf("the tenant was changed: %d", r.status)
	}
}

func TestAdminTenantChangesTakeEffectOnTheNextRequest(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	r := admin(t, "POST", base+"/admin/v1/tenants", `{"name": "Acme", "tier": "free", "webhook_url": "https://acme.test/hook"}`)
	if r.status != 201 {
		t.Fatalf("create tenant: %d %s", r.status, r.body)
	}
	id := r.json(t)["id"].(string)
	k := admin(t, "POST", base+"/admin/v1/tenants/"+id+"/keys", `{"name": "ci"}`)
	if k.status != 201 || !strings.HasPrefix(k.json(t)["secret"].(string), "tg_") {
		t.Fatalf("issue key: %d %s", k.status, k.body)
	}
	secret, keyID := k.json(t)["secret"].(string), k.json(t)["id"].(string)
	first := do(t, "GET", base+"/api/demo/echo", secret, "")
	if !strings.Contains(first.header.Get("RateLimit-Policy"), `"daily";q=1000;`) {
		t.Fatalf("free policy = %q", first.header.Get("RateLimit-Policy"))
	}
	// Tier change: the very next request has the new limits, the usage stays counted.
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+id, `{"tier": "pro"}`); r.status != 200 {
		t.Fatalf("tier change: %d %s", r.status, r.body)
	}
	next := do(t, "GET", base+"/api/demo/echo", secret, "")
	if !strings.Contains(next.header.Get("RateLimit-Policy"), `"daily";q=50000;`) {
		t.Fatalf("after the tier change: policy %q, want pro's daily 50000", next.header.Get("RateLimit-Policy"))
	}
	if got := remaining(t, next.header)["daily"]; got != 50000-2 {
		t.Fatalf("after the tier change: daily r=%d, want %d (usage already counted stays)", got, 50000-2)
	}
	// Overrides: a bad one names its field; a good one applies at once.
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+id, `{"overrides": {"daily_quota": -1}}`); r.status != 400 || r.json(t)["field"] != "overrides.daily_quota" {
		t.Fatalf("bad override: %d %s", r.status, r.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+id, `{"overrides": {"daily_quota": 7, "burst": null, "burst_rate": null}}`); r.status != 200 {
		t.Fatalf("override: %d %s", r.status, r.body)
	}
	o := do(t, "GET", base+"/api/demo/echo", secret, "")
	if pol := o.header.Get("RateLimit-Policy"); !strings.Contains(pol, `"daily";q=7;`) || strings.Contains(pol, `"burst"`) {
		t.Fatalf("after overrides: policy %q, want daily 7 and no burst", pol)
	}
	// Grant: the remaining quota rises at once (3 used of 7 + 20).
	if r := admin(t, "POST", base+"/admin/v1/tenants/"+id+"/grants", `{"period": "day", "units": 20}`); r.status != 201 {
		t.Fatalf("grant: %d %s", r.status, r.body)
	}
	g := do(t, "GET", base+"/api/demo/echo", secret, "")
	if got := remaining(t, g.header)["daily"]; got != 7+20-4 || !strings.Contains(g.header.Get("RateLimit-Policy"), `"daily";q=27;`) {
		t.Fatalf("after a grant of 20: daily r=%d policy %q, want r=23 q=27", got, g.header.Get("RateLimit-Policy"))
	}
	for _, tc := range []struct{ body, field string }{
		{`{"period": "week", "units": 5}`, "period"}, {`{"period": "day", "units": 0}`, "units"},
		{`{"period": "day", "units": -3}`, "units"}, {`{"period": "day"}`, "units"}, {`{"units": 5}`, "period"},
	} {
		if r := admin(t, "POST", base+"/admin/v1/tenants/"+id+"/grants", tc.body); r.status != 400 || r.json(t)["field"] != tc.field {
			t.Errorf("grant %s: %d %s, want 400 naming %s", tc.body, r.status, r.body, tc.field)
		}
	}
	// Suspend, resume.
	admin(t, "PATCH", base+"/admin/v1/tenants/"+id, `{"status": "suspended"}`)
	if r := do(t, "GET", base+"/api/demo/echo", secret, ""); r.status != 403 {
		t.Fatalf("suspended: %d, want 403", r.status)
	}
	admin(t, "PATCH", base+"/admin/v1/tenants/"+id, `{"status": "active"}`)
	if r := do(t, "GET", base+"/api/demo/echo", secret, ""); r.status != 200 {
		t.Fatalf("resumed: %d, want 200", r.status)
	}
	for _, tc := range []struct{ body, field string }{
		{`{"status": "gone"}`, "status"}, {`{"tier": "nope"}`, "tier"}, {`{"name": ""}`, "name"},
		{`{"webhook_url": "ftp://x"}`, "webhook_url"}, {`{"id": "x"}`, "id"}, {`{"tier": null}`, "tier"},
	} {
		if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+id, tc.body); r.status != 400 || r.json(t)["field"] != tc.field {
			t.Errorf("patch %s: %d %s, want 400 naming %s", tc.body, r.status, r.body, tc.field)
		}
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/00000000-0000-0000-0000-000000000000", `{"status": "active"}`); r.status != 404 {
		t.Fatalf("patch unknown tenant: %d, want 404", r.status)
	}
	if r := admin(t, "GET", base+"/admin/v1/tenants/not-a-uuid", ""); r.status != 404 {
		t.Fatalf("get malformed id: %d, want 404", r.status)
	}
	// Revocation: the very next request is refused.
	if r := admin(t, "DELETE", base+"/admin/v1/keys/"+keyID, ""); r.status != 204 {
		t.Fatalf("revoke: %d", r.status)
	}
	if r := do(t, "GET", base+"/api/demo/echo", secret, ""); r.status != 401 {
		t.Fatalf("after revocation: %d, want 401", r.status)
	}
	keys := admin(t, "GET", base+"/admin/v1/tenants/"+id+"/keys", "").json(t)["items"].([]any)
	k0 := keys[0].(map[string]any)
	if _, has := k0["secret"]; has || k0["revoked_at"] == nil || k0["prefix"] == "" {
		t.Fatalf("key list entry = %v, want a prefix, revoked_at and no secret", k0)
	}
	if r := admin(t, "DELETE", base+"/admin/v1/keys/00000000-0000-0000-0000-000000000000", ""); r.status != 404 {
		t.Fatalf("revoke unknown key: %d, want 404", r.status)
	}
}

func TestAdminKeyRotationGraceAndLastUsed(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tenant, _ := s.tenant("free")
	issue := func() (string, string) {
		k := admin(t, "POST", base+"/admin/v1/tenants/"+tenant.ID+"/keys", `{"name": "svc"}`).json(t)
		return k["id"].(string), k["secret"].(string)
	}
	id, old := issue()
	do(t, "GET", base+"/api/demo/echo", old, "")
	r := admin(t, "POST", base+"/admin/v1/keys/"+id+"/rotate", `{"grace_seconds": 3600}`)
	if r.status != 201 {
		t.Fatalf("rotate: %d %s", r.status, r.body)
	}
	fresh := r.json(t)["new"].(map[string]any)["secret"].(string)
	for name, k := range map[string]string{"old key in its grace": old, "new key": fresh} {
		if r := do(t, "GET", base+"/api/demo/echo", k, ""); r.status != 200 {
			t.Errorf("%s: %d, want 200", name, r.status)
		}
	}
	id2, old2 := issue()
	admin(t, "POST", base+"/admin/v1/keys/"+id2+"/rotate", `{"grace_seconds": 0}`)
	if r := do(t, "GET", base+"/api/demo/echo", old2, ""); r.status != 401 {
		t.Fatalf("old key after a rotation without grace: %d, want 401", r.status)
	}
	for _, body := range []string{`{"grace_seconds": -1}`, `{"grace_seconds": 99999999}`, `{}`, `{"grace_seconds": "soon"}`} {
		if r := admin(t, "POST", base+"/admin/v1/keys/"+id+"/rotate", body); r.status != 400 || r.json(t)["field"] != "grace_seconds" {
			t.Errorf("rotate %s: %d %s, want 400 naming grace_seconds", body, r.status, r.body)
		}
	}
	// Last use reaches Postgres off the request path, within the flush interval.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var used map[string]any
		for _, k := range admin(t, "GET", base+"/admin/v1/tenants/"+tenant.ID+"/keys", "").json(t)["items"].([]any) {
			if k.(map[string]any)["id"] == id {
				used = k.(map[string]any)
			}
		}
		if used["last_used_at"] != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("last_used_at still null 10 s after use: %v", used)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func TestAdminTenantListSearchAndDelete(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	var ids []string
	for i := range 5 {
		r := admin(t, "POST", base+"/admin/v1/tenants", fmt.Sprintf(`{"name": "Customer %d", "tier": "free"}`, i))
		ids = append(ids, r.json(t)["id"].(string))
	}
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		url := base + "/admin/v1/tenants?limit=2"
		if cursor != "" {
			url += "&cursor=" + cursor
		}
		l := admin(t, "GET", url, "").json(t)
		for _, it := range l["items"].([]any) {
			id := it.(map[string]any)["id"].(string)
			if seen[id] {
				t.Fatalf("tenant %s on two pages", id)
			}
			seen[id] = true
		}
		if l["next_cursor"] == nil {
			break
		}
		cursor = l["next_cursor"].(string)
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
	}
	if len(seen) != 5 {
		t.Fatalf("paged through %d tenants, want 5", len(seen))
	}
	q := admin(t, "GET", base+"/admin/v1/tenants?q=customer%203", "").json(t)["items"].([]any)
	if len(q) != 1 || q[0].(map[string]any)["id"] != ids[3] {
		t.Fatalf("search 'customer 3': %v", q)
	}
	if r := admin(t, "POST", base+"/admin/v1/tenants", `{"name": "x", "tier": "nope"}`); r.status != 400 || r.json(t)["field"] != "tier" {
		t.Fatalf("unknown tier: %d %s", r.status, r.body)
	}
	if r := admin(t, "POST", base+"/admin/v1/tenants", `{"tier": "free"}`); r.status != 400 || r.json(t)["field"] != "name" {
		t.Fatalf("no name: %d %s", r.status, r.body)
	}
	if r := admin(t, "DELETE", base+"/admin/v1/tenants/"+ids[0], ""); r.status != 204 {
		t.Fatalf("delete: %d", r.status)
	}
	if r := admin(t, "GET", base+"/admin/v1/tenants/"+ids[0], ""); r.status != 404 {
		t.Fatalf("after delete: %d, want 404", r.status)
	}
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO invoices (tenant_id, period) VALUES ($1, '2026-11-01')`, ids[2]); err != nil {
		t.Fatal(err)
	}
	if r := admin(t, "DELETE", base+"/admin/v1/tenants/"+ids[2], ""); r.status != 204 {
		t.Fatalf("delete a tenant with only a draft invoice: %d, want 204", r.status)
	}
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO invoices (tenant_id, period, status, finalized_at) VALUES ($1, '2026-10-01', 'final', now())`, ids[1]); err != nil {
		t.Fatal(err)
	}
	if r := admin(t, "DELETE", base+"/admin/v1/tenants/"+ids[1], ""); r.status != 409 {
		t.Fatalf("delete a tenant with a final invoice: %d, want 409", r.status)
	}
}

func TestAdminUsageExportJSONAndCSV(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tenant, _ := s.tenant("free")
	for _, row := range []struct {
		hour  string
		meter string
		units int
	}{{"2026-10-05T10:00:00Z", "demo", 3}, {"2026-10-05T11:00:00Z", "demo", 4}, {"2026-10-05T11:00:00Z", "report", 10}, {"2026-10-06T00:00:00Z", "demo", 1}} {
		if _, err := s.pool.Exec(context.Background(), `INSERT INTO usage (tenant_id, hour, meter, units, requests) VALUES ($1, $2, $3, $4, 1)`,
			tenant.ID, row.hour, row.meter, row.units); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.pool.Exec(context.Background(), `UPDATE usage SET shadow_refused = 2, degraded = 1
		WHERE tenant_id = $1 AND hour = '2026-10-05T11:00:00Z' AND meter = 'demo'`, tenant.ID); err != nil {
		t.Fatal(err)
	}
	u := base + "/admin/v1/tenants/" + tenant.ID + "/usage?from=2026-10-01&to=2026-11-01"
	day := admin(t, "GET", u+"&granularity=day", "").json(t)["items"].([]any)
	if len(day) != 3 || day[0].(map[string]any)["units"] != 7.0 || day[0].(map[string]any)["period_start"] != "2026-10-05T00:00:00Z" ||
		day[0].(map[string]any)["shadow_refused"] != 2.0 || day[0].(map[string]any)["degraded"] != 1.0 {
		t.Fatalf("daily rows = %v", day)
	}
	hour := admin(t, "GET", u+"&granularity=hour&meter=demo", "").json(t)["items"].([]any)
	if len(hour) != 3 {
		t.Fatalf("hourly demo rows = %v, want 3", hour)
	}
	r := do(t, "GET", u+"&granularity=day", adminToken, "", "Accept", "text/csv")
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/csv") {
		t.Fatalf("CSV: %d %q", r.status, r.header.Get("Content-Type"))
	}
	recs, err := csv.NewReader(strings.NewReader(string(r.body))).ReadAll()
	if err != nil || len(recs) != 4 || recs[1][2] != "7" {
		t.Fatalf("CSV = %v, %v", recs, err)
	}
	// columns are only ever appended: existing readers go by position
	if got, want := strings.Join(recs[0], ","), "period_start,meter,units,requests,rejected,overage_units,shadow_refused,degraded"; got != want {
		t.Errorf("CSV header %q, want %q", got, want)
	}
	if got := strings.Join(recs[1][6:], ","); got != "2,1" {
		t.Errorf("CSV row %v: shadow_refused,degraded = %q, want 2,1", recs[1], got)
	}
	for _, q := range []struct{ query, field string }{
		{"?from=yesterday", "from"}, {"?to=2020-01-01", "to"}, {"?granularity=week", "granularity"},
		{"?from=2020-01-01&to=2026-01-01", "to"}, {"?meter=Bad|Meter", "meter"},
	} {
		if r := admin(t, "GET", base+"/admin/v1/tenants/"+tenant.ID+"/usage"+q.query, ""); r.status != 400 || r.json(t)["field"] != q.field {
			t.Errorf("usage%s: %d %s, want 400 naming %s", q.query, r.status, r.body, q.field)
		}
	}
	if r := admin(t, "GET", base+"/admin/v1/invoices?period=November", ""); r.status != 400 || r.json(t)["field"] != "period" {
		t.Fatalf("invoices bad period: %d", r.status)
	}
	if r := admin(t, "GET", base+"/admin/v1/invoices?period=2026-11", ""); r.status != 200 || len(r.json(t)["items"].([]any)) != 0 {
		t.Fatalf("invoices: %d %s", r.status, r.body)
	}
}

// TestInvoicesReachTenantAndAdmin runs the invoicer, then reads the invoice
// through the tenant's and the admin's routes.
func TestInvoicesReachTenantAndAdmin(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tenant, key := s.tenant("pro")
	other, otherKey := s.tenant("free")
	now := time.Now().UTC()
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO usage (tenant_id, hour, meter, units, requests) VALUES ($1, $2, 'demo', 1234, 10)`,
		tenant.ID, month); err != nil {
		t.Fatal(err)
	}
	inv := billing.NewInvoicer(s.pool, time.Now, 48*time.Hour)
	if err := inv.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	mine := do(t, "GET", base+"/v1/invoices", key, "").json(t)["items"].([]any)
	if len(mine) != 1 {
		t.Fatalf("tenant invoices = %v, want this month's draft", mine)
	}
	first := mine[0].(map[string]any)
	if first["tenant_id"] != tenant.ID || first["status"] != "draft" || first["period"] != month.Format("2006-01") {
		t.Fatalf("invoice = %v", first)
	}
	for _, it := range do(t, "GET", base+"/v1/invoices", otherKey, "").json(t)["items"].([]any) {
		if it.(map[string]any)["tenant_id"] != other.ID {
			t.Fatalf("tenant B sees invoice %v", it)
		}
	}
	all := admin(t, "GET", base+"/admin/v1/invoices?period="+month.Format("2006-01"), "").json(t)["items"].([]any)
	if len(all) != 2 {
		t.Fatalf("admin invoices of the month: %d, want 2", len(all))
	}
	csvBody := do(t, "GET", base+"/admin/v1/invoices?period="+month.Format("2006-01"), adminToken, "", "Accept", "text/csv")
	recs, err := csv.NewReader(strings.NewReader(string(csvBody.body))).ReadAll()
	if err != nil || len(recs) < 3 || recs[0][0] != "invoice_id" {
		t.Fatalf("invoices CSV = %v, %v", recs, err)
	}
	found := false
	for _, r := range recs[1:] {
		if r[1] == tenant.ID && r[7] == "included" && r[9] == "1234" {
			found = true
		}
	}
	if !found {
		t.Fatalf("the CSV has no included line of 1234 units for %s: %v", tenant.ID, recs)
	}
}
