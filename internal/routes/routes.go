// Package routes is the table of metered routes: which requests under /api/
// are metered, under which meter and cost, and whether they are proxied to
// an upstream or served by a built-in handler.
//
// The table is a JSON file named by TOLLGATE_ROUTES:
//
//	{"routes": [
//	  {"method": "GET", "path": "/api/demo/echo", "meter": "demo", "cost": 1, "handler": "echo"},
//	  {"method": "*", "path": "/api/weather/", "meter": "weather", "cost": 2,
//	   "upstream": "http://127.0.0.1:9000/v2/", "timeout": "10s", "refund_on_5xx": true}
//	]}
//
// A request matches the route with the longest path prefix whose method is
// its own or "*". For an upstream route, the rest of the path after the
// prefix is appended to the upstream URL's path, and the query string is kept.
package routes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Built-in handlers.
const (
	HandlerEcho   = "echo"   // answers with what it received
	HandlerReport = "report" // answers with a small generated report
)

// Route is one metered route.
type Route struct {
	Method      string `json:"method"`
	Path        string `json:"path"`
	Meter       string `json:"meter"`
	Cost        int64  `json:"cost"`
	Handler     string `json:"handler,omitempty"`
	Upstream    string `json:"upstream,omitempty"`
	Timeout     string `json:"timeout,omitempty"`
	RefundOn5xx bool   `json:"refund_on_5xx,omitempty"`

	upstream *url.URL
	timeout  time.Duration
}

// UpstreamURL is the parsed upstream, nil for a built-in handler.
func (r *Route) UpstreamURL() *url.URL { return r.upstream }

// UpstreamTimeout bounds the whole upstream exchange.
func (r *Route) UpstreamTimeout() time.Duration { return r.timeout }

// Target returns the upstream URL for a request path and raw query.
func (r *Route) Target(path, rawQuery string) string {
	u := *r.upstream
	rest := strings.TrimPrefix(path, r.Path)
	u.Path = strings.TrimSuffix(u.Path, "/") + "/" + strings.TrimPrefix(rest, "/")
	if rest == "" {
		u.Path = r.upstream.Path
	}
	u.RawQuery = rawQuery
	return u.String()
}

// Table is a validated set of routes.
type Table struct {
	routes []*Route // longest path first
}

// Default is the built-in table: the demo routes of the API contract.
func Default() *Table {
	t, err := Parse([]byte(`{"routes": [
		{"method": "GET", "path": "/api/demo/echo", "meter": "demo", "cost": 1, "handler": "echo"},
		{"method": "POST", "path": "/api/demo/report", "meter": "report", "cost": 10, "handler": "report"}
	]}`))
	if err != nil {
		panic(err) // the built-in table is a constant
	}
	return t
}

// Load reads the table from path, or returns Default when path is empty.
func Load(path string) (*Table, error) {
	if path == "" {
		return Default(), nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("TOLLGATE_ROUTES: %w", err)
	}
	t, err := Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("TOLLGATE_ROUTES: %s: %w", path, err)
	}
	return t, nil
}

var (
	meterRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)
	methods = []string{"*", "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
)

// Parse reads and validates a JSON table; unknown fields are errors.
func Parse(raw []byte) (*Table, error) {
	var doc struct {
		Routes []*Route `json:"routes"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("routes: %w", err)
	}
	seen := map[string]bool{}
	for i, r := range doc.Routes {
		if err := r.validate(); err != nil {
			return nil, fmt.Errorf("routes[%d]: %w", i, err)
		}
		if k := r.Method + " " + r.Path; seen[k] {
			return nil, fmt.Errorf("routes[%d]: %s is listed twice", i, k)
		} else {
			seen[k] = true
		}
	}
	slices.SortStableFunc(doc.Routes, func(a, b *Route) int { return len(b.Path) - len(a.Path) })
	return &Table{routes: doc.Routes}, nil
}

func (r *Route) validate() error {
	r.Method = strings.ToUpper(r.Method)
	if r.Method == "ANY" {
		r.Method = "*"
	}
	if !slices.Contains(methods, r.Method) {
		return fmt.Errorf("method %q is not one of %v", r.Method, methods)
	}
	if !strings.HasPrefix(r.Path, "/api/") || strings.ContainsAny(r.Path, "?#* ") {
		return fmt.Errorf("path %q must start with /api/ and hold no ?, #, * or space", r.Path)
	}
	if !meterRE.MatchString(r.Meter) {
		return fmt.Errorf("meter %q must be 1 to 64 of a-z 0-9 _ . -", r.Meter)
	}
	if r.Cost < 1 || r.Cost > quota.MaxQuantity {
		return fmt.Errorf("cost %d must be between 1 and %d", r.Cost, quota.MaxQuantity)
	}
	switch {
	case r.Handler != "" && r.Upstream != "":
		return fmt.Errorf("give either handler or upstream, not both")
	case r.Handler != "":
		if r.Handler != HandlerEcho && r.Handler != HandlerReport {
			return fmt.Errorf("handler %q is not %q or %q", r.Handler, HandlerEcho, HandlerReport)
		}
		if r.RefundOn5xx || r.Timeout != "" {
			return fmt.Errorf("refund_on_5xx and timeout apply to upstream routes only")
		}
	case r.Upstream != "":
		u, err := url.Parse(r.Upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
			return fmt.Errorf("upstream %q must be an http(s) URL without a query", r.Upstream)
		}
		r.upstream = u
		r.timeout = 30 * time.Second
		if r.Timeout != "" {
			if r.timeout, err = time.ParseDuration(r.Timeout); err != nil || r.timeout <= 0 || r.timeout > 10*time.Minute {
				return fmt.Errorf("timeout %q must be a Go duration up to 10m", r.Timeout)
			}
		}
	default:
		return fmt.Errorf("give a handler or an upstream")
	}
	return nil
}

// Match returns the route for a request, or nil.
func (t *Table) Match(method, path string) *Route {
	for _, r := range t.routes {
		if (r.Method == "*" || r.Method == method) && matchPrefix(path, r.Path) {
			return r
		}
	}
	return nil
}

// matchPrefix matches whole path segments: /api/a matches /api/a and /api/a/b
// but not /api/ab; a prefix ending in / matches anything below it.
func matchPrefix(path, prefix string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	return len(path) == len(prefix) || strings.HasSuffix(prefix, "/") || path[len(prefix)] == '/'
}

// All returns the routes, longest path first.
func (t *Table) All() []*Route { return t.routes }
