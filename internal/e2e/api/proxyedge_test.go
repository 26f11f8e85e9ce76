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

// The edges of the proxy: the path a route is chosen on is the path the
// upstream acts on (here), the headers that carry Tollgate's word are
// Tollgate's alone (proxyheaders_test.go), and answers stream
// (proxystream_test.go).

// seen is one request as an upstream received it.
type seen struct {
	uri    string      // the request-target, as sent
	path   string      // the path as net/http decodes it (every escape, %2F included)
	header http.Header // the headers, as net/http canonicalises their names
}

// seeingUpstream records every request it receives and answers 200, with
// the headers answer sets.
type seeingUpstream struct {
	mu     sync.Mutex
	got    []seen
	answer func(w http.ResponseWriter)
	srv    *httptest.Server
}

func newSeeingUpstream(tb testing.TB, answer func(w http.ResponseWriter)) *seeingUpstream {
	tb.Helper()
	u := &seeingUpstream{answer: answer}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.got = append(u.got, seen{uri: r.RequestURI, path: r.URL.Path, header: r.Header.Clone()})
		u.mu.Unlock()
		if u.answer != nil {
			u.answer(w)
		}
		fmt.Fprint(w, `{"ok": true}`)
	}))
	tb.Cleanup(u.srv.Close)
	return u
}

// take returns the requests received since the last call.
func (u *seeingUpstream) take() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := u.got
	u.got = nil
	return out
}

// writeRoutes makes the stack's route table: table is a JSON list of routes
// in which %[1]s is the upstream's URL.
func (s *stack) writeRoutes(tb testing.TB, table, upstream string) {
	tb.Helper()
	s.routes = filepath.Join(tb.TempDir(), "routes.json")
	doc := `{"routes": [` + strings.ReplaceAll(table, "%[1]s", upstream) + `]}`
	if err := os.WriteFile(s.routes, []byte(doc), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// proxyStack starts an api whose route table is table (see writeRoutes) in
// front of upstream, and returns its base URL and a tenant and its key, on
// a tier of daily units a day.
func proxyStack(tb testing.TB, table, upstream string, daily int64) (string, quota.Tenant, string) {
	tb.Helper()
	s := mustStack(tb)
	s.writeRoutes(tb, table, upstream)
	base := s.start()
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(daily)})
	tenant, key := s.tenant(tier.Slug)
	return base, tenant, key
}

// edgeRoute is a route of edgeRoutes: the upstream learns which route
// forwarded a request from the first segment of its path (/r<id>), and the
// rest of that path is the route's path below /api, decoded.
type edgeRoute struct {
	id     string
	method string
	prefix string // the route's path below /api, as the upstream decodes it
	cost   int64
}

// edgeRoutes share one upstream, from the cheapest catch-all to an
// expensive route under a cheap one, with an escape and a capital in their
// paths.
var edgeRoutes = []edgeRoute{
	{"r0", "*", "/", 2},
	{"r1", "*", "/w/", 1},
	{"r2", "GET", "/w/expensive", 100},
	{"r3", "*", "/w/a/b", 7},
	{"r4", "*", "/W2/", 3},
	{"r5", "*", "/sp ace/", 5},
}

const edgeTable = `
	{"method": "*", "path": "/api/", "meter": "r0", "cost": 2, "upstream": "%[1]s/r0/"},
	{"method": "*", "path": "/api/w/", "meter": "r1", "cost": 1, "upstream": "%[1]s/r1/w/"},
	{"method": "GET", "path": "/api/w/expensive", "meter": "r2", "cost": 100, "upstream": "%[1]s/r2/w/expensive"},
	{"method": "*", "path": "/api/w/a/b", "meter": "r3", "cost": 7, "upstream": "%[1]s/r3/w/a/b"},
	{"method": "*", "path": "/api/W2/", "meter": "r4", "cost": 3, "upstream": "%[1]s/r4/W2/"},
	{"method": "*", "path": "/api/sp%20ace/", "meter": "r5", "cost": 5, "upstream": "%[1]s/r5/sp%20ace/"}`

// edgeStack starts an api with edgeTable in front of a recording upstream
// and returns its base URL, the upstream and a key on a roomy daily quota.
func edgeStack(tb testing.TB) (string, *seeingUpstream, string) {
	tb.Helper()
	up := newSeeingUpstream(tb, nil)
	base, _, key := proxyStack(tb, edgeTable, up.srv.URL, 1_000_000_000)
	return base, up, key
}

// upstreamsRoute is the route an upstream that decodes the path (as
// net/http does: every escape, %2F included) would say a request belongs
// to: the edge route of longest prefix, by whole segments, of the path it
// acts on. The path it received is /<id> followed by that path.
func upstreamsRoute(method string, s seen) (got, want *edgeRoute) {
	id, rest, _ := strings.Cut(strings.TrimPrefix(s.path, "/"), "/")
	rest = "/" + rest
	for i := range edgeRoutes {
		r := &edgeRoutes[i]
		if r.id == id {
			got = r
		}
		if r.method != "*" && r.method != method {
			continue
		}
		if rest != r.prefix && !strings.HasPrefix(rest, strings.TrimSuffix(r.prefix, "/")+"/") {
			continue
		}
		if want == nil || len(r.prefix) > len(want.prefix) {
			want = r
		}
	}
	return got, want
}

// TestProxyMetersThePathTheUpstreamActsOn: an escaped spelling of an
// expensive route's path is metered as that route, and forwarded to it, in
// its plain spelling; a path that an upstream could read as another
// route's (an encoded slash, an empty segment, a ;parameter, another case)
// is refused with 400 naming the path, unmetered and unforwarded.
func TestProxyMetersThePathTheUpstreamActsOn(t *testing.T) {
	t.Parallel()
	base, up, key := edgeStack(t)
	left := int64(-1) // the daily quota's remaining units after the last admitted request
	for _, tc := range []struct {
		target string
		route  string // "": refused with 400
		sent   string // the request-target the upstream must get ("": not checked)
	}{
		{"/api/w/cheap", "r1", "/r1/w/cheap"},
		{"/api/w/%65xpensive", "r2", "/r2/w/expensive"},
		{"/api/w/%65%78%70%65%6E%73%69%76%65", "r2", "/r2/w/expensive"},
		{"/api/%77/expensiv%65/x", "r2", "/r2/w/expensive/x"},
		{"/api/w/expensive", "r2", "/r2/w/expensive"},
		{"/api/w/%61/%62", "r3", "/r3/w/a/b"},
		{"/api/w/%2565xpensive", "r1", "/r1/w/%2565xpensive"},
		{"/api/w/%7euser/%e2%82%ac", "r1", "/r1/w/~user/%E2%82%AC"},
		{"/api/sp%20ace/%78", "r5", "/r5/sp%20ace/x"},
		{"/api/W2/x", "r4", "/r4/W2/x"},
		{"/api/w/x%2Fy", "r1", "/r1/w/x%2Fy"},
		{"/api/w/a%2Fb", "", ""},
		{"/api/w/a%2fb", "", ""},
		{"/api/w/a%5Cb", "", ""},
		{`/api/w/a\b`, "", ""},
		{"/api/w//expensive", "", ""},
		{"/api//w/expensive", "", ""},
		{"/api/w/expensive;x=1", "", ""},
		{"/api/w;x/expensive", "", ""},
		{"/api/w/;/expensive", "", ""},
		{"/api/w/EXPENSIVE", "", ""},
		{"/api/w/%45xpensive", "", ""},
		{"/api/w2/x", "", ""},
	} {
		r := rawGet(t, base, tc.target, key)
		got := up.take()
		before := left
		if r.status == 200 {
			left = remaining(t, r.header)["daily"]
		}
		if tc.route == "" {
			if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.body), `"field":"path"`) {
				t.Errorf("GET %s: status %d %s, want 400 problem+json naming the path", tc.target, r.status, r.body)
			}
			if len(got) != 0 {
				t.Errorf("GET %s: the upstream received %q, want nothing", tc.target, got[0].uri)
			}
			continue
		}
		if r.status != 200 || len(got) != 1 {
			t.Errorf("GET %s: status %d, %d upstream requests; want 200 and 1 (%s)", tc.target, r.status, len(got), r.body)
			continue
		}
		forwarded, acted := upstreamsRoute("GET", got[0])
		if forwarded == nil || forwarded.id != tc.route || acted != forwarded {
			t.Errorf("GET %s: forwarded by route %v, the upstream acts on %q (route %v); want route %s", tc.target, forwarded, got[0].path, acted, tc.route)
		}
		if tc.sent != "" && got[0].uri != tc.sent {
			t.Errorf("GET %s: the upstream received %q, want %q", tc.target, got[0].uri, tc.sent)
		}
		if cost := edgeCost(tc.route); before >= 0 && before-left != cost {
			t.Errorf("GET %s: metered %d units, want route %s's %d", tc.target, before-left, tc.route, cost)
		}
	}
}

func edgeCost(id string) int64 {
	for _, r := range edgeRoutes {
		if r.id == id {
			return r.cost
		}
	}
	return -1
}

// FuzzProxyRouteIsTheUpstreamsRoute sends arbitrary paths under /api/
// through the real api to a real upstream (net/http, which decodes every
// escape): a request is refused (400 or 404) and reaches nobody, or it is
// forwarded by the route whose path prefixes the path the upstream decoded,
// and metered that route's cost, no more and no less.
func FuzzProxyRouteIsTheUpstreamsRoute(f *testing.F) {
	for _, seed := range []string{
		"/api/w/%65xpensive", "/api/w/expensive", "/api/w/cheap", "/api/%77/%65xpensive/x", "/api/w/%2565xpensive",
		"/api/w/a%2Fb", "/api/w/a%2fb/c", "/api/w/x%2Fy", "/api/w//expensive", "/api/w/expensive;x", "/api/w;a/expensive",
		"/api/w/%45XPENSIVE", "/api/W2/x", "/api/w2/x", "/api/sp%20ace/x", "/api/sp%20ace%2Fx", "/api/w/a%5cb", `/api/w/a\b`,
		"/api/w/%2e%2e/expensive", "/api/w/%zz", "/api/%F0%9F%98%80/x", "/api/w/%C0%AE%C0%AE/x", "/api/", "/api/w",
	} {
		f.Add(seed)
	}
	base, up, key := edgeStack(f)
	left := int64(-1)
	f.Fuzz(func(t *testing.T, path string) {
		if !strings.HasPrefix(path, "/api/") || strings.ContainsAny(path, " \r\n") {
			return // a request line of another shape
		}
		r := rawGet(t, base, path, key)
		got := up.take()
		switch r.status {
		case 400, 404:
			if len(got) != 0 {
				t.Fatalf("GET %q: %d, and the upstream received %q", path, r.status, got[0].uri)
			}
			return
		case 200:
		default:
			t.Fatalf("GET %q: status %d %s, want 200, 400 or 404", path, r.status, r.body)
		}
		before, now := left, remaining(t, r.header)["daily"]
		left = now
		if len(got) != 1 {
			t.Fatalf("GET %q: the upstream received %d requests, want 1", path, len(got))
		}
		forwarded, acted := upstreamsRoute("GET", got[0])
		if forwarded == nil || acted != forwarded {
			t.Fatalf("GET %q: forwarded by route %v as %q, but the upstream acts on %q, route %v's", path, forwarded, got[0].uri, got[0].path, acted)
		}
		if before >= 0 && before-now != forwarded.cost {
			t.Fatalf("GET %q: metered %d units, want route %s's %d", path, before-now, forwarded.id, forwarded.cost)
		}
	})
}
