package routes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDefaultHasTheDemoRoutes(t *testing.T) {
	tab := Default()
	for _, tc := range []struct {
		method, path, meter string
		cost                int64
	}{
		{"GET", "/api/demo/echo", "demo", 1},
		{"POST", "/api/demo/report", "report", 10},
	} {
		r := tab.Match(tc.method, tc.path)
		if r == nil || r.Meter != tc.meter || r.Cost != tc.cost {
			t.Errorf("%s %s: got %+v, want meter %s cost %d", tc.method, tc.path, r, tc.meter, tc.cost)
		}
	}
	if r := tab.Match("POST", "/api/demo/echo"); r != nil {
		t.Errorf("POST /api/demo/echo matched %+v, want no route", r)
	}
}

func TestMatchLongestPrefixAndSegments(t *testing.T) {
	tab, err := Parse([]byte(`{"routes": [
		{"method": "*", "path": "/api/w/", "meter": "w", "cost": 1, "upstream": "http://127.0.0.1:9/v2/"},
		{"method": "GET", "path": "/api/w/special", "meter": "s", "cost": 5, "upstream": "http://127.0.0.1:9"},
		{"method": "GET", "path": "/api/x", "meter": "x", "cost": 1, "handler": "echo"}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path, meter string }{
		{"GET", "/api/w/special", "s"},
		{"GET", "/api/w/special/deep", "s"},
		{"POST", "/api/w/special", "w"},
		{"DELETE", "/api/w/anything", "w"},
		{"GET", "/api/x", "x"},
		{"GET", "/api/x/y", "x"},
		{"GET", "/api/xy", ""},
		{"GET", "/api/other", ""},
	} {
		r := tab.Match(tc.method, tc.path)
		got := ""
		if r != nil {
			got = r.Meter
		}
		if got != tc.meter {
			t.Errorf("%s %s: meter %q, want %q", tc.method, tc.path, got, tc.meter)
		}
	}
	r := tab.Match("GET", "/api/w/today")
	if got, want := r.Target("/api/w/today", "city=Paris"), "http://127.0.0.1:9/v2/today?city=Paris"; got != want {
		t.Errorf("Target = %q, want %q", got, want)
	}
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown field", `{"routes": [{"method": "GET", "path": "/api/a", "meter": "a", "cost": 1, "handler": "echo", "x": 1}]}`, "unknown field"},
		{"bad method", `{"routes": [{"method": "FETCH", "path": "/api/a", "meter": "a", "cost": 1, "handler": "echo"}]}`, "method"},
		{"outside /api", `{"routes": [{"method": "GET", "path": "/admin", "meter": "a", "cost": 1, "handler": "echo"}]}`, "path"},
		{"zero cost", `{"routes": [{"method": "GET", "path": "/api/a", "meter": "a", "cost": 0, "handler": "echo"}]}`, "cost"},
		{"huge cost", `{"routes": [{"method": "GET", "path": "/api/a", "meter": "a", "cost": 99999999999999999, "handler": "echo"}]}`, "cost"},
		{"bad meter", `{"routes": [{"method": "GET", "path": "/api/a", "meter": "A|B", "cost": 1, "handler": "echo"}]}`, "meter"},
		{"both", `{"routes": [{"method": "GET", "path": "/api/a", "meter": "a", "cost": 1, "handler": "echo", "upstream": "http://x"}]}`, "either"},
		{"neither", `{"routes": [{"method": "GET", "path": "/api/a", "meter": "a", "cost": 1}]}`, "handler or an upstream"},
		{"bad upstream", `{"routes": [{"method": "GET", "path": "/api/a", "meter": "a", "cost": 1, "upstream": "ftp://x"}]}`, "upstream"},
		{"bad timeout", `{"routes": [{"method": "GET", "path": "/api/a", "meter": "a", "cost": 1, "upstream": "http://x", "timeout": "1y"}]}`, "timeout"},
		{"twice", `{"routes": [{"method": "GET", "path": "/api/a", "meter": "a", "cost": 1, "handler": "echo"}, {"method": "get", "path": "/api/a", "meter": "b", "cost": 1, "handler": "echo"}]}`, "twice"},
		{"not JSON", `routes: []`, "invalid"},
		{"dot segment in path", `{"routes": [{"method": "GET", "path": "/api/a/../b", "meter": "a", "cost": 1, "handler": "echo"}]}`, "dot segment"},
		{"bad escape in path", `{"routes": [{"method": "GET", "path": "/api/a%zz", "meter": "a", "cost": 1, "handler": "echo"}]}`, "escape"},
		{"dot segment in upstream", `{"routes": [{"method": "GET", "path": "/api/a", "meter": "a", "cost": 1, "upstream": "http://x/v1/%2e%2e/"}]}`, "dot segment"},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
}

func TestLoadNamesTheVariable(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "missing.json")); err == nil || !strings.Contains(err.Error(), "TOLLGATE_ROUTES") {
		t.Fatalf("Load(missing) = %v, want an error naming TOLLGATE_ROUTES", err)
	}
	p := filepath.Join(t.TempDir(), "routes.json")
	if err := os.WriteFile(p, []byte(`{"routes": [{"method": "GET", "path": "/api/a", "meter": "a", "cost": 3, "handler": "report"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tab, err := Load(p)
	if err != nil || tab.Match("GET", "/api/a").Cost != 3 {
		t.Fatalf("Load = %v, %v; want the file's table", tab, err)
	}
}

// proxyTable is the table of the path tests: routes with and without a
// trailing slash, upstreams with and without a path.
func proxyTable(tb testing.TB) *Table {
	tb.Helper()
	tab, err := Parse([]byte(`{"routes": [
		{"method": "*", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": "http://up.test/v1/ok/"},
		{"method": "GET", "path": "/api/up/special", "meter": "special", "cost": 1, "upstream": "http://up.test:8080/v2"},
		{"method": "*", "path": "/api/bare/", "meter": "bare", "cost": 1, "upstream": "https://bare.test"},
		{"method": "*", "path": "/api/sp", "meter": "sp", "cost": 1, "upstream": "http://u:p@sp.test/a%20b/?"},
		{"method": "GET", "path": "/api/echo", "meter": "echo", "cost": 1, "handler": "echo"}
	]}`))
	if err != nil {
		tb.Fatal(err)
	}
	return tab
}

func TestTargetKeepsThePathAsSent(t *testing.T) {
	tab := proxyTable(t)
	for _, tc := range []struct{ path, query, want string }{
		{"/api/up/files/a%20b", "", "http://up.test/v1/ok/files/a%20b"},
		{"/api/up/files/a%2520b", "", "http://up.test/v1/ok/files/a%2520b"},
		{"/api/up/group%2Fproject/raw", "ref=main", "http://up.test/v1/ok/group%2Fproject/raw?ref=main"},
		{"/api/up/%E2%82%AC/é", "q=a%20b&r=%2F+x&s", "http://up.test/v1/ok/%E2%82%AC/é?q=a%20b&r=%2F+x&s"},
		{"/api/up/x//y/", "", "http://up.test/v1/ok/x//y/"},
		{"/api/up//x", "", "http://up.test/v1/ok//x"},
		{"/api/up/", "a=1", "http://up.test/v1/ok/?a=1"},
		{"/api/up/..x/.y/...", "", "http://up.test/v1/ok/..x/.y/..."},
		{"/api/up/special", "", "http://up.test:8080/v2"},
		{"/api/up/special/deep%3F", "", "http://up.test:8080/v2/deep%3F"},
		{"/api/bare/", "", "https://bare.test"},
		{"/api/bare/x", "", "https://bare.test/x"},
		{"/api/sp", "", "http://u:p@sp.test/a%20b/"},
		{"/api/sp/x%20y", "z", "http://u:p@sp.test/a%20b/x%20y?z"},
		{"/api/up/q", "a b\tc\x7f#%20", "http://up.test/v1/ok/q?a%20b%09c%7F%23%20"},
	} {
		r := tab.Match("GET", tc.path)
		if r == nil {
			t.Errorf("Match(GET, %q) = nil, want a route", tc.path)
			continue
		}
		if got := r.Target(tc.path, tc.query); got != tc.want {
			t.Errorf("Target(%q, %q) = %q, want %q", tc.path, tc.query, got, tc.want)
		}
	}
}

func TestMatchRefusesDotSegments(t *testing.T) {
	tab := proxyTable(t)
	for _, path := range []string{
		"/api/up/..", "/api/up/.", "/api/up/a/../../secret", "/api/up/./x", "/api/up/x/.",
		"/api/up/%2e%2e", "/api/up/%2E%2E/x", "/api/up/.%2e/x", "/api/up/%2e./x", "/api/up/%2e/x",
		"/api/up/a%2f..%2fx", "/api/up/a%2F..", "/api/up/a%5c..%5cx", "/api/up/a%5C.", `/api/up/a\..\x`,
		"/api/up/..;/x", "/api/up/.;jsessionid=1/x", "/api/up/..%3bx/y",
		"/api/echo/..", "/api/echo/../up/x", "/api/up/x/../../echo",
		"/api/up/%zz", "/api/up/%2", "/api/up/%", "/api/up/%%2e%2e",
		"/api/up/a b", "/api/up/a\x00b", "/api/up/a\x7fb", "/api/up/a?b", "/api/up/a#b", "api/up/x", "",
	} {
		if r := tab.Match("GET", path); r != nil {
			t.Errorf("Match(GET, %q) = route %s, want nil", path, r.Path)
		}
	}
	// Dots that are not a whole segment, and escapes that decode to neither
	// a dot nor a separator, are ordinary.
	for _, path := range []string{
		"/api/up/..x", "/api/up/x..", "/api/up/...", "/api/up/.well-known/x", "/api/up/%2e%2e%2e",
		"/api/up/a%252e%252e", "/api/up/;x/y", "/api/up/a;..", "/api/up/%00", "/api/up/é",
	} {
		if r := tab.Match("GET", path); r == nil || r.Meter != "up" {
			t.Errorf("Match(GET, %q) = %v, want route /api/up/", path, r)
		}
	}
}

// BenchmarkMatchAndTarget is the table's share of a proxied request.
func BenchmarkMatchAndTarget(b *testing.B) {
	tab := proxyTable(b)
	const path, query = "/api/up/v3/users/12345/files/report%202024.pdf", "page=2&size=50"
	b.ReportAllocs()
	for b.Loop() {
		r := tab.Match("GET", path)
		_ = r.Target(path, query)
	}
}

// TestResolveOnTheNormalForm: a path is matched, and forwarded, in normal
// form (escapes of unreserved characters decoded, the others' hex in
// capitals); one that a lenient upstream would read as another route's is
// ErrAmbiguous, one with a dot segment or a bad escape ErrPath.
func TestResolveOnTheNormalForm(t *testing.T) {
	tab, err := Parse([]byte(`{"routes": [
		{"method": "*", "path": "/api/w/", "meter": "w", "cost": 1, "upstream": "http://127.0.0.1:9/"},
		{"method": "GET", "path": "/api/w/expensive", "meter": "x", "cost": 100, "upstream": "http://127.0.0.1:9/x"},
		{"method": "*", "path": "/api/w/a/b", "meter": "ab", "cost": 7, "upstream": "http://127.0.0.1:9/ab"}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		raw, path, meter string
		err              error
	}{
		{"/api/w/cheap", "/api/w/cheap", "w", nil},
		{"/api/w/%65xpensive", "/api/w/expensive", "x", nil},
		{"/api/%77/%65%78%70%65%6e%73%69%76%65/x", "/api/w/expensive/x", "x", nil},
		{"/api/w/%61/%62", "/api/w/a/b", "ab", nil},
		{"/api/w/%7e%2d%2E%5f%30", "/api/w/~-._0", "w", nil},
		{"/api/w/%e2%82%ac%2a", "/api/w/%E2%82%AC%2A", "w", nil},
		{"/api/w/%2565xpensive", "/api/w/%2565xpensive", "w", nil},
		{"/api/w/x%2Fy", "/api/w/x%2Fy", "w", nil},
		{"/api/w/x//y;v=1", "/api/w/x//y;v=1", "w", nil},
		{"/api/w/Cheap", "/api/w/Cheap", "w", nil},
		{"/api/other", "/api/other", "", nil},
		{"/api/w/a%2Fb", "/api/w/a%2Fb", "", ErrAmbiguous},
		{"/api/w/a%2fb", "/api/w/a%2Fb", "", ErrAmbiguous},
		{"/api/w/a%5cb", "/api/w/a%5Cb", "", ErrAmbiguous},
		{`/api/w/a\b`, `/api/w/a\b`, "", ErrAmbiguous},
		{"/api/w//expensive", "/api/w//expensive", "", ErrAmbiguous},
		{"/api/w/expensive;v=1", "/api/w/expensive;v=1", "", ErrAmbiguous},
		{"/api/w/;v/expensive", "/api/w/;v/expensive", "", ErrAmbiguous},
		{"/api/w;v/expensive", "/api/w;v/expensive", "", nil}, // no route: 404, nothing forwarded
		{"/api/w/EXPENSIVE", "/api/w/EXPENSIVE", "", ErrAmbiguous},
		{"/api/w/%45xpensive", "/api/w/Expensive", "", ErrAmbiguous},
		{"/api/w/%2e%2e/expensive", "", "", ErrPath},
		{"/api/w/%zz", "", "", ErrPath},
	} {
		r, path, err := tab.Resolve("GET", tc.raw)
		meter := ""
		if r != nil {
			meter = r.Meter
		}
		if meter != tc.meter || err != tc.err || (tc.err != ErrPath && path != tc.path) {
			t.Errorf("Resolve(GET, %q) = %q, %q, %v; want %q, %q, %v", tc.raw, meter, path, err, tc.meter, tc.path, tc.err)
		}
	}
	// A route's own path is put in normal form, and two paths that read as
	// one to a lenient upstream are refused.
	tab, err = Parse([]byte(`{"routes": [{"method": "GET", "path": "/api/%7euser/%e2%82%ac", "meter": "u", "cost": 1, "handler": "echo"}]}`))
	if err != nil || tab.All()[0].Path != "/api/~user/%E2%82%AC" || tab.Match("GET", "/api/~user/%E2%82%AC/x") == nil {
		t.Errorf("a route path with escapes: %v, %v; want it in normal form", tab, err)
	}
	for _, doc := range []string{
		`{"routes": [{"method": "GET", "path": "/api/Files/", "meter": "a", "cost": 1, "handler": "echo"}, {"method": "*", "path": "/api/files/", "meter": "b", "cost": 1, "handler": "echo"}]}`,
		`{"routes": [{"method": "GET", "path": "/api/a/b", "meter": "a", "cost": 1, "handler": "echo"}, {"method": "GET", "path": "/api/a%2Fb", "meter": "b", "cost": 1, "handler": "echo"}]}`,
	} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), "ignores case") {
			t.Errorf("%s: %v, want an error naming the two paths", doc, err)
		}
	}
	if _, err := Parse([]byte(`{"routes": [{"method": "GET", "path": "/api/%7Ea", "meter": "a", "cost": 1, "handler": "echo"}, {"method": "GET", "path": "/api/~a", "meter": "b", "cost": 1, "handler": "echo"}]}`)); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("one path in two spellings: %v, want listed twice", err)
	}
	if _, err := Parse([]byte(`{"routes": [{"method": "GET", "path": "/api/Files/", "meter": "a", "cost": 1, "handler": "echo"}, {"method": "POST", "path": "/api/files/", "meter": "b", "cost": 1, "handler": "echo"}]}`)); err != nil {
		t.Errorf("two spellings for two methods: %v, want them taken", err)
	}
}

// TestResolveAllocatesNothing: a path already in normal form, with or
// without what makes Resolve match it loose as well, costs no allocation.
func TestResolveAllocatesNothing(t *testing.T) {
	tab := proxyTable(t)
	for _, path := range []string{"/api/up/v3/users/12345/files/report.pdf", "/api/up/v3/Users/AbC/files/report%202024.pdf;v=1"} {
		var err error
		if n := testing.AllocsPerRun(100, func() { _, _, err = tab.Resolve("GET", path) }); n != 0 {
			t.Errorf("Resolve(GET, %q): %v allocations, want 0", path, n)
		}
		if err != nil {
			t.Errorf("Resolve(GET, %q): %v", path, err)
		}
	}
}
