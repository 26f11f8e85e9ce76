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
