package api

import (
	"net/url"
	"strings"
	"testing"
)

// TestHostileInputIsNever500 sends bytes Postgres refuses in text (NUL,
// invalid UTF-8) and other oddities through every kind of input.
func TestHostileInputIsNever500(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tenant, key := s.tenant("free")
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/admin/v1/tenants?q=" + url.QueryEscape("a\x00b"), ""},
		{"GET", "/admin/v1/tenants?q=%ff%fe", ""},
		{"GET", "/admin/v1/tenants?tier=%ff", ""},
		{"GET", "/admin/v1/tiers/%ff", ""},
		{"GET", "/admin/v1/tiers/a%00b", ""},
		{"GET", "/admin/v1/tenants/%ff", ""},
		{"GET", "/admin/v1/audit?entity=%ff&entity_id=%00", ""},
		{"GET", "/admin/v1/alerts?status=%ff", ""},
		{"GET", "/admin/v1/tenants/" + tenant.ID + "/usage?meter=%ff", ""},
		{"GET", "/admin/v1/tenants?limit=99999999999999999999", ""},
		{"GET", "/admin/v1/tenants?cursor=" + strings.Repeat("A", 400), ""},
		{"POST", "/admin/v1/tenants", `{"name": "a\u0000b", "tier": "free"}`},
		{"POST", "/admin/v1/tenants", "{\"name\": \"\xff\xfe\", \"tier\": \"free\"}"},
		{"POST", "/admin/v1/tenants", `{"name": "x", "tier": "fr\u0000ee"}`},
		{"PATCH", "/admin/v1/tenants/" + tenant.ID, `{"name": "\u0000"}`},
		{"POST", "/admin/v1/tiers", `{"slug": "x\u0000", "name": "X", "rank": 77, "price_cents": 0, "overage": "block"}`},
		{"POST", "/admin/v1/tiers", `{"slug": "nul", "name": "N\u0000", "rank": 78, "price_cents": 0, "overage": "block"}`},
		{"POST", "/admin/v1/tenants/" + tenant.ID + "/keys", `{"name": "k\u0000"}`},
		{"PATCH", "/admin/v1/tenants/" + tenant.ID, `{"webhook_url": "https://x.test/\u0000"}`},
		{"POST", "/v1/check", `{"tenant_id": "` + tenant.ID + `", "meter": "m", "idempotency_key": "\u0000"}`},
	} {
		r := do(t, tc.method, base+tc.path, adminToken, tc.body)
		if tc.path == "/v1/check" {
			r = do(t, tc.method, base+tc.path, serviceToken, tc.body)
		}
		if r.status >= 500 {
			t.Errorf("%s %s %q: status %d (%s)", tc.method, tc.path, tc.body, r.status, r.body)
		}
	}
	if r := do(t, "GET", base+"/api/demo/echo?x=%ff%00", key, "", "Idempotency-Key", "é"); r.status >= 500 {
		t.Errorf("metered with odd query and key: %d", r.status)
	}
}
