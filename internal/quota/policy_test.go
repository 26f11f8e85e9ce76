package quota_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// TestPolicyValidateNamesTheField: each bad policy is refused naming the
// field to fix; the good ones pass.
func TestPolicyValidateNamesTheField(t *testing.T) {
	t.Parallel()
	cases := []struct{ json, field string }{
		{`{"name": "a", "algorithm": "fixed_window", "limit": 10, "window_seconds": 60}`, ""},
		{`{"name": "a", "algorithm": "adaptive", "max_concurrency": 10, "target_latency_ms": 60}`, ""},
		{`{"name": "a", "algorithm": "leaky_bucket", "burst": 10}`, "rate"},
		{`{"name": "a", "algorithm": "leaky_bucket", "rate": 1, "burst": 10, "limit": 3}`, "limit"},
		{`{"name": "a", "algorithm": "adaptive", "max_concurrency": 10, "target_latency_ms": 60, "on_refuse": "queue", "max_wait_ms": 10}`, "on_refuse"},
		{`{"name": "a", "algorithm": "adaptive", "max_concurrency": 10, "target_latency_ms": 60, "scope": "global"}`, "scope"},
		{`{"name": "a", "algorithm": "gcra", "rate": 1, "burst": 10, "scope": "param"}`, "param"},
		{`{"name": "a", "algorithm": "gcra", "rate": 1, "burst": 10, "scope": "param", "param": "cookie:x"}`, "param"},
		{`{"name": "a", "algorithm": "gcra", "rate": 1, "burst": 10, "param": "header:x"}`, "param"},
		{`{"name": "a", "algorithm": "sliding_log", "limit": 1000000, "window_seconds": 60}`, "limit"},
		{`{"name": "a", "algorithm": "sliding_window", "limit": 10, "window_seconds": 60, "buckets": 7}`, "buckets"},
		{`{"name": "a", "algorithm": "sliding_window", "limit": 1099511627776, "window_seconds": 31536000, "buckets": 1}`, "limit"},
		{`{"name": "a", "algorithm": "gcra", "rate": 0.000001, "burst": 1099511627776}`, "burst"},
		{`{"name": "a", "algorithm": "concurrency", "limit": 2, "lease_seconds": 30, "cost": "units"}`, "cost"},
		{`{"name": "a", "algorithm": "concurrency", "limit": 2, "lease_seconds": 30, "on_refuse": "queue"}`, "max_wait_ms"},
		{`{"name": "a", "algorithm": "concurrency", "limit": 2, "lease_seconds": 30, "on_refuse": "degrade"}`, "fallback"},
		{`{"name": "a", "algorithm": "concurrency", "limit": 2, "lease_seconds": 30, "on_refuse": "degrade", "fallback": {"status": 200, "content_type": "a\u0000b", "body": ""}}`, "fallback"},
		{`{"name": "a", "algorithm": "fixed_window", "limit": 10, "window_seconds": 60, "match": {"meters": ["a\u0000"]}}`, "match"},
		{`{"name": "a", "algorithm": "fixed_window", "limit": 10, "window_seconds": 60, "match": {"methods": ["BREW"]}}`, "match"},
		{`{"name": "a", "algorithm": "fixed_window", "limit": 10, "window_seconds": 60, "match": {"path_prefix": "/a/../b"}}`, "match"},
		{`{"name": "a", "algorithm": "fixed_window", "limit": 10, "window_seconds": 60, "scope": "param", "param": "query:q", "exceptions": {"hot": -1}}`, "exceptions"},
		// an exception is held to the bounds of the limit it replaces
		{`{"name": "a", "algorithm": "concurrency", "limit": 2, "lease_seconds": 30, "scope": "param", "param": "path:1", "exceptions": {"hot": 1000000}}`, "exceptions"},
		{`{"name": "a", "algorithm": "gcra", "rate": 0.000001, "burst": 3, "scope": "param", "param": "path:1", "exceptions": {"hot": 1099511627776}}`, "exceptions"},
		{`{"name": "A b", "algorithm": "fixed_window", "limit": 10, "window_seconds": 60}`, "name"},
		{`{"name": "a", "algorithm": "bucket_brigade"}`, "algorithm"},
	}
	for _, tc := range cases {
		var p quota.Policy
		if err := json.Unmarshal([]byte(tc.json), &p); err != nil {
			t.Fatalf("%s: %v", tc.json, err)
		}
		p.Defaults()
		err := p.Validate()
		var got string
		if e, ok := err.(*quota.Error); ok {
			got = e.Field
		} else if err != nil {
			t.Fatalf("%s: %v is not a *quota.Error", tc.json, err)
		}
		if got != tc.field {
			t.Errorf("%s: field %q (%v), want %q", tc.json, got, err, tc.field)
		}
	}
}

func TestPolicyMatches(t *testing.T) {
	t.Parallel()
	m := quota.PolicyMatch{Meters: []string{"report"}, Tiers: []string{"free"}, Methods: []string{"POST"}, PathPrefix: "/api/demo/"}
	for _, tc := range []struct {
		meter, path, method, tier string
		want                      bool
	}{
		{"report", "/api/demo/report", "POST", "free", true},
		{"demo", "/api/demo/report", "POST", "free", false},
		{"report", "/api/other", "POST", "free", false},
		{"report", "/api/demo/report", "GET", "free", false},
		{"report", "/api/demo/report", "POST", "pro", false},
	} {
		if got := m.Matches(tc.meter, tc.path, tc.method, tc.tier, strings.HasPrefix); got != tc.want {
			t.Errorf("Matches(%q, %q, %q, %q) = %t", tc.meter, tc.path, tc.method, tc.tier, got)
		}
	}
	var empty quota.PolicyMatch
	if !empty.Matches("x", "/y", "GET", "z", strings.HasPrefix) {
		t.Error("an empty match must match everything")
	}
	// HEAD is GET's work without the body: a policy on GET takes it
	gets, heads := quota.PolicyMatch{Methods: []string{"GET"}}, quota.PolicyMatch{Methods: []string{"HEAD"}}
	if !gets.TakesMethod("HEAD") || !gets.TakesMethod("GET") || gets.TakesMethod("POST") || gets.TakesMethod("") || heads.TakesMethod("GET") {
		t.Error("a policy on GET must take GET and HEAD, and nothing else; one on HEAD, HEAD only")
	}
}
