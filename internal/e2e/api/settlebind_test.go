package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// A settlement is bound to the tenant whose request it settles: POST
// /v1/settle names the tenant, a request id of another tenant is not
// found, the ids cannot be guessed, and the audit log says who settled.

// settleStack is a stack whose route /api/gen/ (cost 10, settle: true)
// proxies to an upstream that reports the query's cost in
// Tollgate-Actual-Cost, and two tenants of one tier with their keys.
func settleStack(t *testing.T) (s *stack, a, b quota.Tenant, keyA string) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := r.URL.Query().Get("cost"); c != "" {
			w.Header().Set("Tollgate-Actual-Cost", c)
		}
		fmt.Fprint(w, `{"ok": true}`)
	}))
	t.Cleanup(up.Close)
	s = mustStack(t)
	s.routes = filepath.Join(t.TempDir(), "routes.json")
	table := fmt.Sprintf(`{"routes": [
		{"method": "*", "path": "/api/gen/", "meter": "gen", "cost": 10, "upstream": %q, "settle": true}
	]}`, up.URL+"/v1/")
	if err := os.WriteFile(s.routes, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	a, keyA = s.tenant(tier.Slug)
	b, _ = s.tenant(tier.Slug)
	return s, a, b, keyA
}

// pendingUnits is the units counted for tenantID and not yet flushed.
func pendingUnits(tb testing.TB, s *stack, tenantID string) int64 {
	tb.Helper()
	rows, err := quotaredis.New(testenv.Redis(tb), s.prefix).Pending(context.Background(), tenantID)
	if err != nil {
		tb.Fatal(err)
	}
	var n int64
	for _, r := range rows {
		n += r.Units
	}
	return n
}

// TestSettleIsBoundToItsTenant: the service's settle names the tenant;
// another tenant's id finds no request (404, nothing changes), no tenant
// or a malformed one is 400, and the request's own tenant settles it.
func TestSettleIsBoundToItsTenant(t *testing.T) {
	t.Parallel()
	s, a, b, keyA := settleStack(t)
	base := s.start()
	r := raw(t, base, "GET /api/gen/a HTTP/1.1", "Authorization: Bearer "+keyA)
	id := r.header.Get("Tollgate-Request-Id")
	if r.status != 200 || id == "" {
		t.Fatalf("settle route: %d %v", r.status, r.header)
	}
	settle := func(body string) reply {
		return raw(t, base, "POST /v1/settle HTTP/1.1", "Authorization: Bearer "+serviceToken, "Content-Type: application/json", "", body)
	}
	if r := settle(fmt.Sprintf(`{"request_id": %q, "actual_cost": 0, "tenant_id": %q}`, id, b.ID)); r.status != 404 ||
		r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("settling with another tenant's id: %d %s, want 404 problem", r.status, r.body)
	}
	if n := pendingUnits(t, s, a.ID); n != 10 {
		t.Fatalf("pending units %d after another tenant's settle, want 10", n)
	}
	for _, tc := range []struct{ body, field string }{
		{fmt.Sprintf(`{"request_id": %q, "actual_cost": 0}`, id), "tenant_id"},
		{fmt.Sprintf(`{"request_id": %q, "actual_cost": 0, "tenant_id": "x"}`, id), "tenant_id"},
		{fmt.Sprintf(`{"request_id": %q, "actual_cost": 0, "tenant_id": ""}`, id), "tenant_id"},
	} {
		if r := settle(tc.body); r.status != 400 || r.json(t)["field"] != tc.field {
			t.Errorf("settle %s: %d %s, want 400 naming %s", tc.body, r.status, r.body, tc.field)
		}
	}
	if n := pendingUnits(t, s, a.ID); n != 10 {
		t.Fatalf("pending units %d after refused settles, want 10", n)
	}
	if r := settle(fmt.Sprintf(`{"request_id": %q, "actual_cost": 3, "tenant_id": %q}`, id, a.ID)); r.status != 200 || r.json(t)["delta"] != -7.0 {
		t.Fatalf("settling with the request's tenant: %d %s, want 200 and delta -7", r.status, r.body)
	}
	if n := pendingUnits(t, s, a.ID); n != 3 {
		t.Fatalf("pending units %d after the settle, want 3", n)
	}
}

var randomID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestSettleRequestIDsAreUnguessable: a settle route's request id is 128
// random bits, 32 hex digits, sharing nothing with the node's other ids
// (no process prefix, no counter).
func TestSettleRequestIDsAreUnguessable(t *testing.T) {
	t.Parallel()
	s, _, _, keyA := settleStack(t)
	base := s.start()
	seen := map[string]bool{}
	var prev string
	for i := range 20 {
		r := raw(t, base, "GET /api/gen/a HTTP/1.1", "Authorization: Bearer "+keyA)
		id := r.header.Get("Tollgate-Request-Id")
		if r.status != 200 || !randomID.MatchString(id) || seen[id] {
			t.Fatalf("request %d: %d, id %q; want 32 hex digits never seen before", i, r.status, id)
		}
		if prev != "" && id[:8] == prev[:8] {
			t.Fatalf("ids %q and %q share a prefix", prev, id)
		}
		if xid := r.header.Get("X-Request-ID"); xid == id {
			t.Fatalf("the settle id is the X-Request-ID %q", xid)
		}
		seen[id], prev = true, id
	}
}

// TestSettlementsAreAudited: the audit log records each settlement: the
// service's (actor "service") and the upstream's header (actor
// "upstream"), with the tenant, the actual cost and the difference.
func TestSettlementsAreAudited(t *testing.T) {
	t.Parallel()
	s, a, _, keyA := settleStack(t)
	base := s.start()
	audit := func(id string) []any {
		r := do(t, "GET", base+"/admin/v1/audit?entity=settlement&entity_id="+id, adminToken, "")
		if r.status != 200 {
			t.Fatalf("audit: %d %s", r.status, r.body)
		}
		items, _ := r.json(t)["items"].([]any)
		return items
	}
	check := func(what string, e any, actor string, actual, delta float64) {
		t.Helper()
		m, _ := e.(map[string]any)
		after, _ := m["after"].(map[string]any)
		if m["actor"] != actor || m["action"] != "create" || after["tenant_id"] != a.ID || after["actual_cost"] != actual || after["delta"] != delta {
			t.Fatalf("%s: audit entry %v, want actor %s, tenant %s, actual_cost %v, delta %v", what, m, actor, a.ID, actual, delta)
		}
	}

	// by the service
	r := raw(t, base, "GET /api/gen/a HTTP/1.1", "Authorization: Bearer "+keyA)
	id := r.header.Get("Tollgate-Request-Id")
	if got := raw(t, base, "POST /v1/settle HTTP/1.1", "Authorization: Bearer "+serviceToken, "Content-Type: application/json", "",
		fmt.Sprintf(`{"request_id": %q, "actual_cost": 4, "tenant_id": %q}`, id, a.ID)); got.status != 200 {
		t.Fatalf("settle: %d %s", got.status, got.body)
	}
	items := audit(id)
	if len(items) != 1 {
		t.Fatalf("audit of %s: %d entries, want 1", id, len(items))
	}
	check("the service's settlement", items[0], "service", 4, -6)

	// by the upstream's header (written off the request's path)
	r = raw(t, base, "GET /api/gen/b?cost=12 HTTP/1.1", "Authorization: Bearer "+keyA)
	id = r.header.Get("Tollgate-Request-Id")
	if r.header.Get("Tollgate-Settled-Cost") != "12" {
		t.Fatalf("header settle: %d %v", r.status, r.header)
	}
	eventually(t, "the header's settlement in the audit log", func() bool { return len(audit(id)) == 1 })
	check("the upstream's settlement", audit(id)[0], "upstream", 12, 2)

	// a refused settle is not audited
	if got := raw(t, base, "POST /v1/settle HTTP/1.1", "Authorization: Bearer "+serviceToken, "Content-Type: application/json", "",
		fmt.Sprintf(`{"request_id": %q, "actual_cost": 1, "tenant_id": %q}`, id, a.ID)); got.status != 409 {
		t.Fatalf("second settle: %d %s, want 409", got.status, got.body)
	}
	if items := audit(id); len(items) != 1 {
		t.Fatalf("audit after a refused settle: %d entries, want 1", len(items))
	}
}
