package api

// The headers across the proxy: those that carry Tollgate's word, to the
// upstream and back to the client, are Tollgate's alone.

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestProxyStripsHeadersThatImpersonateTollgate: a client's header whose
// name, in any case and with _ read as -, is one Tollgate sets for the
// upstream (its namespace X-Tollgate-* and Tollgate-*, X-Forwarded-For) or
// takes away (the credentials) never reaches the upstream; Tollgate's own
// are there once. Other headers pass, underscores and all.
func TestProxyStripsHeadersThatImpersonateTollgate(t *testing.T) {
	t.Parallel()
	up := newSeeingUpstream(t, nil)
	base, tenant, key := proxyStack(t, `
		{"method": "*", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": "%[1]s/v1/"},
		{"method": "*", "path": "/api/gen/", "meter": "gen", "cost": 1, "upstream": "%[1]s/v1/", "settle": true}`, up.srv.URL, 1000)
	for _, route := range []string{"/api/up/x", "/api/gen/x"} {
		r := raw(t, base, "GET "+route+" HTTP/1.1", "Authorization: Bearer "+key,
			"X_Tollgate_Tenant_Id: evil-1",
			"x-tollgate-tenant-id: evil-2",
			"X-TOLLGATE-TENANT-ID: evil-3",
			"X-Tollgate-Tenant-Id: evil-4",
			"x_TOLLGATE-tenant_ID: evil-5",
			"X_Tollgate_Tenant_Id: evil-6",
			"X-Tollgate-Plan: gold",
			"X_Tollgate_Plan: gold",
			"Tollgate-Request-Id: fake",
			"Tollgate_Request_Id: fake",
			"TOLLGATE_ACTUAL_COST: 0",
			"X_Forwarded_For: 6.6.6.6",
			"X-Forwarded-For: 7.7.7.7",
			"X_API_Key: "+key,
			"X_Api_key: "+key,
			"X-Custom_Thing: kept",
			"X-Tollgatex: kept",
		)
		got := up.take()
		if r.status != 200 || len(got) != 1 {
			t.Fatalf("GET %s: status %d, %d upstream requests; want 200 and 1 (%s)", route, r.status, len(got), r.body)
		}
		h := got[0].header
		for name, values := range h {
			n := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
			switch {
			case n == "x-tollgate-tenant-id":
				if name != "X-Tollgate-Tenant-Id" || len(values) != 1 || values[0] != tenant.ID {
					t.Errorf("GET %s: the upstream got %s: %q, want only X-Tollgate-Tenant-Id: %s", route, name, values, tenant.ID)
				}
			case n == "tollgate-request-id" && route == "/api/gen/x":
				if name != "Tollgate-Request-Id" || len(values) != 1 || values[0] == "fake" {
					t.Errorf("GET %s: the upstream got %s: %q, want only Tollgate's own Tollgate-Request-Id", route, name, values)
				}
			case strings.HasPrefix(n, "x-tollgate-") || strings.HasPrefix(n, "tollgate-"):
				t.Errorf("GET %s: the upstream got %s: %q, a header of Tollgate's from the client", route, name, values)
			case n == "x-forwarded-for":
				if name != "X-Forwarded-For" || len(values) != 1 || values[0] != "127.0.0.1" {
					t.Errorf("GET %s: the upstream got %s: %q, want only X-Forwarded-For: 127.0.0.1", route, name, values)
				}
			case n == "x-api-key" || n == "authorization":
				t.Errorf("GET %s: the upstream got %s: %q, the tenant's credentials", route, name, values)
			}
		}
		for _, name := range []string{"X-Tollgate-Tenant-Id", "X-Forwarded-For", "X-Custom_thing", "X-Tollgatex"} {
			if len(h[name]) != 1 {
				t.Errorf("GET %s: the upstream got %s: %q, want one value (headers: %v)", route, name, h[name], h)
			}
		}
		if route == "/api/gen/x" && len(h["Tollgate-Request-Id"]) != 1 {
			t.Errorf("GET %s: the upstream got Tollgate-Request-Id %q, want Tollgate's own", route, h["Tollgate-Request-Id"])
		}
	}
}

// TestProxyAnswerCarriesOnlyTollgatesWord: an upstream's answer headers
// that would speak for Tollgate (its namespace, the rate-limit headers, the
// replay marker) do not reach the client: what the client reads there is
// Tollgate's.
func TestProxyAnswerCarriesOnlyTollgatesWord(t *testing.T) {
	t.Parallel()
	up := newSeeingUpstream(t, func(w http.ResponseWriter) {
		h := w.Header()
		for _, kv := range [][2]string{
			{"Tollgate-Refunded", "5"}, {"Tollgate-Actual-Cost", "0"}, {"Tollgate-Settled-Cost", "0"},
			{"Tollgate-Degraded", "fail-open"}, {"Tollgate-Request-Id", "upstream-made"}, {"X-Tollgate-Tenant-Id", "other"},
			{"Idempotent-Replayed", "true"}, {"RateLimit", `"daily";r=999999;t=1`}, {"RateLimit-Policy", `"daily";q=999999`},
			{"X-RateLimit-Limit", "999999"}, {"X-RateLimit-Remaining", "999999"}, {"X-RateLimit-Reset", "1"},
			{"Ratelimit-Shadow-Refused", "x"}, {"Keep-Alive", "timeout=99"}, {"X-Upstream", "kept"},
		} {
			h[kv[0]] = []string{kv[1]}
		}
		h["Tollgate_Refunded"] = []string{"7"}
	})
	base, _, key := proxyStack(t, `{"method": "*", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": "%[1]s/v1/"}`, up.srv.URL, 1000)
	r := rawGet(t, base, "/api/up/x", key)
	if r.status != 200 || r.header.Get("X-Upstream") != "kept" {
		t.Fatalf("status %d, X-Upstream %q; want 200 and the upstream's own header (%s)", r.status, r.header.Get("X-Upstream"), r.body)
	}
	for name, values := range r.header {
		n := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		if strings.HasPrefix(n, "tollgate-") || strings.HasPrefix(n, "x-tollgate-") || n == "idempotent-replayed" {
			t.Errorf("the client got %s: %q from the upstream", name, values)
		}
	}
	if got := remaining(t, r.header)["daily"]; got != 999 || r.header.Get("X-RateLimit-Remaining") != "999" || r.header.Get("X-RateLimit-Limit") != "1000" {
		t.Errorf("RateLimit %q, X-RateLimit-Limit %q, X-RateLimit-Remaining %q: want Tollgate's (1000, 999 left)",
			r.header.Get("RateLimit"), r.header.Get("X-RateLimit-Limit"), r.header.Get("X-RateLimit-Remaining"))
	}
	if v := r.header.Values("Ratelimit-Policy"); len(v) != 1 || strings.Contains(v[0], "999999") {
		t.Errorf("RateLimit-Policy %q, want Tollgate's alone", v)
	}
	for _, name := range []string{"Ratelimit-Shadow-Refused", "Keep-Alive"} {
		if v := r.header.Values(name); len(v) != 0 {
			t.Errorf("%s %q from the upstream, want none", name, v)
		}
	}
}

// TestProxyRequestFramingAndHopByHop: what reaches the upstream is one
// well-framed request: a chunked body arrives with its Content-Length, a
// request framed twice is not forwarded as sent, a body past
// TOLLGATE_BODY_LIMIT is refused; and the headers of the client's
// connection (hop-by-hop, those Connection names) and its own statements of
// its address (Forwarded, X-Real-IP) stay behind.
func TestProxyRequestFramingAndHopByHop(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var bodies []string
	up := newSeeingUpstream(t, nil)
	inner := up.srv.Config.Handler
	up.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, fmt.Sprintf("%d %q %q", r.ContentLength, r.TransferEncoding, b))
		mu.Unlock()
		inner.ServeHTTP(w, r)
	})
	base, _, key := proxyStack(t, `{"method": "*", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": "%[1]s/v1/"}`, up.srv.URL, 1000)
	send := func(request string) (int, []seen, []string) {
		t.Helper()
		status := rawRequest(t, base, strings.ReplaceAll(request, "KEY", key)).status
		mu.Lock()
		defer mu.Unlock()
		got := bodies
		bodies = nil
		return status, up.take(), got
	}

	status, got, b := send("POST /api/up/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer KEY\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	if status != 200 || len(got) != 1 || len(b) != 1 || b[0] != `5 [] "hello"` {
		t.Errorf("a chunked body: status %d, the upstream got %v; want 200 and one request of Content-Length 5", status, b)
	}
	status, got, b = send("POST /api/up/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer KEY\r\nConnection: close\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	if len(got) > 1 || len(got) == 1 && (len(b) != 1 || b[0] != `5 [] "hello"`) {
		t.Errorf("a body framed twice: status %d, the upstream got %v; want it refused or one request of Content-Length 5", status, b)
	}
	status, got, b = send("POST /api/up/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer KEY\r\nConnection: close\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!")
	if status != 400 || len(got) != 0 {
		t.Errorf("two Content-Lengths: status %d, %d upstream requests %v; want 400 and none", status, len(got), b)
	}
	status, got, _ = send("POST /api/up/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer KEY\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n" + strings.Repeat("a", 4096) + "\r\n0\r\n\r\n")
	if status != 413 || len(got) != 0 {
		t.Errorf("a chunked body past TOLLGATE_BODY_LIMIT: status %d, %d upstream requests; want 413 and none", status, len(got))
	}

	status, got, _ = send("GET /api/up/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer KEY\r\nConnection: keep-alive, X-Hop, x_other_hop\r\n" +
		"X-Hop: 1\r\nX-Other-Hop: 1\r\nX_Other_Hop: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: websocket\r\nProxy-Authorization: Basic eDp5\r\n" +
		"Proxy-Connection: keep-alive\r\nForwarded: for=6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\nX_Real_IP: 6.6.6.6\r\nX-End-To-End: kept\r\n\r\n")
	if status != 200 || len(got) != 1 {
		t.Fatalf("hop-by-hop headers: status %d, %d upstream requests; want 200 and 1", status, len(got))
	}
	for name, values := range got[0].header {
		switch n := strings.ToLower(strings.ReplaceAll(name, "_", "-")); n {
		case "x-hop", "x-other-hop", "keep-alive", "te", "upgrade", "proxy-authorization", "proxy-connection", "forwarded", "x-real-ip":
			t.Errorf("the upstream got %s: %q", name, values)
		case "connection":
			if len(values) != 1 || values[0] != "close" && values[0] != "keep-alive" {
				t.Errorf("the upstream got Connection: %q, the client's", values)
			}
		}
	}
	if got[0].header.Get("X-End-To-End") != "kept" {
		t.Errorf("the upstream got X-End-To-End %q, want kept", got[0].header.Get("X-End-To-End"))
	}
}

// TestProxyMethodIsTheRequestsMethod: the route is chosen on the request's
// method, so the upstream never gets a header that asks it to act as
// another (X-HTTP-Method-Override and its variants, which frameworks honour
// on a POST): a cheap POST route is not a way into an expensive DELETE.
func TestProxyMethodIsTheRequestsMethod(t *testing.T) {
	t.Parallel()
	up := newSeeingUpstream(t, nil)
	base, _, key := proxyStack(t, `
		{"method": "POST", "path": "/api/jobs", "meter": "jobs", "cost": 1, "upstream": "%[1]s/jobs"},
		{"method": "DELETE", "path": "/api/jobs", "meter": "purge", "cost": 100, "upstream": "%[1]s/jobs"}`, up.srv.URL, 1000)
	r := raw(t, base, "POST /api/jobs HTTP/1.1", "Authorization: Bearer "+key,
		"X-HTTP-Method-Override: DELETE", "X-HTTP-Method: DELETE", "X-Method-Override: DELETE", "X_HTTP_Method_Override: DELETE")
	got := up.take()
	if r.status != 200 || len(got) != 1 {
		t.Fatalf("status %d, %d upstream requests; want 200 and 1", r.status, len(got))
	}
	for name, values := range got[0].header {
		if n := strings.ToLower(strings.ReplaceAll(name, "_", "-")); strings.Contains(n, "method") {
			t.Errorf("the upstream got %s: %q on a POST metered as POST", name, values)
		}
	}
}
