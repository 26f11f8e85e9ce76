package httpapi

import (
	"context"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/quota"
)

// BenchmarkMatchPolicies matches one metered request to the policies of a
// node: none, meter-only ones (what most requests meet), path prefixes on
// a plain path, on one spelled otherwise and with a capital, and each
// param source. Only
// the cases that find a param value may allocate (the value, copied out
// of the request, and the list of calls).
func BenchmarkMatchPolicies(b *testing.B) {
	window := func(name string, m quota.PolicyMatch, scope quota.Scope, param string) quota.Policy {
		p := quota.Policy{Name: name, Algorithm: quota.AlgFixedWindow, Limit: quota.Ptr(int64(10)),
			WindowSeconds: quota.Ptr(int64(60)), Match: m, Scope: scope, Param: param}
		p.Defaults()
		return p
	}
	other := quota.PolicyMatch{Meters: []string{"other"}}
	prefixes := staticPolicies{
		window("a", quota.PolicyMatch{PathPrefix: "/api/items/expensive"}, "", ""),
		window("b", quota.PolicyMatch{PathPrefix: "/api/reports/"}, "", ""),
		window("c", quota.PolicyMatch{PathPrefix: "/api/items/heavy"}, "", ""),
	}
	// a capital (or an escape) in a prefix is read otherwise by a lenient
	// upstream: a path that differs from it there is compared in that reading
	capital := staticPolicies{window("c", quota.PolicyMatch{PathPrefix: "/api/Items/Heavy"}, "", "")}
	for _, bc := range []struct {
		name, target string
		header       [2]string
		list         staticPolicies
	}{
		{"none", "/api/items/42", [2]string{}, staticPolicies{}},
		{"other-meters", "/api/items/42", [2]string{}, staticPolicies{window("a", other, "", ""), window("b", other, "", "")}},
		{"prefix-plain", "/api/items/42", [2]string{}, prefixes},
		{"prefix-spelled", "/api/items//Expensive;v=1", [2]string{}, prefixes},
		{"prefix-capital", "/api/items/42", [2]string{}, capital},
		{"param-path", "/api/items/42", [2]string{}, staticPolicies{window("p", quota.PolicyMatch{}, quota.ScopeParam, "path:2")}},
		{"param-header", "/api/items/42", [2]string{"X-Term", "apples"}, staticPolicies{window("p", quota.PolicyMatch{}, quota.ScopeParam, "header:X-Term")}},
		{"param-query", "/api/items/42?q=apples&r=1", [2]string{}, staticPolicies{window("p", quota.PolicyMatch{}, quota.ScopeParam, "query:q")}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := &Server{policies: bc.list}
			app := fiber.New()
			var fc fasthttp.RequestCtx
			fc.Request.SetRequestURI(bc.target)
			if bc.header[0] != "" {
				fc.Request.Header.Set(bc.header[0], bc.header[1])
			}
			c := app.AcquireCtx(&fc)
			defer app.ReleaseCtx(c)
			path := string(c.Request().URI().PathOriginal())
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.matchPolicies(ctx, "items", path, "GET", "free", scopeValues{tenant: "t", req: c, path: path}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
