package quota_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// policyOf reads a policy as the API does (JSON, then Defaults).
func policyOf(t *testing.T, doc string) *quota.Policy {
	t.Helper()
	var p quota.Policy
	if err := json.Unmarshal([]byte(doc), &p); err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	p.Defaults()
	return &p
}

// list returns n JSON strings made by f, comma-separated.
func list(n int, f func(i int) string) string {
	s := make([]string, n)
	for i := range s {
		s[i] = `"` + f(i) + `"`
	}
	return strings.Join(s, ",")
}

// TestPolicyBounds: each bound of a policy's values takes its edge and
// refuses one past it, naming the field; so do the bounds of its match,
// scope, exceptions and refusal.
func TestPolicyBounds(t *testing.T) {
	t.Parallel()
	const fw = `"name": "a", "algorithm": "fixed_window", "limit": 10, "window_seconds": 60`
	const param = fw + `, "scope": "param", "param": "query:q"`
	const conc = `"name": "a", "algorithm": "concurrency", "limit": 2, "lease_seconds": 30`
	degrade := func(fallback string) string { return conc + `, "on_refuse": "degrade", "fallback": ` + fallback }
	exceptions := func(n int) string {
		m := make(map[string]int64, n)
		for i := range n {
			m[fmt.Sprintf("v%d", i)] = 5
		}
		b, _ := json.Marshal(m)
		return param + `, "exceptions": ` + string(b)
	}
	s := strings.Repeat
	for _, tc := range []struct {
		name, doc, field string
	}{
		// counts: the minimum is valid, one below is not
		{"the least limit and window", `"name": "a", "algorithm": "fixed_window", "limit": 1, "window_seconds": 1`, ""},
		{"a limit of 0", `"name": "a", "algorithm": "fixed_window", "limit": 0, "window_seconds": 1`, "limit"},
		{"a window of 0", `"name": "a", "algorithm": "fixed_window", "limit": 1, "window_seconds": 0`, "window_seconds"},
		{"the longest window", `"name": "a", "algorithm": "fixed_window", "limit": 1, "window_seconds": 31622400`, ""},
		{"longer", `"name": "a", "algorithm": "fixed_window", "limit": 1, "window_seconds": 31622401`, "window_seconds"},
		{"the longest sliding log", `"name": "a", "algorithm": "sliding_log", "limit": 100000, "window_seconds": 60`, ""},
		// gcra takes a burst of at least 1, leaky_bucket of 0
		{"gcra, burst 1", `"name": "a", "algorithm": "gcra", "rate": 1, "burst": 1`, ""},
		{"gcra, burst 0", `"name": "a", "algorithm": "gcra", "rate": 1, "burst": 0`, "burst"},
		{"leaky_bucket, burst 0", `"name": "a", "algorithm": "leaky_bucket", "rate": 1, "burst": 0`, ""},
		// (burst + 1) intervals of 10^12 µs fit 2^50 µs up to burst 1124
		{"gcra at the window's bound", `"name": "a", "algorithm": "gcra", "rate": 0.000001, "burst": 1124`, ""},
		{"gcra past it", `"name": "a", "algorithm": "gcra", "rate": 0.000001, "burst": 1125`, "burst"},
		{"leaky_bucket at the window's bound", `"name": "a", "algorithm": "leaky_bucket", "rate": 0.000001, "burst": 1124`, ""},
		{"leaky_bucket past it", `"name": "a", "algorithm": "leaky_bucket", "rate": 0.000001, "burst": 1125`, "burst"},
		{"token_bucket at the window's bound", `"name": "a", "algorithm": "token_bucket", "capacity": 1125, "refill_per_sec": 0.000001`, ""},
		{"token_bucket past it", `"name": "a", "algorithm": "token_bucket", "capacity": 1126, "refill_per_sec": 0.000001`, "capacity"},
		// limit × bucket length (10 s / 10 = 10^6 µs) below 2^52: 4503599627
		{"sliding_window at the weight's bound", `"name": "a", "algorithm": "sliding_window", "limit": 4503599627, "window_seconds": 10, "buckets": 10`, ""},
		{"sliding_window past it", `"name": "a", "algorithm": "sliding_window", "limit": 4503599628, "window_seconds": 10, "buckets": 10`, "limit"},
		// the coldest interval, cold_factor × 1e6/rate µs, at most 2^40 µs:
		// 64 × 2^34 at 1e6/2^34 per second
		{"warm_up at its bound", `"name": "a", "algorithm": "warm_up", "rate": 5.820766091346741e-05, "warmup_seconds": 60, "cold_factor": 64`, ""},
		{"warm_up past it", `"name": "a", "algorithm": "warm_up", "rate": 5.820766091346741e-05, "warmup_seconds": 60, "cold_factor": 65`, "rate"},
		// adaptive and concurrency count requests
		{"adaptive counting units", `"name": "a", "algorithm": "adaptive", "max_concurrency": 10, "target_latency_ms": 60, "cost": "units"`, "cost"},
		{"fixed_window counting units", fw + `, "cost": "units"`, ""},
		{"another cost", fw + `, "cost": "bytes"`, "cost"},
		// exceptions
		{"the most exceptions", exceptions(quota.MaxExceptions), ""},
		{"one more", exceptions(quota.MaxExceptions + 1), "exceptions"},
		{"exceptions of another scope", fw + `, "exceptions": {"v": 5}`, "exceptions"},
		{"warm_up per param", `"name": "a", "algorithm": "warm_up", "rate": 1, "warmup_seconds": 60, "scope": "param", "param": "path:1"`, ""},
		{"warm_up's exceptions: no single limit", `"name": "a", "algorithm": "warm_up", "rate": 1, "warmup_seconds": 60, "scope": "param", "param": "path:1", "exceptions": {"v": 5}`, "exceptions"},
		{"an empty value", param + `, "exceptions": {"": 5}`, "exceptions"},
		{"the longest value", param + `, "exceptions": {"` + s("v", quota.MaxParamValueLen) + `": 5}`, ""},
		{"longer", param + `, "exceptions": {"` + s("v", quota.MaxParamValueLen+1) + `": 5}`, "exceptions"},
		{"a value with a control character", param + `, "exceptions": {"a\u0001": 5}`, "exceptions"},
		{"an exception of 0 where the limit may be 0", `"name": "a", "algorithm": "leaky_bucket", "rate": 1, "burst": 3, "scope": "param", "param": "path:1", "exceptions": {"free": 0}`, ""},
		{"an exception of 0 where it may not", param + `, "exceptions": {"v": 0}`, "exceptions"},
		// param sources
		{"the longest header name", fw + `, "scope": "param", "param": "header:` + s("h", 128) + `"`, ""},
		{"longer", fw + `, "scope": "param", "param": "header:` + s("h", 129) + `"`, "param"},
		{"a header name with a space", fw + `, "scope": "param", "param": "header:x y"`, "param"},
		{"a header name with DEL", fw + `, "scope": "param", "param": "header:x\u007f"`, "param"},
		{"a header name with a separator", fw + `, "scope": "param", "param": "header:x/y"`, "param"},
		{"a query name with ~", fw + `, "scope": "param", "param": "query:x~"`, ""},
		{"the first segment", fw + `, "scope": "param", "param": "path:0"`, ""},
		{"the last segment", fw + `, "scope": "param", "param": "path:64"`, ""},
		{"past it", fw + `, "scope": "param", "param": "path:65"`, "param"},
		{"a segment before the first", fw + `, "scope": "param", "param": "path:-1"`, "param"},
		// refusals
		{"queue, the shortest wait", conc + `, "on_refuse": "queue", "max_wait_ms": 1`, ""},
		{"queue, the longest wait", conc + `, "on_refuse": "queue", "max_wait_ms": 60000`, ""},
		{"queue, no wait", conc + `, "on_refuse": "queue", "max_wait_ms": 0`, "max_wait_ms"},
		{"queue, longer", conc + `, "on_refuse": "queue", "max_wait_ms": 60001`, "max_wait_ms"},
		{"reject with a wait", conc + `, "on_refuse": "reject", "max_wait_ms": 10`, "max_wait_ms"},
		{"degrade", degrade(`{"status": 200, "content_type": "text/plain; charset=utf-8", "body": "busy"}`), ""},
		{"degrade, status 599", degrade(`{"status": 599, "content_type": "text/plain", "body": ""}`), ""},
		{"degrade, status 199", degrade(`{"status": 199, "content_type": "text/plain", "body": ""}`), "fallback"},
		{"degrade, status 600", degrade(`{"status": 600, "content_type": "text/plain", "body": ""}`), "fallback"},
		{"degrade, no content type", degrade(`{"status": 200, "content_type": "", "body": ""}`), "fallback"},
		{"degrade, the longest content type", degrade(`{"status": 200, "content_type": "` + s("t", 200) + `", "body": ""}`), ""},
		{"degrade, longer", degrade(`{"status": 200, "content_type": "` + s("t", 201) + `", "body": ""}`), "fallback"},
		{"degrade, a content type with DEL", degrade(`{"status": 200, "content_type": "text/plain\u007f", "body": ""}`), "fallback"},
		{"degrade, the longest body", degrade(`{"status": 200, "content_type": "text/plain", "body": "` + s("b", quota.MaxFallbackBody) + `"}`), ""},
		{"degrade, longer", degrade(`{"status": 200, "content_type": "text/plain", "body": "` + s("b", quota.MaxFallbackBody+1) + `"}`), "fallback"},
		{"shadow with a fallback", conc + `, "on_refuse": "shadow", "fallback": {"status": 200, "content_type": "text/plain", "body": ""}`, "fallback"},
		{"another refusal", conc + `, "on_refuse": "ignore"`, "on_refuse"},
		// match
		{"the longest meter", fw + `, "match": {"meters": ["` + s("m", 64) + `"]}`, ""},
		{"longer", fw + `, "match": {"meters": ["` + s("m", 65) + `"]}`, "match"},
		{"an empty meter", fw + `, "match": {"meters": [""]}`, "match"},
		{"a meter with a comma", fw + `, "match": {"meters": ["a,b"]}`, "match"},
		{"the most meters", fw + `, "match": {"meters": [` + list(64, func(i int) string { return fmt.Sprint("m", i) }) + `]}`, ""},
		{"one more", fw + `, "match": {"meters": [` + list(65, func(i int) string { return fmt.Sprint("m", i) }) + `]}`, "match"},
		{"the most tiers", fw + `, "match": {"tiers": [` + list(64, func(i int) string { return fmt.Sprint("t", i) }) + `]}`, ""},
		{"one more", fw + `, "match": {"tiers": [` + list(65, func(i int) string { return fmt.Sprint("t", i) }) + `]}`, "match"},
		{"a tier that is no slug", fw + `, "match": {"tiers": ["Pro"]}`, "match"},
		{"the most methods", fw + `, "match": {"methods": [` + list(16, func(int) string { return "get" }) + `]}`, ""},
		{"one more", fw + `, "match": {"methods": [` + list(17, func(int) string { return "get" }) + `]}`, "match"},
		{"the longest path prefix", fw + `, "match": {"path_prefix": "/` + s("p", 511) + `"}`, ""},
		{"longer", fw + `, "match": {"path_prefix": "/` + s("p", 512) + `"}`, "match"},
		{"a path prefix not from the root", fw + `, "match": {"path_prefix": "api/"}`, "match"},
		{"a path prefix with a ;parameter", fw + `, "match": {"path_prefix": "/api;v=1/"}`, "match"},
	} {
		err := policyOf(t, "{"+tc.doc+"}").Validate()
		got := ""
		if e, ok := err.(*quota.Error); ok {
			got = e.Field
		} else if err != nil {
			got = "?" + err.Error()
		}
		if got != tc.field {
			t.Errorf("%s: got field %q (%v), want %q", tc.name, got, err, tc.field)
		}
	}
}

// TestPolicyDefaults: what a client leaves out of a policy: scope tenant
// (node for adaptive, its one scope), cost requests, on_refuse reject,
// and warm_up's cold_factor 3, a given one kept.
func TestPolicyDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		doc      string
		scope    quota.Scope
		cost     quota.PolicyCost
		refuse   quota.OnRefuse
		cold     int64 // 0: none
		inRedis  bool
		inTenant bool
	}{
		{`{"algorithm": "fixed_window"}`, quota.ScopeTenant, quota.CostRequests, quota.RefuseReject, 0, true, true},
		{`{"algorithm": "warm_up"}`, quota.ScopeTenant, quota.CostRequests, quota.RefuseReject, 3, true, true},
		{`{"algorithm": "warm_up", "cold_factor": 5, "scope": "global", "cost": "units", "on_refuse": "shadow"}`,
			quota.ScopeGlobal, quota.CostUnits, quota.RefuseShadow, 5, true, false},
		{`{"algorithm": "adaptive"}`, quota.ScopeNode, quota.CostRequests, quota.RefuseReject, 0, false, false},
		{`{"algorithm": "adaptive", "scope": "ip"}`, quota.ScopeIP, quota.CostRequests, quota.RefuseReject, 0, false, false},
		{`{"algorithm": "gcra", "scope": "node"}`, quota.ScopeNode, quota.CostRequests, quota.RefuseReject, 0, false, false},
		{`{"algorithm": "gcra", "scope": "key"}`, quota.ScopeKey, quota.CostRequests, quota.RefuseReject, 0, true, true},
		{`{"algorithm": "gcra", "scope": "param"}`, quota.ScopeParam, quota.CostRequests, quota.RefuseReject, 0, true, true},
		{`{"algorithm": "gcra", "scope": "ip"}`, quota.ScopeIP, quota.CostRequests, quota.RefuseReject, 0, true, false},
	} {
		p := policyOf(t, tc.doc)
		var cold int64
		if p.ColdFactor != nil {
			cold = *p.ColdFactor
		}
		if p.Scope != tc.scope || p.Cost != tc.cost || p.OnRefuse != tc.refuse || cold != tc.cold {
			t.Errorf("%s: got scope %q, cost %q, on_refuse %q, cold_factor %d; want %q, %q, %q, %d",
				tc.doc, p.Scope, p.Cost, p.OnRefuse, cold, tc.scope, tc.cost, tc.refuse, tc.cold)
		}
		if p.InRedis() != tc.inRedis || p.InTenantSlot() != tc.inTenant {
			t.Errorf("%s: got in Redis %t, in the tenant's slot %t; want %t, %t", tc.doc, p.InRedis(), p.InTenantSlot(), tc.inRedis, tc.inTenant)
		}
	}
}
