package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// recorder is an upstream that answers 200 and keeps the exact request-target
// of every request it received.
type recorder struct {
	mu   sync.Mutex
	uris []string
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.uris = append(r.uris, req.RequestURI)
	r.mu.Unlock()
	fmt.Fprint(w, `{"ok": true}`)
}

// take returns the request-targets received since the last call.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.uris
	r.uris = nil
	return out
}

// mustProxyStack starts an api whose route /api/up/ proxies to a recording
// upstream under /v1/ok/, and returns the api's base URL, the recorder and a
// tenant's key.
func mustProxyStack(tb testing.TB) (string, *recorder, string) {
	tb.Helper()
	rec := &recorder{}
	up := httptest.NewServer(rec)
	tb.Cleanup(up.Close)
	s := mustStack(tb)
	s.routes = filepath.Join(tb.TempDir(), "routes.json")
	table := fmt.Sprintf(`{"routes": [
		{"method": "*", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": %q, "timeout": "5s"},
		{"method": "GET", "path": "/api/echo", "meter": "echo", "cost": 1, "handler": "echo"}
	]}`, up.URL+"/v1/ok/")
	if err := os.WriteFile(s.routes, []byte(table), 0o600); err != nil {
		tb.Fatal(err)
	}
	base := s.start()
	tier := s.tier(11, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	_, key := s.tenant(tier.Slug)
	return base, rec, key
}

// rawGet sends target as the request line's target, byte for byte: net/http
// would clean or re-escape it.
func rawGet(tb testing.TB, base, target, key string) reply {
	tb.Helper()
	return raw(tb, base, "GET "+target+" HTTP/1.1", "Authorization: Bearer "+key)
}

// TestProxyRefusesDotSegments: a path holding a dot segment, in any spelling
// an upstream might decode, is bad input (400 naming the path) and never
// reaches the upstream; nothing is metered.
func TestProxyRefusesDotSegments(t *testing.T) {
	t.Parallel()
	base, rec, key := mustProxyStack(t)
	for _, target := range []string{
		"/api/up/a/../../secret",
		"/api/up/../secret",
		"/api/up/..",
		"/api/up/a/..",
		"/api/up/./secret",
		"/api/up/a/./b",
		"/api/up/%2e%2e/secret",
		"/api/up/%2E%2E/secret",
		"/api/up/.%2e/secret",
		"/api/up/%2e./secret",
		"/api/up/%2e/secret",
		"/api/up/a%2f..%2f..%2fsecret",
		"/api/up/a%2F%2e%2e%2F%2E%2E%2Fsecret",
		"/api/up/a%5c..%5c..%5csecret",
		`/api/up/a\..\..\secret`,
		"/api/up/..;/secret",
		"/api/up/%zz/secret",
		"/api/up/%2",
		"/api/echo/../up/secret",
		"/api/up/x/../../echo",
	} {
		r := rawGet(t, base, target, key)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.body), `"field":"path"`) {
			t.Errorf("GET %s: status %d type %q, want 400 problem+json naming the path (%s)", target, r.status, r.header.Get("Content-Type"), r.body)
		}
		if got := rec.take(); len(got) != 0 {
			t.Errorf("GET %s: the upstream received %q, want nothing", target, got)
		}
	}
	// Refused paths were not metered: this is the first admitted request.
	ok := rawGet(t, base, "/api/up/fine", key)
	if got := remaining(t, ok.header)["daily"]; ok.status != 200 || got != 999 {
		t.Fatalf("GET /api/up/fine: status %d daily r=%d, want 200 and 999", ok.status, got)
	}
}

// TestProxySendsThePathAsSent: the upstream receives the path below the
// route's base and the query byte for byte, escaping included, but for the
// escapes of unreserved characters, which it receives decoded (the path in
// normal form, on which the route was matched).
func TestProxySendsThePathAsSent(t *testing.T) {
	t.Parallel()
	base, rec, key := mustProxyStack(t)
	for _, tc := range []struct{ target, want string }{
		{"/api/up/files/a%20b", "/v1/ok/files/a%20b"},
		{"/api/up/files/a%2520b", "/v1/ok/files/a%2520b"},
		{"/api/up/files/group%2Fproject/raw", "/v1/ok/files/group%2Fproject/raw"},
		{"/api/up/files/%E2%82%AC%7e?q=a%20b&r=%2F+x&s", "/v1/ok/files/%E2%82%AC~?q=a%20b&r=%2F+x&s"},
		{"/api/up/files/%e2%82%ac%41?q=%41", "/v1/ok/files/%E2%82%ACA?q=%41"},
		{"/api/up/a+b;v=1,2@c:d", "/v1/ok/a+b;v=1,2@c:d"},
		{"/api/up/x//y", "/v1/ok/x//y"},
		{"/api/up/..x/.y/...", "/v1/ok/..x/.y/..."},
		{"/api/up/", "/v1/ok/"},
		{"/api/up/?q=%41", "/v1/ok/?q=%41"},
		// fasthttp takes a space in the query; a request line cannot.
		{"/api/up/q?a b", "/v1/ok/q?a%20b"},
	} {
		r := rawGet(t, base, tc.target, key)
		if r.status != 200 {
			t.Errorf("GET %s: status %d, want 200 (%s)", tc.target, r.status, r.body)
		}
		if got := rec.take(); len(got) != 1 || got[0] != tc.want {
			t.Errorf("GET %s: the upstream received %q, want [%q]", tc.target, got, tc.want)
		}
	}
}

// TestProxiedAnswerCarriesTheRequestID: the upstream's answer replaces the
// response headers; the request ID is still sent, the client's own when it
// brought one.
func TestProxiedAnswerCarriesTheRequestID(t *testing.T) {
	t.Parallel()
	base, _, key := mustProxyStack(t)
	if r := rawGet(t, base, "/api/up/fine", key); r.status != 200 || r.header.Get("X-Request-Id") == "" {
		t.Errorf("proxied answer: status %d, X-Request-Id %q; want 200 and an id", r.status, r.header.Get("X-Request-Id"))
	}
	r := raw(t, base, "GET /api/up/fine HTTP/1.1", "Authorization: Bearer "+key, "X-Request-ID: client-42")
	if got := r.header.Get("X-Request-Id"); got != "client-42" {
		t.Errorf("proxied answer to a request with its own id: X-Request-Id %q, want client-42", got)
	}
}
