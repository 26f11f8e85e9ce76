package api

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Policies see the request as the upstream does: a path_prefix and a
// path:N value are read on the path the route was matched on and the
// upstream acts on, in every spelling an upstream may read alike, and a
// header or query value is the one value the upstream can read.

// policyRoutes is one catch-all route to a recording upstream under
// /items/: the upstream's path is /items/ followed by the rest.
const policyRoutes = `{"method": "*", "path": "/api/items/", "meter": "items", "cost": 1, "upstream": "%[1]s/items/"}`

// policyAt creates a policy through base and waits until a request for
// target (raw) is under it: its name in RateLimit-Policy or among the
// refusals. target must be one the policy's own count may take.
func policyAt(t *testing.T, base, key, target, body, name string) {
	t.Helper()
	mustPolicy(t, base, body)
	start := time.Now()
	for {
		r := rawGet(t, base, target, key)
		if strings.Contains(r.header.Get("RateLimit-Policy"), `"`+name+`"`) || strings.Contains(string(r.body), `"`+name+`"`) {
			return
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("%s is not under policy %s 2 s after it was created: %d %q", target, name, r.status, r.header.Get("RateLimit-Policy"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// refusedBy reports whether r is the 429 of the policy name.
func refusedBy(r reply, name string) bool {
	return r.status == 429 && strings.Contains(string(r.body), `"`+name+`"`)
}

// TestParamPolicyCountsThePathTheUpstreamActsOn: a path:2 policy counts
// every spelling of a value the upstream acts on as that value: escaped,
// with a ;parameter, behind empty segments; an exception's value in any
// spelling is held to the exception's limit; values keep their case; a path
// that upstreams read as different segments (an encoded slash or backslash
// at or before the value) is 400 naming the path.
func TestParamPolicyCountsThePathTheUpstreamActsOn(t *testing.T) {
	t.Parallel()
	up := newSeeingUpstream(t, nil)
	base, _, key := proxyStack(t, policyRoutes, up.srv.URL, 100_000)
	policyAt(t, base, key, "/api/items/warm-up", `{"name": "per-item", "algorithm": "fixed_window", "limit": 2, "window_seconds": 300,
		"scope": "param", "param": "path:2", "exceptions": {"hot": 1, "café": 1}}`, "per-item")
	up.take()

	for range 2 {
		if r := rawGet(t, base, "/api/items/42", key); r.status != 200 {
			t.Fatalf("GET /api/items/42: %d %s, want 200 twice", r.status, r.body)
		}
	}
	if got := up.take(); len(got) != 2 || got[0].uri != "/items/42" {
		t.Fatalf("the upstream received %v, want /items/42 twice", got)
	}
	refused := func(targets ...string) {
		t.Helper()
		for _, target := range targets {
			if r := rawGet(t, base, target, key); !refusedBy(r, "per-item") {
				t.Errorf("GET %s: %d %s, want 429 by per-item (its value is one used up)", target, r.status, r.body)
			}
			if got := up.take(); len(got) != 0 {
				t.Errorf("GET %s: the upstream received %s", target, got[0].uri)
			}
		}
	}
	refused("/api/items/42", "/api/items/%342", "/api/items/4%32", "/api/items/%34%32", "/api/items/42;x",
		"/api/items/42;v=1/sub", "/api/items//42", "/api/items///42", "/api/items/;x/42", "/api/items/42/", "/api/items//42//x")

	// an exception's value, in any spelling, has the exception's limit
	if r := rawGet(t, base, "/api/items/hot", key); r.status != 200 {
		t.Fatalf("GET /api/items/hot: %d %s, want 200", r.status, r.body)
	}
	if r := rawGet(t, base, "/api/items/caf%C3%A9", key); r.status != 200 {
		t.Fatalf("GET /api/items/caf%%C3%%A9: %d %s, want 200", r.status, r.body)
	}
	up.take()
	refused("/api/items/%68ot", "/api/items/h%6Ft;v=2", "/api/items//hot", "/api/items/caf%c3%a9", "/api/items/caf%C3%A9")

	// values keep their case: HOT is another value than hot, of the policy's own limit
	for range 2 {
		if r := rawGet(t, base, "/api/items/HOT", key); r.status != 200 {
			t.Fatalf("GET /api/items/HOT: %d %s, want 200 twice", r.status, r.body)
		}
	}
	up.take()
	refused("/api/items/%48OT")

	// a value an upstream may read as two segments, or a segment an
	// escaped separator moves, names no one value: refused, unforwarded
	for _, target := range []string{"/api/items/4%2F2", "/api/items/4%2f2", "/api/items/4%5C2", `/api/items/4\2`, "/api/items/a%2F/42"} {
		r := rawGet(t, base, target, key)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.body), `"field":"path"`) {
			t.Errorf("GET %s: %d %s, want 400 problem+json naming the path", target, r.status, r.body)
		}
		if got := up.take(); len(got) != 0 {
			t.Errorf("GET %s: the upstream received %s", target, got[0].uri)
		}
	}
	// past the value an escaped slash changes nothing: 7's own count
	for _, target := range []string{"/api/items/7/a%2Fb", "/api/items/7/a%5Cb"} {
		if r := rawGet(t, base, target, key); r.status != 200 {
			t.Errorf("GET %s: %d %s, want 200", target, r.status, r.body)
		}
	}
	up.take()
	refused("/api/items/7")
}

// TestPathPrefixPolicyMatchesThePathTheUpstreamActsOn: a path_prefix
// policy applies to every spelling of a path under its prefix that an
// upstream may act on as one: escaped, behind empty segments, with a
// ;parameter, in another case; and not to a path outside it.
func TestPathPrefixPolicyMatchesThePathTheUpstreamActsOn(t *testing.T) {
	t.Parallel()
	up := newSeeingUpstream(t, nil)
	base, _, key := proxyStack(t, policyRoutes, up.srv.URL, 100_000)
	// the one admission the policy allows is the warm-up's
	policyAt(t, base, key, "/api/items/expensive", `{"name": "expensive", "algorithm": "fixed_window", "limit": 1, "window_seconds": 300,
		"match": {"path_prefix": "/api/items/expensive"}}`, "expensive")
	up.take()
	for _, target := range []string{
		"/api/items/expensive", "/api/items/%65xpensive", "/api/items/%65%78pensive/x", "/api/items//expensive",
		"/api/items///expensive/x", "/api/items/expensive;v=1", "/api/items/;x/expensive", "/api/items/Expensive",
		"/api/items/EXPENSIVE/x", "/api/items/expensiv%45", "/api/items/expensive-report",
	} {
		if r := rawGet(t, base, target, key); !refusedBy(r, "expensive") {
			t.Errorf("GET %s: %d %s, want 429 by expensive", target, r.status, r.body)
		}
		if got := up.take(); len(got) != 0 {
			t.Errorf("GET %s: the upstream received %s", target, got[0].uri)
		}
	}
	for _, target := range []string{"/api/items/cheap", "/api/items/x/expensive", "/api/items/expens", "/api/items/x%2Fexpensive"} {
		if r := rawGet(t, base, target, key); r.status != 200 || strings.Contains(r.header.Get("RateLimit-Policy"), "expensive") {
			t.Errorf("GET %s: %d, RateLimit-Policy %q; want 200, not under the policy", target, r.status, r.header.Get("RateLimit-Policy"))
		}
	}
}

// TestAdminPolicyPathPrefixInNormalForm: a path_prefix is stored in the
// normal form request paths are matched in; one that is no plain path, or
// holds a ;parameter (which upstreams drop), is 400 naming match.
func TestAdminPolicyPathPrefixInNormalForm(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	const window = `"algorithm": "fixed_window", "limit": 10, "window_seconds": 60`
	for i, tc := range []struct{ prefix, stored string }{
		{"/api/items/%65xpensive", "/api/items/expensive"},
		{"/api/a%2fb%7e/", "/api/a%2Fb~/"},
		{"/api/W2/", "/api/W2/"},
	} {
		name := fmt.Sprintf("p%d", i)
		r := admin(t, "POST", base+"/admin/v1/policies", fmt.Sprintf(`{"name": %q, %s, "match": {"path_prefix": %q}}`, name, window, tc.prefix))
		if r.status != 201 || !strings.Contains(string(r.body), `"path_prefix":"`+tc.stored+`"`) {
			t.Errorf("create with path_prefix %s: %d %s, want 201 with %s", tc.prefix, r.status, r.body, tc.stored)
		}
		got := admin(t, "GET", base+"/admin/v1/policies/"+name, "")
		if !strings.Contains(string(got.body), `"path_prefix":"`+tc.stored+`"`) {
			t.Errorf("stored path_prefix of %s: %s, want %s", tc.prefix, got.body, tc.stored)
		}
	}
	if r := admin(t, "PATCH", base+"/admin/v1/policies/p0", `{"match": {"path_prefix": "/api/%77/x"}}`); r.status != 200 || !strings.Contains(string(r.body), `"path_prefix":"/api/w/x"`) {
		t.Errorf("patch path_prefix /api/%%77/x: %d %s, want 200 with /api/w/x", r.status, r.body)
	}
	names := policyNames(t, base)
	for _, prefix := range []string{"/api/items;v=1/", "/api/%zz", "/api/%2e%2e/admin", "/api/a b", "api/x"} {
		body := fmt.Sprintf(`{"name": "bad", %s, "match": {"path_prefix": %q}}`, window, prefix)
		r := admin(t, "POST", base+"/admin/v1/policies", body)
		if r.status != 400 || !strings.Contains(string(r.body), `"field":"match"`) {
			t.Errorf("create with path_prefix %q: %d %s, want 400 naming match", prefix, r.status, r.body)
		}
		if r := admin(t, "PATCH", base+"/admin/v1/policies/p0", fmt.Sprintf(`{"match": {"path_prefix": %q}}`, prefix)); r.status != 400 {
			t.Errorf("patch with path_prefix %q: %d %s, want 400", prefix, r.status, r.body)
		}
	}
	if after := policyNames(t, base); fmt.Sprint(after) != fmt.Sprint(names) {
		t.Errorf("policies %v after refused writes, want %v", after, names)
	}
}

// TestParamPolicyTakesOneHeaderOrQueryValue: a header or query parameter
// a param policy limits by is one value: repeated with another value it is
// 400 naming the param, unforwarded; repeated alike it counts once. A
// header counts whatever its case and with _ read as - (as a CGI-style
// upstream reads it), and a query parameter's name and value as decoded,
// its name in any case (as upstreams that ignore it read it).
func TestParamPolicyTakesOneHeaderOrQueryValue(t *testing.T) {
	t.Parallel()
	up := newSeeingUpstream(t, nil)
	base, _, key := proxyStack(t, policyRoutes, up.srv.URL, 100_000)
	auth := "Authorization: Bearer " + key
	get := func(target string, headers ...string) reply {
		return raw(t, base, append([]string{"GET " + target + " HTTP/1.1", auth}, headers...)...)
	}
	mustPolicy(t, base, `{"name": "per-term", "algorithm": "fixed_window", "limit": 1, "window_seconds": 300,
		"scope": "param", "param": "header:X-Term"}`)
	mustPolicy(t, base, `{"name": "per-q", "algorithm": "fixed_window", "limit": 1, "window_seconds": 300,
		"scope": "param", "param": "query:q"}`)
	eventually(t, "both policies apply", func() bool {
		r := get("/api/items/x?q=warm-up", "X-Term: warm-up")
		return strings.Contains(r.header.Get("RateLimit-Policy"), `"per-term"`) && strings.Contains(r.header.Get("RateLimit-Policy"), `"per-q"`)
	})
	up.take()

	for _, tc := range []struct {
		target  string
		headers []string
		field   string
	}{
		{"/api/items/x", []string{"X-Term: a", "X-Term: b"}, "header:X-Term"},
		{"/api/items/x", []string{"X-Term: a", "x-term: b"}, "header:X-Term"},
		{"/api/items/x", []string{"X-Term: a", "X_Term: b"}, "header:X-Term"},
		{"/api/items/x", []string{"X-Term: a", "X-Term:"}, "header:X-Term"},
		{"/api/items/x?q=a&q=b", nil, "query:q"},
		{"/api/items/x?q=a&%71=b", nil, "query:q"},
		{"/api/items/x?q=a&q=", nil, "query:q"},
		{"/api/items/x?q=a&Q=b", nil, "query:q"},
	} {
		r := get(tc.target, tc.headers...)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.body), `"field":"`+tc.field+`"`) {
			t.Errorf("GET %s %q: %d %s, want 400 problem+json naming %s", tc.target, tc.headers, r.status, r.body, tc.field)
		}
		if got := up.take(); len(got) != 0 {
			t.Errorf("GET %s %q: the upstream received it", tc.target, tc.headers)
		}
	}
	// the same value twice is that value, once
	if r := get("/api/items/x?q=a&q=a", "X-Term: a", "X-Term: a"); r.status != 200 {
		t.Fatalf("one value twice: %d %s, want 200", r.status, r.body)
	}
	for _, tc := range []struct {
		target, header, policy string
	}{
		{"/api/items/x", "X-Term: a", "per-term"},
		{"/api/items/x", "x_term: a", "per-term"},
		{"/api/items/x", "X_TERM: a", "per-term"},
		{"/api/items/x?q=a", "", "per-q"},
		{"/api/items/x?%71=%61", "", "per-q"},
		{"/api/items/x?Q=a", "", "per-q"},
	} {
		var h []string
		if tc.header != "" {
			h = []string{tc.header}
		}
		if r := get(tc.target, h...); !refusedBy(r, tc.policy) {
			t.Errorf("GET %s %q: %d %s, want 429 by %s (a is used up)", tc.target, tc.header, r.status, r.body, tc.policy)
		}
	}
}

// TestGetPolicyAppliesToHead: a policy on GET applies to HEAD as well,
// which upstreams answer by doing GET's work and dropping the body.
func TestGetPolicyAppliesToHead(t *testing.T) {
	t.Parallel()
	up := newSeeingUpstream(t, nil)
	base, _, key := proxyStack(t, policyRoutes, up.srv.URL, 100_000)
	// the one admission the policy allows is the warm-up's
	policyAt(t, base, key, "/api/items/a", `{"name": "gets", "algorithm": "fixed_window", "limit": 1, "window_seconds": 300,
		"match": {"methods": ["GET"]}}`, "gets")
	up.take()
	if r := raw(t, base, "HEAD /api/items/a HTTP/1.1", "Authorization: Bearer "+key); r.status != 429 || !strings.Contains(r.header.Get("RateLimit-Policy"), `"gets"`) {
		t.Errorf("HEAD after the GET policy's one admission: %d, RateLimit-Policy %q; want 429 under gets", r.status, r.header.Get("RateLimit-Policy"))
	}
	if got := up.take(); len(got) != 0 {
		t.Errorf("HEAD: the upstream received %s", got[0].uri)
	}
	if r := raw(t, base, "POST /api/items/a HTTP/1.1", "Authorization: Bearer "+key); r.status != 200 {
		t.Errorf("POST: %d %s, want 200 (not under gets)", r.status, r.body)
	}
}
