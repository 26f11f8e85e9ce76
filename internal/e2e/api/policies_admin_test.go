package api

import (
	"context"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// policyJSON is API.md's example policy.
const policyJSON = `{"name": "reports-concurrency", "algorithm": "concurrency", "limit": 2,
	"match": {"meters": ["report"], "tiers": ["free", "pro"]},
	"scope": "tenant", "cost": "requests", "on_refuse": "queue", "max_wait_ms": 2000,
	"lease_seconds": 30}`

// policyNames lists the policies' names through the admin API.
func policyNames(t *testing.T, base string) []string {
	t.Helper()
	r := admin(t, "GET", base+"/admin/v1/policies?limit=200", "")
	if r.status != 200 {
		t.Fatalf("list policies: %d %s", r.status, r.body)
	}
	var names []string
	for _, it := range r.json(t)["items"].([]any) {
		names = append(names, it.(map[string]any)["name"].(string))
	}
	return names
}

func auditRows(t *testing.T, s *stack) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestAdminPoliciesCRUD(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()

	// Create: 201 with the defaults filled.
	r := admin(t, "POST", base+"/admin/v1/policies", `{"name": "reports-window", "algorithm": "fixed_window", "limit": 100, "window_seconds": 60}`)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	want := map[string]any{"name": "reports-window", "algorithm": "fixed_window", "limit": 100.0, "window_seconds": 60.0,
		"match": map[string]any{}, "scope": "tenant", "cost": "requests", "on_refuse": "reject"}
	if got := r.json(t); !reflect.DeepEqual(got, want) {
		t.Fatalf("created %v, want %v", got, want)
	}
	if r := admin(t, "POST", base+"/admin/v1/policies", policyJSON); r.status != 201 {
		t.Fatalf("create API.md's example: %d %s", r.status, r.body)
	}
	if r := admin(t, "POST", base+"/admin/v1/policies", policyJSON); r.status != 409 || r.json(t)["field"] != "name" {
		t.Fatalf("duplicate name: %d %s, want 409 naming name", r.status, r.body)
	}

	// Read and list (by name, a page at a time).
	g := admin(t, "GET", base+"/admin/v1/policies/reports-window", "")
	if g.status != 200 || !reflect.DeepEqual(g.json(t), want) {
		t.Fatalf("get: %d %s, want %v", g.status, g.body, want)
	}
	for _, path := range []string{"/admin/v1/policies/nope", "/admin/v1/policies/Not%20A%20Slug", "/admin/v1/policies/%ff"} {
		if r := admin(t, "GET", base+path, ""); r.status != 404 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("GET %s: %d %s, want a 404 problem", path, r.status, r.body)
		}
	}
	l := admin(t, "GET", base+"/admin/v1/policies?limit=1", "").json(t)
	items, _ := l["items"].([]any)
	if len(items) != 1 || items[0].(map[string]any)["name"] != "reports-concurrency" || l["next_cursor"] == nil {
		t.Fatalf("first page of 1: %v", l)
	}
	l2 := admin(t, "GET", base+"/admin/v1/policies?limit=1&cursor="+url.QueryEscape(l["next_cursor"].(string)), "").json(t)
	items, _ = l2["items"].([]any)
	if len(items) != 1 || items[0].(map[string]any)["name"] != "reports-window" || l2["next_cursor"] != nil {
		t.Fatalf("second page of 1: %v", l2)
	}
	if r := admin(t, "GET", base+"/admin/v1/policies?cursor=garbage!", ""); r.status != 400 || r.json(t)["field"] != "cursor" {
		t.Errorf("bad cursor: %d %s, want 400 naming cursor", r.status, r.body)
	}

	// Change: the members given replace the stored ones; null removes one.
	p := admin(t, "PATCH", base+"/admin/v1/policies/reports-window", `{"limit": 50, "match": {"meters": ["report"], "methods": ["post"]}}`)
	want["limit"], want["match"] = 50.0, map[string]any{"meters": []any{"report"}, "methods": []any{"POST"}}
	if p.status != 200 || !reflect.DeepEqual(p.json(t), want) {
		t.Fatalf("patch: %d %s, want %v", p.status, p.body, want)
	}
	p = admin(t, "PATCH", base+"/admin/v1/policies/reports-concurrency", `{"on_refuse": null, "max_wait_ms": null, "match": null, "scope": "key"}`)
	if got := p.json(t); p.status != 200 || got["on_refuse"] != "reject" || got["max_wait_ms"] != nil || got["scope"] != "key" ||
		!reflect.DeepEqual(got["match"], map[string]any{}) || got["limit"] != 2.0 {
		t.Fatalf("patch with nulls: %d %s, want on_refuse back to reject, no max_wait_ms or match, scope key, limit kept", p.status, p.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/policies/nope", `{"limit": 5}`); r.status != 404 {
		t.Errorf("patch an unknown policy: %d, want 404", r.status)
	}

	// Delete: 204, then 404.
	if r := admin(t, "DELETE", base+"/admin/v1/policies/reports-window", ""); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if r := admin(t, m, base+"/admin/v1/policies/reports-window", ""); r.status != 404 {
			t.Errorf("%s after delete: %d, want 404", m, r.status)
		}
	}
	if got := policyNames(t, base); !reflect.DeepEqual(got, []string{"reports-concurrency"}) {
		t.Errorf("after delete the list is %v, want [reports-concurrency]", got)
	}

	// The audit log holds each write with before and after.
	a := admin(t, "GET", base+"/admin/v1/audit?entity=policy&entity_id=reports-window", "").json(t)
	entries, _ := a["items"].([]any)
	var actions []string
	for _, e := range entries {
		actions = append(actions, e.(map[string]any)["action"].(string))
	}
	if !reflect.DeepEqual(actions, []string{"delete", "update", "create"}) {
		t.Fatalf("audit of reports-window: %v, want delete, update, create", actions)
	}
	upd := entries[1].(map[string]any)
	if upd["actor"] != "admin" || upd["before"].(map[string]any)["limit"] != 100.0 || upd["after"].(map[string]any)["limit"] != 50.0 {
		t.Errorf("audit update entry = %v, want admin's change of limit from 100 to 50", upd)
	}
	if del := entries[0].(map[string]any); del["after"] != nil || del["before"].(map[string]any)["limit"] != 50.0 {
		t.Errorf("audit delete entry = %v, want the deleted policy before, nothing after", del)
	}
}

// TestAdminPolicyBadInputChangesNothing: every refused write is a 4xx
// problem naming the field at fault, and leaves the policies and the audit
// log as they were.
func TestAdminPolicyBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	if r := admin(t, "POST", base+"/admin/v1/policies", policyJSON); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	stored := admin(t, "GET", base+"/admin/v1/policies/reports-concurrency", "").json(t)
	names, audits := policyNames(t, base), auditRows(t, s)

	const (
		window = `"algorithm": "fixed_window", "limit": 10, "window_seconds": 60`
		post   = "POST /admin/v1/policies"
		patch  = "PATCH /admin/v1/policies/reports-concurrency"
	)
	for _, tc := range []struct{ route, body, field string }{
		// the algorithms' fields
		{post, `{"name": "lb", "algorithm": "leaky_bucket", "burst": 5}`, "rate"},
		{post, `{"name": "lb", "algorithm": "leaky_bucket", "rate": 5, "burst": 5, "limit": 3}`, "limit"},
		{post, `{"name": "x", "algorithm": "exponential", "limit": 3}`, "algorithm"},
		{post, `{"name": "x"}`, "algorithm"},
		{post, `{"algorithm": "gcra", "rate": 1, "burst": 1}`, "name"},
		{post, `{"name": "Not A Slug", ` + window + `}`, "name"},
		{post, `{"name": "g", "algorithm": "gcra", "rate": 1, "burst": 0}`, "burst"},
		// numbers past the bounds
		{post, `{"name": "x", "algorithm": "fixed_window", "limit": 0, "window_seconds": 60}`, "limit"},
		{post, `{"name": "x", "algorithm": "sliding_log", "limit": 100001, "window_seconds": 60}`, "limit"},
		{post, `{"name": "x", "algorithm": "fixed_window", "limit": 10, "window_seconds": 31622401}`, "window_seconds"},
		{post, `{"name": "x", "algorithm": "sliding_window", "limit": 10, "window_seconds": 60, "buckets": 3601}`, "buckets"},
		{post, `{"name": "x", "algorithm": "token_bucket", "capacity": 10, "refill_per_sec": 1e7}`, "refill_per_sec"},
		{post, `{"name": "x", "algorithm": "concurrency", "limit": 2, "lease_seconds": 86401}`, "lease_seconds"},
		{post, `{"name": "x", "algorithm": "warm_up", "rate": 10, "warmup_seconds": 60, "cold_factor": 1}`, "cold_factor"},
		{post, `{"name": "x", "algorithm": "adaptive", "max_concurrency": 0, "target_latency_ms": 50}`, "max_concurrency"},
		{post, `{"name": "x", ` + window + `, "on_refuse": "queue", "max_wait_ms": 60001}`, "max_wait_ms"},
		{post, `{"name": "x", "algorithm": "gcra", "rate": 1e-7, "burst": 1}`, "rate"},
		// refusals, scopes, costs and matches
		{post, `{"name": "x", "algorithm": "adaptive", "max_concurrency": 10, "target_latency_ms": 50, "scope": "node", "on_refuse": "queue", "max_wait_ms": 10}`, "on_refuse"},
		{post, `{"name": "x", ` + window + `, "on_refuse": "queue"}`, "max_wait_ms"},
		{post, `{"name": "x", ` + window + `, "on_refuse": "degrade"}`, "fallback"},
		{post, `{"name": "x", ` + window + `, "on_refuse": "degrade", "fallback": {"status": 99, "content_type": "text/plain"}}`, "fallback"},
		{post, `{"name": "x", ` + window + `, "on_refuse": "later"}`, "on_refuse"},
		{post, `{"name": "x", ` + window + `, "scope": "param"}`, "param"},
		{post, `{"name": "x", ` + window + `, "scope": "param", "param": "cookie:a"}`, "param"},
		{post, `{"name": "x", ` + window + `, "scope": "planet"}`, "scope"},
		{post, `{"name": "x", ` + window + `, "exceptions": {"vip": 100}}`, "exceptions"},
		{post, `{"name": "x", "algorithm": "concurrency", "limit": 2, "lease_seconds": 30, "cost": "units"}`, "cost"},
		{post, `{"name": "x", ` + window + `, "match": {"methods": ["FETCH"]}}`, "match"},
		{post, `{"name": "x", ` + window + `, "match": {"path_prefix": "/api/../admin"}}`, "match"},
		// wrong types and unknown fields
		{post, `{"name": "x", "algorithm": "fixed_window", "limit": "10", "window_seconds": 60}`, "limit"},
		{post, `{"name": "x", "algorithm": "fixed_window", "limit": 10.5, "window_seconds": 60}`, "limit"},
		{post, `{"name": "x", "algorithm": "fixed_window", "limit": 1e400, "window_seconds": 60}`, "limit"},
		{post, `{"name": "x", ` + window + `, "match": "everything"}`, "match"},
		{post, `{"name": "x", ` + window + `, "match": {"meters": "report"}}`, "match.meters"},
		{post, `{"name": "x", ` + window + `, "extra": 1}`, "extra"},
		// NUL and invalid UTF-8, wherever the string is
		{post, `{"name": "x\u0000", ` + window + `}`, "name"},
		{post, `{"name": "x", ` + window + `, "match": {"meters": ["re\u0000port"]}}`, "match.meters"},
		{post, "{\"name\": \"x\", " + window + ", \"match\": {\"path_prefix\": \"/api/\xff\"}}", "match.path_prefix"},
		{post, "{\"name\": \"x\", " + window + ", \"scope\": \"param\", \"param\": \"header:a\", \"exceptions\": {\"\xc3\x28\": 1}}", "exceptions"},
		{post, `{"name": "x", ` + window + `, "scope": "param", "param": "header:a", "exceptions": {"a\u0000": 1}}`, "exceptions"},
		// changes
		{patch, `{"max_wait_ms": null}`, "max_wait_ms"},
		{patch, `{"algorithm": "gcra"}`, "limit"},
		{patch, `{"name": "renamed"}`, "name"},
		{patch, `{"name": null}`, "name"},
		{patch, `{"limit": 0}`, "limit"},
		{patch, `{"limit": "2"}`, "limit"},
		{patch, `{"Limit": 3}`, "Limit"},
		{patch, `{"extra": 1}`, "extra"},
		{patch, `{"on_refuse": "degrade", "max_wait_ms": null, "fallback": {"status": 503, "content_type": "text/plain", "body": "b\u0000"}}`, "fallback.body"},
		{patch, "{\"match\": {\"tiers\": [\"\xff\"]}}", "match.tiers"},
	} {
		method, path, _ := strings.Cut(tc.route, " ")
		r := admin(t, method, base+path, tc.body)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s: %d %s, want a 400 problem", tc.route, tc.body, r.status, r.body)
			continue
		}
		if got := r.json(t)["field"]; got != tc.field {
			t.Errorf("%s %s: field %v (%s), want %q", tc.route, tc.body, got, r.json(t)["detail"], tc.field)
		}
	}
	for _, tc := range []struct {
		route, body string
		status      int
	}{
		{post, `{"name": `, 400},
		{post, `[]`, 400},
		{post, `{"name": "x", ` + window + `} {}`, 400},
		{post, ``, 415},
		{post, `{"name": "x", ` + window + `, "fallback": {"body": "` + strings.Repeat("x", 3000) + `"}}`, 413},
		{patch, `null`, 400},
		{patch, `{"limit": `, 400},
		{patch, `{"limit": 5, "match": {"path_prefix": "` + strings.Repeat("x", 3000) + `"}}`, 413},
	} {
		method, path, _ := strings.Cut(tc.route, " ")
		if r := admin(t, method, base+path, tc.body); r.status != tc.status || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %.40q: %d %s, want a %d problem", tc.route, tc.body, r.status, r.body, tc.status)
		}
	}

	if got := policyNames(t, base); !reflect.DeepEqual(got, names) {
		t.Errorf("after refused writes the policies are %v, want %v", got, names)
	}
	if got := admin(t, "GET", base+"/admin/v1/policies/reports-concurrency", "").json(t); !reflect.DeepEqual(got, stored) {
		t.Errorf("after refused changes the policy is %v, want %v", got, stored)
	}
	if got := auditRows(t, s); got != audits {
		t.Errorf("refused writes left %d audit entries, want %d", got-audits, 0)
	}
}

// TestAdminPoliciesNeedTheAdminToken: without it every policy route is
// refused and changes nothing.
func TestAdminPoliciesNeedTheAdminToken(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	if r := admin(t, "POST", base+"/admin/v1/policies", policyJSON); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	_, key := s.tenant("free")
	audits := auditRows(t, s)
	for _, rt := range []struct{ method, path, body string }{
		{"GET", "/admin/v1/policies", ""},
		{"POST", "/admin/v1/policies", strings.Replace(policyJSON, "reports-concurrency", "other", 1)},
		{"GET", "/admin/v1/policies/reports-concurrency", ""},
		{"PATCH", "/admin/v1/policies/reports-concurrency", `{"limit": 9}`},
		{"DELETE", "/admin/v1/policies/reports-concurrency", ""},
	} {
		for name, tok := range map[string]string{"no token": "", "wrong token": adminToken + "x", "tenant key": key, "service token": serviceToken} {
			if r := do(t, rt.method, base+rt.path, tok, rt.body); (r.status != 401 && r.status != 429) || r.header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s %s with %s: %d, want 401 (or 429 once limited) problem+json", rt.method, rt.path, name, r.status)
			}
		}
	}
	if got := auditRows(t, s); got != audits {
		t.Errorf("audit log grew by %d without the admin token", got-audits)
	}
	// Read past the API: 20 failures may have limited this address.
	if p, err := s.store.Policy(context.Background(), "reports-concurrency"); err != nil || *p.Limit != 2 {
		t.Errorf("the policy after unauthorized writes: %+v (%v), want it unchanged", p, err)
	}
}
