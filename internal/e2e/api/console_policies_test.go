package api

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// Tests of the console's policies (list, creation form, editor, delete)
// and of the dashboard's policies section.

// policyPageForm is a form of the policy editor: the fields given, with
// the CSRF token unless tok is "".
func policyPageForm(tok string, fields map[string]string) string {
	v := url.Values{}
	if tok != "" {
		v.Set("_csrf", tok)
	}
	for k, f := range fields {
		v.Set(k, f)
	}
	return v.Encode()
}

// with returns a copy of base with the fields of change set, and those
// set to "-" removed.
func with(base map[string]string, change map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range change {
		if v == "-" {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	return out
}

// fieldErrorOf is the text of the error shown beside field id (f-<field>
// or g-<group>) in page, "" when there is none.
func fieldErrorOf(page []byte, id string) string {
	re := regexp.MustCompile(`<p class="field-error" id="` + regexp.QuoteMeta(id) + `-error">([^<]*)</p>`)
	m := re.FindSubmatch(page)
	if m == nil {
		return ""
	}
	return html.UnescapeString(string(m[1]))
}

// storedPolicy reads the policy name through the admin API; found false on 404.
func storedPolicy(t *testing.T, base, name string) (map[string]any, bool) {
	t.Helper()
	r := admin(t, "GET", base+"/admin/v1/policies/"+name, "")
	switch r.status {
	case 200:
		return r.json(t), true
	case 404:
		return nil, false
	}
	t.Fatalf("GET policy %s: %d %s", name, r.status, r.body)
	return nil, false
}

// policyAudit lists the audit entries of the policy name, newest first:
// action and actor.
func policyAudit(t *testing.T, base, name string) []string {
	t.Helper()
	var out []string
	for _, e := range admin(t, "GET", base+"/admin/v1/audit?entity=policy&entity_id="+name, "").json(t)["items"].([]any) {
		e := e.(map[string]any)
		out = append(out, fmt.Sprintf("%s by %s", e["action"], e["actor"]))
	}
	return out
}

// TestConsolePoliciesCreateEditDelete: a policy created, changed and
// deleted through the console is what the admin API serves, reaches the
// other node within a second, and is audited with the actor console.
func TestConsolePoliciesCreateEditDelete(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(40, quota.Limits{DailyQuota: quota.Ptr(int64(10_000))})
	_, key := s.tenant(tier.Slug)
	base, other := s.start(), s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)

	if r := c.get("/console/policies"); r.status != 200 || !strings.Contains(string(r.body), "No policies") ||
		!strings.Contains(string(r.body), `href="/console/policies" aria-current="page"`) {
		t.Fatalf("empty list: %d, want the page saying there are none, Policies current in the nav:\n%s", r.status, r.body)
	}
	tok := c.csrf("/console/new-policy")

	// Create.
	form := map[string]string{"name": "reports-window", "algorithm": "fixed_window", "limit": "1,000", "window_seconds": "60",
		"match_meters": "demo, report", "match_tiers": tier.Slug, "match_methods": "get", "scope": "tenant", "cost": "requests",
		"on_refuse": "queue", "max_wait_ms": "2000"}
	r := c.post("/console/policies", policyPageForm(tok, form))
	if r.status != 303 || r.header.Get("Location") != "/console/policies?ok=policy-created#policy-reports-window" {
		t.Fatalf("create: %d to %q: %s", r.status, r.header.Get("Location"), r.body)
	}
	want := map[string]any{"name": "reports-window", "algorithm": "fixed_window", "limit": 1000.0, "window_seconds": 60.0,
		"match": map[string]any{"meters": []any{"demo", "report"}, "tiers": []any{tier.Slug}, "methods": []any{"GET"}},
		"scope": "tenant", "cost": "requests", "on_refuse": "queue", "max_wait_ms": 2000.0}
	if got, ok := storedPolicy(t, base, "reports-window"); !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("admin API after the create: %v, want %v", got, want)
	}
	// The other node applies it within a second.
	waitPolicy(t, other, key, "reports-window")
	list := c.get("/console/policies?ok=policy-created")
	for _, frag := range []string{`id="flash">Policy created`, `<tr id="policy-reports-window" data-policy="reports-window">`,
		`<td class="numbers">1,000 per 60 s</td>`, `<td class="scope">tenant</td>`,
		`<td class="match">meters demo, report; methods GET; tiers ` + tier.Slug + `</td>`,
		`<td class="on-refuse">queue, at most 2,000 ms</td>`, `<td class="cost">requests</td>`} {
		if !strings.Contains(string(list.body), frag) {
			t.Errorf("the list lacks %s:\n%s", frag, list.body)
		}
	}

	// The editor shows every field of it.
	edit := c.get("/console/policies/reports-window")
	for _, frag := range []string{`name="limit" type="number" value="1000"`, `name="window_seconds" type="number" value="60"`,
		`name="match_meters" type="text" value="demo, report"`, `name="match_methods" type="text" value="GET"`,
		`<option value="fixed_window" selected>`, `<option value="queue" selected>`, `name="max_wait_ms" type="number" value="2000"`,
		`action="/console/policies/reports-window/delete"`} {
		if !strings.Contains(string(edit.body), frag) {
			t.Errorf("the editor lacks %s", frag)
		}
	}
	if strings.Contains(string(edit.body), `name="name"`) {
		t.Error("the editor lets the name change")
	}

	// Edit: every field is the form's; absent ones go.
	form = map[string]string{"algorithm": "fixed_window", "limit": "50", "window_seconds": "60", "scope": "param",
		"param": "header:X-Region", "exceptions": "eu=80\r\n\r\n us = 20 \r\nkey=with=equals=5\r\nbig=1,500\r\n", "cost": "units",
		"on_refuse": "degrade", "fallback_status": "200", "fallback_content_type": "application/json",
		"fallback_body": "{\r\n  \"cached\": true\r\n}", "match_meters": "demo", "match_path_prefix": "/api/demo"}
	if r := c.post("/console/policies/reports-window", policyPageForm(tok, form)); r.status != 303 ||
		r.header.Get("Location") != "/console/policies?ok=policy-saved#policy-reports-window" {
		t.Fatalf("save: %d to %q: %s", r.status, r.header.Get("Location"), r.body)
	}
	want = map[string]any{"name": "reports-window", "algorithm": "fixed_window", "limit": 50.0, "window_seconds": 60.0,
		"match": map[string]any{"meters": []any{"demo"}, "path_prefix": "/api/demo"}, "scope": "param", "param": "header:X-Region",
		"exceptions": map[string]any{"eu": 80.0, "us": 20.0, "key=with=equals": 5.0, "big": 1500.0}, "cost": "units", "on_refuse": "degrade",
		"fallback": map[string]any{"status": 200.0, "content_type": "application/json", "body": "{\n  \"cached\": true\n}"}}
	if got, _ := storedPolicy(t, base, "reports-window"); !reflect.DeepEqual(got, want) {
		t.Fatalf("admin API after the save: %v, want %v", got, want)
	}
	edit = c.get("/console/policies/reports-window")
	if !strings.Contains(string(edit.body), ">\nbig=1500\neu=80\nkey=with=equals=5\nus=20\n</textarea>") {
		t.Errorf("the exceptions are not shown as value=limit lines:\n%s", edit.body)
	}

	// A body the API stored with CR LF survives a console save of another
	// field (the textarea sends every line break as CR LF, read as LF).
	if r := admin(t, "PATCH", base+"/admin/v1/policies/reports-window", `{"fallback": {"status": 200, "content_type": "text/plain", "body": "a\r\nb\n"}}`); r.status != 200 {
		t.Fatalf("PATCH: %d %s", r.status, r.body)
	}
	form = with(form, map[string]string{"fallback_content_type": "text/plain", "fallback_body": "a\r\nb\r\n", "limit": "60"})
	if r := c.post("/console/policies/reports-window", policyPageForm(tok, form)); r.status != 303 {
		t.Fatalf("save again: %d %s", r.status, r.body)
	}
	if got, _ := storedPolicy(t, base, "reports-window"); got["limit"] != 60.0 || got["fallback"].(map[string]any)["body"] != "a\r\nb\n" {
		t.Errorf("after a save of the limit: %v, want limit 60 and the body byte for byte", got)
	}

	// Delete.
	if r := c.post("/console/policies/reports-window/delete", "_csrf="+tok); r.status != 303 ||
		r.header.Get("Location") != "/console/policies?ok=policy-deleted" {
		t.Fatalf("delete: %d to %q: %s", r.status, r.header.Get("Location"), r.body)
	}
	if _, ok := storedPolicy(t, base, "reports-window"); ok {
		t.Fatal("the policy is still served after the delete")
	}
	for _, path := range []string{"/console/policies/reports-window", "/console/policies/Not%20A%20Name"} {
		if r := c.get(path); r.status != 404 || !isHTML(r) {
			t.Errorf("GET %s: %d, want a 404 page", path, r.status)
		}
	}
	if r := c.post("/console/policies/reports-window/delete", "_csrf="+tok); r.status != 404 || !isHTML(r) {
		t.Errorf("delete again: %d, want a 404 page", r.status)
	}
	if r := c.post("/console/policies/reports-window", policyPageForm(tok, form)); r.status != 404 || !isHTML(r) {
		t.Errorf("save a deleted policy: %d, want a 404 page", r.status)
	}
	// newest first: the delete, the second save, the PATCH, the first save, the create
	wantAudit := []string{"delete by console", "update by console", "update by admin", "update by console", "create by console"}
	if got := policyAudit(t, base, "reports-window"); !reflect.DeepEqual(got, wantAudit) {
		t.Errorf("audit of the policy: %v, want %v", got, wantAudit)
	}
	// The other node drops it within a second.
	for start := time.Now(); strings.Contains(do(t, "GET", other+"/api/demo/echo", key, "").header.Get("RateLimit-Policy"), "reports-window"); {
		if time.Since(start) > time.Second {
			t.Fatal("the other node still applies the policy 1 s after the delete")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConsolePolicyBadValuesChangeNothing: each bad value is shown beside
// its field, with the values as typed, answers 400 (409 for a name taken)
// and writes nothing.
func TestConsolePolicyBadValuesChangeNothing(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	mustPolicy(t, base, `{"name": "steady", "algorithm": "gcra", "rate": 5, "burst": 10, "match": {"meters": ["demo"]}}`)
	before, _ := storedPolicy(t, base, "steady")
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	tok := c.csrf("/console/new-policy")
	audit := auditCount(t, s)

	valid := map[string]string{"name": "fresh", "algorithm": "fixed_window", "limit": "10", "window_seconds": "60",
		"scope": "tenant", "cost": "requests", "on_refuse": "reject"}
	param := map[string]string{"scope": "param", "param": "header:X-Region"}
	degrade := map[string]string{"on_refuse": "degrade", "fallback_status": "200", "fallback_content_type": "text/plain", "fallback_body": "busy"}
	for _, tc := range []struct {
		change   map[string]string
		id, want string // the error's element (f-<field> or g-<group>) and a part of its text
		typed    string // a value the form must show again as typed ("" to skip)
		editToo  bool   // also try it on the editor of "steady" (with gcra's fields)
		createTo int    // the create's status (400 unless said)
	}{
		{change: map[string]string{"limit": "0"}, id: "f-limit", want: "must be an integer between 1 and", typed: `value="0"`},
		{change: map[string]string{"limit": "lots"}, id: "f-limit", want: "must be a whole number", typed: `value="lots"`},
		{change: map[string]string{"window_seconds": "-"}, id: "f-window_seconds", want: "is required by fixed_window"},
		{change: map[string]string{"buckets": "4"}, id: "f-buckets", want: "is not a field of fixed_window"},
		{change: map[string]string{"algorithm": "leaky"}, id: "f-algorithm", want: "must be one of fixed_window"},
		{change: map[string]string{"name": "Not A Name"}, id: "f-name", want: "lowercase letters", typed: `value="Not A Name"`},
		{change: map[string]string{"name": "steady"}, id: "f-name", want: `a policy "steady" exists`, createTo: 409},
		{change: map[string]string{"match_methods": "GET, FETCH"}, id: "f-match_methods", want: "methods must be HTTP methods", typed: `value="GET, FETCH"`},
		{change: map[string]string{"match_tiers": "Pro Plan"}, id: "f-match_tiers", want: "tiers must be tier slugs"},
		{change: map[string]string{"match_meters": "a|b"}, id: "f-match_meters", want: "meters must be 1 to 64 characters"},
		{change: map[string]string{"match_path_prefix": "api/x"}, id: "f-match_path_prefix", want: "path_prefix must start with /"},
		{change: map[string]string{"scope": "planet"}, id: "f-scope", want: "must be one of tenant"},
		{change: map[string]string{"scope": "param"}, id: "f-param", want: `must be "header:<name>"`},
		{change: with(param, map[string]string{"param": "cookie:x"}), id: "f-param", want: `must be "header:<name>"`},
		{change: map[string]string{"exceptions": "eu=5"}, id: "f-exceptions", want: `only for scope "param"`},
		{change: with(param, map[string]string{"exceptions": "eu=5\r\nus"}), id: "f-exceptions", want: "line 2: write value=limit"},
		{change: with(param, map[string]string{"exceptions": "eu=lots"}), id: "f-exceptions", want: "line 1: the limit must be a whole number"},
		{change: with(param, map[string]string{"exceptions": "eu=1,2"}), id: "f-exceptions", want: "line 1: the limit must be a whole number"},
		{change: with(param, map[string]string{"exceptions": "eu=5\r\neu=6"}), id: "f-exceptions", want: `"eu" is given twice`},
		{change: with(param, map[string]string{"exceptions": "eu=0"}), id: "f-exceptions", want: "within the bounds of the policy's own limit"},
		{change: map[string]string{"cost": "bytes"}, id: "f-cost", want: `must be "requests" or "units"`},
		{change: map[string]string{"algorithm": "concurrency", "window_seconds": "-", "lease_seconds": "30", "cost": "units"}, id: "f-cost", want: "counts requests in flight"},
		{change: map[string]string{"on_refuse": "queue"}, id: "f-max_wait_ms", want: `is required by on_refuse "queue"`, editToo: true},
		{change: map[string]string{"on_refuse": "queue", "max_wait_ms": "600000"}, id: "f-max_wait_ms", want: "between 1 and 60000", editToo: true},
		{change: map[string]string{"max_wait_ms": "100"}, id: "f-max_wait_ms", want: `only for on_refuse "queue"`, editToo: true},
		{change: map[string]string{"on_refuse": "wait"}, id: "f-on_refuse", want: "must be one of reject", editToo: true},
		{change: map[string]string{"on_refuse": "degrade"}, id: "g-fallback", want: `is required by on_refuse "degrade"`, editToo: true},
		{change: with(degrade, map[string]string{"fallback_status": "700"}), id: "f-fallback_status", want: "between 200 and 599", editToo: true},
		{change: with(degrade, map[string]string{"fallback_status": "-"}), id: "f-fallback_status", want: "is required", editToo: true},
		{change: with(degrade, map[string]string{"fallback_content_type": "-"}), id: "f-fallback_content_type", want: "content_type must be 1 to 200", editToo: true},
		{change: with(degrade, map[string]string{"on_refuse": "reject"}), id: "g-fallback", want: `only for on_refuse "degrade"`, editToo: true},
	} {
		name := fmt.Sprintf("%v", tc.change)
		want := 400
		if tc.createTo != 0 {
			want = tc.createTo
		}
		r := c.post("/console/policies", policyPageForm(tok, with(valid, tc.change)))
		if r.status != want || !isHTML(r) {
			t.Errorf("create %s: %d, want %d HTML", name, r.status, want)
			continue
		}
		if got := fieldErrorOf(r.body, tc.id); !strings.Contains(got, tc.want) {
			t.Errorf("create %s: error beside %s %q, want %q", name, tc.id, got, tc.want)
		}
		if !strings.Contains(string(r.body), `id="form-errors"`) || !strings.Contains(string(r.body), "not saved") {
			t.Errorf("create %s: no summary saying the policy was not saved", name)
		}
		if strings.HasPrefix(tc.id, "f-") && !regexp.MustCompile(`id="`+tc.id+`"[^>]*aria-invalid="true"`).Match(r.body) {
			t.Errorf("create %s: field %s not marked invalid", name, tc.id)
		}
		if tc.typed != "" && !strings.Contains(string(r.body), tc.typed) {
			t.Errorf("create %s: the form lost the typed value %s", name, tc.typed)
		}
		if tc.editToo {
			gcra := with(valid, map[string]string{"name": "-", "algorithm": "gcra", "limit": "-", "window_seconds": "-", "rate": "5", "burst": "10"})
			r := c.post("/console/policies/steady", policyPageForm(tok, with(gcra, tc.change)))
			if r.status != 400 || fieldErrorOf(r.body, tc.id) == "" || !strings.Contains(fieldErrorOf(r.body, tc.id), tc.want) {
				t.Errorf("edit %s: %d, error beside %s %q, want 400 and %q", name, r.status, tc.id, fieldErrorOf(r.body, tc.id), tc.want)
			}
		}
	}
	// The editor shows the bad values as typed, beside the policy's name.
	r := c.post("/console/policies/steady", policyPageForm(tok, map[string]string{"algorithm": "gcra", "rate": "fast", "burst": "10",
		"scope": "tenant", "cost": "requests", "on_refuse": "reject"}))
	if r.status != 400 || fieldErrorOf(r.body, "f-rate") != "must be a number, such as 0.5 or 10" ||
		!strings.Contains(string(r.body), `name="rate" type="number" value="fast"`) || !strings.Contains(string(r.body), `action="/console/policies/steady"`) {
		t.Errorf("edit rate=fast: %d %q:\n%s", r.status, fieldErrorOf(r.body, "f-rate"), r.body)
	}

	// Malformed forms: 4xx pages.
	for _, tc := range []struct{ path, body string }{
		{"/console/policies", policyPageForm(tok, with(valid, map[string]string{"colour": "red"}))},
		{"/console/policies", policyPageForm(tok, with(valid, map[string]string{"param": "a\x01b"}))},
		{"/console/policies", policyPageForm(tok, with(valid, map[string]string{"fallback_body": "a\x00b"}))},
		{"/console/policies", policyPageForm(tok, valid) + "&exceptions=%FF"},
		{"/console/policies/steady", policyPageForm(tok, with(valid, map[string]string{}))}, // name on the editor
		{"/console/policies", policyPageForm(tok, valid) + "&limit=11"},
		{"/console/policies/steady/delete", "_csrf=" + tok + "&name=steady"},
	} {
		if r := c.post(tc.path, tc.body); r.status != 400 || !isHTML(r) {
			t.Errorf("POST %s %.80q: %d, want a 400 page", tc.path, tc.body, r.status)
		}
	}

	if after := auditCount(t, s); after != audit {
		t.Errorf("bad values wrote %d audit entries", after-audit)
	}
	if got, _ := storedPolicy(t, base, "steady"); !reflect.DeepEqual(got, before) {
		t.Errorf("steady after the bad values: %v, want %v", got, before)
	}
	if _, ok := storedPolicy(t, base, "fresh"); ok {
		t.Error("a refused create created the policy")
	}
	// The valid form itself is fine.
	if r := c.post("/console/policies", policyPageForm(tok, valid)); r.status != 303 {
		t.Errorf("the valid form: %d, want 303: %s", r.status, r.body)
	}
}

// TestConsolePolicyPostsNeedTheSessionToken: the policies' forms refuse a
// request without the session's CSRF token, with a wrong one, from another
// origin or site, or without a session, and change nothing.
func TestConsolePolicyPostsNeedTheSessionToken(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	mustPolicy(t, base, `{"name": "steady", "algorithm": "gcra", "rate": 5, "burst": 10}`)
	before, _ := storedPolicy(t, base, "steady")
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	tok := c.csrf("/console/policies")
	audit := auditCount(t, s)
	fields := map[string]string{"algorithm": "gcra", "rate": "1", "burst": "1", "scope": "tenant", "cost": "requests", "on_refuse": "reject"}
	for _, route := range []struct{ path, body string }{
		{"/console/policies", policyPageForm("", with(fields, map[string]string{"name": "forged"}))},
		{"/console/policies/steady", policyPageForm("", fields)},
		{"/console/policies/steady/delete", ""},
	} {
		withTok := func(v string) string {
			b := route.body
			if v != "" {
				b = strings.TrimPrefix(b+"&_csrf="+url.QueryEscape(v), "&")
			}
			return b
		}
		for _, tc := range []struct {
			name    string
			c       *webClient
			body    string
			headers []string
			want    int
		}{
			{"no token", c, withTok(""), nil, 403},
			{"wrong token", c, withTok(strings.Repeat("A", 43)), nil, 403},
			{"other origin", c, withTok(tok), []string{"Origin", "https://evil.example"}, 403},
			{"cross-site", c, withTok(tok), []string{"Sec-Fetch-Site", "cross-site"}, 403},
			{"JSON body", c, `{"_csrf":"` + tok + `"}`, []string{"Content-Type", "application/json"}, 415},
			{"no session", newWebClient(t, base), withTok(tok), nil, 303},
		} {
			r := tc.c.post(route.path, tc.body, tc.headers...)
			if r.status != tc.want || (tc.want == 303) != strings.HasPrefix(r.header.Get("Location"), "/console/login") {
				t.Errorf("POST %s, %s: %d to %q, want %d", route.path, tc.name, r.status, r.header.Get("Location"), tc.want)
			}
		}
	}
	if after := auditCount(t, s); after != audit {
		t.Errorf("forged requests wrote %d audit entries", after-audit)
	}
	if got, _ := storedPolicy(t, base, "steady"); !reflect.DeepEqual(got, before) {
		t.Errorf("steady after forged requests: %v, want %v", got, before)
	}
	if names := policyNames(t, base); !reflect.DeepEqual(names, []string{"steady"}) {
		t.Errorf("policies after forged requests: %v", names)
	}
	// The same requests with the token go through.
	if r := c.post("/console/policies/steady/delete", "_csrf="+url.QueryEscape(tok)); r.status != 303 {
		t.Errorf("delete with the token: %d, want 303", r.status)
	}
	// And the pages themselves need a session.
	for _, path := range []string{"/console/policies", "/console/new-policy", "/console/policies/steady"} {
		if r := newWebClient(t, base).get(path); r.status != 303 || !strings.HasPrefix(r.header.Get("Location"), "/console/login") {
			t.Errorf("GET %s without a session: %d to %q", path, r.status, r.header.Get("Location"))
		}
	}
}

// whenRE finds the fields of the policy editor that only some values of
// another control show, and those values.
var whenRE = regexp.MustCompile(`<div class="field" data-when="([a-z_]+)=([a-z_,]+)">\s*<label for="f-([a-z_]+)">`)

// TestConsolePolicyFormFieldsFollowTheAlgorithm: for every algorithm, the
// fields the editor shows for it (data-when, what its script leaves
// enabled) are exactly what the policy needs: sent alone, they create it.
func TestConsolePolicyFormFieldsFollowTheAlgorithm(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	page := c.get("/console/new-policy")
	algorithmFields := map[string][]string{}
	for _, m := range whenRE.FindAllStringSubmatch(string(page.body), -1) {
		if m[1] != "algorithm" {
			continue
		}
		for _, a := range strings.Split(m[2], ",") {
			algorithmFields[a] = append(algorithmFields[a], m[3])
		}
	}
	sample := map[string]string{"limit": "10", "window_seconds": "60", "buckets": "6", "capacity": "10", "refill_per_sec": "0.5",
		"rate": "2", "burst": "5", "lease_seconds": "30", "warmup_seconds": "10", "cold_factor": "4", "max_concurrency": "50",
		"target_latency_ms": "200"}
	tok := c.csrf("/console/new-policy")
	for _, a := range quota.Algorithms {
		fields := algorithmFields[string(a)]
		if len(fields) == 0 {
			t.Errorf("%s: the editor shows no field for it", a)
			continue
		}
		name := "every-" + strings.ReplaceAll(string(a), "_", "-")
		form := map[string]string{"name": name, "algorithm": string(a), "scope": "tenant", "cost": "requests", "on_refuse": "reject"}
		for _, f := range fields {
			form[f] = sample[f]
		}
		if r := c.post("/console/policies", policyPageForm(tok, form)); r.status != 303 {
			t.Errorf("%s with %v: %d, want 303: %s", a, fields, r.status, fieldErrors(r.body))
			continue
		}
		got, _ := storedPolicy(t, base, name)
		for _, f := range fields {
			if fmt.Sprint(got[f]) != sample[f] {
				t.Errorf("%s: %s stored %v, want %s", a, f, got[f], sample[f])
			}
		}
	}
	// The fields shown for a scope and a refusal mode.
	shown := map[string]string{}
	for _, m := range whenRE.FindAllStringSubmatch(string(page.body), -1) {
		if m[1] != "algorithm" {
			shown[m[3]] = m[1] + "=" + m[2]
		}
	}
	if want := map[string]string{"param": "scope=param", "exceptions": "scope=param", "max_wait_ms": "on_refuse=queue"}; !reflect.DeepEqual(shown, want) {
		t.Errorf("fields shown by scope or on_refuse: %v, want %v", shown, want)
	}
	if !strings.Contains(string(page.body), `<fieldset id="g-fallback" data-when="on_refuse=degrade">`) {
		t.Error("the fallback's fields are not shown for degrade only")
	}
}

// fieldErrors lists the errors shown beside fields of a page, for messages.
func fieldErrors(page []byte) []string {
	var out []string
	for _, m := range regexp.MustCompile(`id="([a-z_-]+)-error">([^<]*)<`).FindAllSubmatch(page, -1) {
		out = append(out, string(m[1])+": "+html.UnescapeString(string(m[2])))
	}
	return out
}

// dashPolicy is a row of the dashboard's policies table.
type dashPolicy struct {
	Algorithm string `json:"algorithm"`
	Limit     string `json:"limit"`
	Remaining string `json:"remaining"`
	Reset     string `json:"reset"` // the datetime; "" when none
}

const readDashPolicies = `Object.fromEntries([...document.querySelectorAll("#policies-table tr[data-policy]")].map(r => [r.dataset.policy, {
	algorithm: r.querySelector(".algorithm").textContent.trim(), limit: r.querySelector(".limit").textContent.trim(),
	remaining: r.querySelector(".remaining").textContent.trim(),
	reset: r.querySelector("time.reset") ? r.querySelector("time.reset").getAttribute("datetime") : ""}]))`

// apiPolicies reads /v1/usage's policies.
func apiPolicies(t *testing.T, base, key string) []struct {
	Name      string  `json:"name"`
	Algorithm string  `json:"algorithm"`
	Limit     int64   `json:"limit"`
	Remaining *int64  `json:"remaining"`
	Reset     *string `json:"reset"`
} {
	t.Helper()
	var u struct {
		Policies []struct {
			Name      string  `json:"name"`
			Algorithm string  `json:"algorithm"`
			Limit     int64   `json:"limit"`
			Remaining *int64  `json:"remaining"`
			Reset     *string `json:"reset"`
		} `json:"policies"`
	}
	r := do(t, "GET", base+"/v1/usage", key, "")
	if r.status != 200 {
		t.Fatalf("GET /v1/usage: %d %s", r.status, r.body)
	}
	if err := json.Unmarshal(r.body, &u); err != nil {
		t.Fatal(err)
	}
	return u.Policies
}

// TestBrowserDashboardShowsThePoliciesOfTheAPI: the tenant's dashboard
// lists the policies of its tier with the numbers of /v1/usage: limit,
// remaining and reset, "per request" where /v1/usage's remaining is null;
// the policies of other tiers are not listed.
func TestBrowserDashboardShowsThePoliciesOfTheAPI(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(41, quota.Limits{DailyQuota: quota.Ptr(int64(10_000))})
	otherTier := s.tier(42, quota.Limits{DailyQuota: quota.Ptr(int64(10_000))})
	_, key := s.tenant(tier.Slug)
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("dashboard", key)
	if r := c.get("/dashboard"); !strings.Contains(string(r.body), "No policies apply to your plan") {
		t.Errorf("before any policy: the dashboard does not say none applies:\n%s", r.body)
	}
	// Long windows and slow rates: what the policies show moves only with
	// the requests below. a-window is created last, so that a node applying
	// it applies the others too.
	for _, p := range []string{
		`{"name": "b-log", "algorithm": "sliding_log", "limit": 50, "window_seconds": 86400, "scope": "global"}`,
		`{"name": "c-per-key", "algorithm": "gcra", "rate": 0.0001, "burst": 30, "scope": "key"}`,
		`{"name": "d-shadow", "algorithm": "fixed_window", "limit": 3, "window_seconds": 31536000, "on_refuse": "shadow"}`,
		`{"name": "e-others", "algorithm": "fixed_window", "limit": 5, "window_seconds": 60, "match": {"tiers": ["` + otherTier.Slug + `"]}}`,
		`{"name": "a-window", "algorithm": "fixed_window", "limit": 1200, "window_seconds": 31536000, "match": {"tiers": ["` + tier.Slug + `"]}}`,
	} {
		mustPolicy(t, base, p)
	}
	waitPolicy(t, base, key, "a-window") // (this request counts, as the next do)
	for range 3 {
		mustStatus(t, do(t, "GET", base+"/api/demo/echo", key, ""), 200)
	}

	b := browser(t, desktopW, desktopH)
	if st := signIn(t, b, base, "dashboard", key); st != 200 || location(t, b) != "/dashboard" {
		t.Fatalf("sign-in: %s (%d)", location(t, b), st)
	}
	// The page is read between two reads of the API: nothing is consumed
	// meanwhile, so limits and remaining agree exactly; a reset that moves
	// with the clock (sliding_log's: its window's end as of now) lies
	// between the two.
	first := apiPolicies(t, base, key)
	mustNavigate(t, b, base, "/dashboard", 200)
	got := evalJS[map[string]dashPolicy](t, b, readDashPolicies)
	want := apiPolicies(t, base, key)
	if len(want) != 4 || len(got) != len(want) || len(first) != len(want) {
		t.Fatalf("policies: page %v, API %+v; want the four of the tier on both", got, want)
	}
	for i, w := range want {
		g, ok := got[w.Name]
		if !ok {
			t.Errorf("%s: in /v1/usage, not on the page", w.Name)
			continue
		}
		exp := dashPolicy{Algorithm: w.Algorithm, Limit: commas(w.Limit), Remaining: "per request"}
		if w.Remaining != nil {
			exp.Remaining, exp.Reset = commas(*w.Remaining), *w.Reset
			if f := first[i]; f.Name == w.Name && f.Reset != nil && g.Reset >= *f.Reset && g.Reset <= *w.Reset {
				exp.Reset = g.Reset
			}
		}
		if g != exp {
			t.Errorf("%s: page %+v, API %s (want %+v)", w.Name, g, jsonOf(w), exp)
		}
	}
	if r := got["a-window"]; r.Remaining == "per request" || r.Remaining == commas(1200) {
		t.Errorf("a-window shows %+v: want what is left of 1,200 after the requests (the test's premise)", r)
	}
	if r := got["c-per-key"]; r.Remaining != "per request" || r.Reset != "" {
		t.Errorf("c-per-key (scope key) shows %+v, want per request", r)
	}
	if _, ok := got["e-others"]; ok {
		t.Error("a policy of another tier is listed")
	}
	if txt := text(t, b, "#policies .hint:last-of-type"); !strings.Contains(txt, "per API key") {
		t.Errorf("no hint saying what per request means: %q", txt)
	}
	if r := got["d-shadow"]; r.Remaining != "0" {
		t.Errorf("d-shadow (3 a year, shadow) shows %+v, want 0 remaining after the requests", r)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "")
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// choose selects value in the select with id, as a user would: the page's
// script hears the change.
func choose(tb testing.TB, ctx context.Context, id, value string) {
	tb.Helper()
	js := fmt.Sprintf(`(() => { const s = document.getElementById(%q); s.value = %q; s.dispatchEvent(new Event("change", {bubbles: true})); return s.value; })()`, id, value)
	if got := evalJS[string](tb, ctx, js); got != value {
		tb.Fatalf("select #%s: %q, want %q", id, got, value)
	}
}

// visible reports whether the element with id is shown and enabled.
func visible(tb testing.TB, ctx context.Context, id string) bool {
	tb.Helper()
	return evalJS[bool](tb, ctx, fmt.Sprintf(`(() => { const e = document.getElementById(%q); return !!e && e.offsetParent !== null && !e.disabled; })()`, id))
}

// TestBrowserAdminCreatesAPolicy: an admin creates a policy through the
// console's form: a bad value first is shown beside its field and creates
// nothing; corrected, the policy is listed and served by the admin API;
// edited and deleted from its page.
func TestBrowserAdminCreatesAPolicy(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(43, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	base := s.start()
	b := browser(t, desktopW, desktopH)
	consoleSignIn(t, b, base)

	mustNavigate(t, b, base, "/console/policies", 200)
	if st := submit(t, b, "#new-policy"); st != 200 || location(t, b) != "/console/new-policy" {
		t.Fatalf("New policy: %s (%d)", location(t, b), st)
	}
	// The fields follow the algorithm.
	choose(t, b, "f-algorithm", "token_bucket")
	if !visible(t, b, "f-capacity") || !visible(t, b, "f-refill_per_sec") || visible(t, b, "f-limit") || visible(t, b, "f-window_seconds") ||
		visible(t, b, "f-max_wait_ms") || visible(t, b, "f-fallback_body") || visible(t, b, "f-param") {
		t.Error("token_bucket: want capacity and refill_per_sec shown, limit, window, max wait, fallback and param hidden")
	}
	fill(t, b, "f-name", "search-bucket")
	fill(t, b, "f-capacity", "0")
	fill(t, b, "f-refill_per_sec", "0.5")
	fill(t, b, "f-match_meters", "demo")
	fill(t, b, "f-match_tiers", tier.Slug)
	choose(t, b, "f-on_refuse", "queue")
	if !visible(t, b, "f-max_wait_ms") {
		t.Error("queue: max wait not shown")
	}
	fill(t, b, "f-max_wait_ms", "1500")
	if st := submit(t, b, "form.policy-form button[type=submit]"); st != 400 {
		t.Errorf("capacity 0: status %d, want 400", st)
	}
	if got := text(t, b, "#f-capacity-error"); !strings.Contains(got, "must be an integer between 1 and") {
		t.Errorf("error beside capacity %q", got)
	}
	if got := evalJS[string](t, b, `document.getElementById("f-capacity").getAttribute("aria-invalid")`); got != "true" {
		t.Error("capacity not marked invalid")
	}
	if !strings.Contains(text(t, b, "#form-errors"), "not saved") {
		t.Error("no summary saying the policy was not saved")
	}
	for id, v := range map[string]string{"f-name": "search-bucket", "f-capacity": "0", "f-refill_per_sec": "0.5", "f-algorithm": "token_bucket",
		"f-on_refuse": "queue", "f-max_wait_ms": "1500", "f-match_tiers": tier.Slug} {
		if got := evalJS[string](t, b, fmt.Sprintf(`document.getElementById(%q).value`, id)); got != v {
			t.Errorf("the form lost %s: %q, want %q", id, got, v)
		}
	}
	if _, ok := storedPolicy(t, base, "search-bucket"); ok {
		t.Fatal("the refused form created the policy")
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "invalid")

	fill(t, b, "f-capacity", "40")
	if st := submit(t, b, "form.policy-form button[type=submit]"); st != 200 || !strings.HasPrefix(location(t, b), "/console/policies?ok=policy-created") {
		t.Fatalf("corrected: %s (%d), want the list", location(t, b), st)
	}
	if got := text(t, b, "#flash"); !strings.HasPrefix(got, "Policy created") {
		t.Errorf("flash %q", got)
	}
	if got := text(t, b, "#policy-search-bucket .numbers"); got != "capacity 40, refills 0.5/s" {
		t.Errorf("the list shows %q", got)
	}
	want := map[string]any{"name": "search-bucket", "algorithm": "token_bucket", "capacity": 40.0, "refill_per_sec": 0.5,
		"match": map[string]any{"meters": []any{"demo"}, "tiers": []any{tier.Slug}}, "scope": "tenant", "cost": "requests",
		"on_refuse": "queue", "max_wait_ms": 1500.0}
	if got, ok := storedPolicy(t, base, "search-bucket"); !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("admin API: %v, want %v", got, want)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "")

	// Edit: degrade to a fallback.
	if st := submit(t, b, `a[href="/console/policies/search-bucket"][aria-label]`); st != 200 {
		t.Fatalf("edit link: %d", st)
	}
	if visible(t, b, "f-limit") || !visible(t, b, "f-capacity") {
		t.Error("the editor of a token_bucket shows limit or hides capacity")
	}
	choose(t, b, "f-on_refuse", "degrade")
	if visible(t, b, "f-max_wait_ms") || !visible(t, b, "f-fallback_body") {
		t.Error("degrade: want the fallback shown and max wait hidden")
	}
	fill(t, b, "f-fallback_status", "200")
	fill(t, b, "f-fallback_content_type", "application/json")
	fill(t, b, "f-fallback_body", `{"results": []}`)
	if st := submit(t, b, "form.policy-form button[type=submit]"); st != 200 || !strings.HasPrefix(location(t, b), "/console/policies?ok=policy-saved") {
		t.Fatalf("save: %s (%d): %s", location(t, b), st, text(t, b, "main"))
	}
	got, _ := storedPolicy(t, base, "search-bucket")
	if got["on_refuse"] != "degrade" || got["max_wait_ms"] != nil ||
		!reflect.DeepEqual(got["fallback"], map[string]any{"status": 200.0, "content_type": "application/json", "body": `{"results": []}`}) {
		t.Errorf("after the edit: %v", got)
	}
	if got := text(t, b, "#policy-search-bucket .on-refuse"); got != "degrade to 200 application/json" {
		t.Errorf("the list shows %q", got)
	}

	// Delete from the list.
	if st := submit(t, b, "#policy-search-bucket form button"); st != 200 || !strings.HasPrefix(location(t, b), "/console/policies?ok=policy-deleted") {
		t.Fatalf("delete: %s (%d)", location(t, b), st)
	}
	if got := text(t, b, "#policy-search-bucket"); got != "<none>" {
		t.Errorf("the deleted policy is listed: %q", got)
	}
	if _, ok := storedPolicy(t, base, "search-bucket"); ok {
		t.Error("the admin API serves the deleted policy")
	}
	if got := policyAudit(t, base, "search-bucket"); !reflect.DeepEqual(got, []string{"delete by console", "update by console", "create by console"}) {
		t.Errorf("audit %v", got)
	}

	// The pages fit a phone.
	mustPolicy(t, base, `{"name": "hot-regions", "algorithm": "sliding_window", "limit": 100, "window_seconds": 60, "buckets": 6,
		"scope": "param", "param": "header:X-Region", "exceptions": {"eu-west-1": 500}, "match": {"meters": ["demo", "report"], "path_prefix": "/api/demo/"}}`)
	phone := browser(t, phoneW, phoneH)
	consoleSignIn(t, phone, base)
	for _, p := range []struct{ name, path string }{
		{"phone-list", "/console/policies"}, {"phone-new", "/console/new-policy"}, {"phone-edit", "/console/policies/hot-regions"},
	} {
		mustNavigate(t, phone, base, p.path, 200)
		checkPage(t, phone)
		testenv.Screenshot(t, phone, p.name)
	}
	if !visible(t, phone, "f-exceptions") || !visible(t, phone, "f-param") || !visible(t, phone, "f-buckets") {
		t.Error("the editor of a param sliding_window hides its param, exceptions or buckets")
	}
}
