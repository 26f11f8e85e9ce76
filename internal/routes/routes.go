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
// its own or "*". For an upstream route, the route's path is replaced by the
// upstream URL's path and the rest follows, with the query string.
//
// Paths are matched and forwarded as the client sent them, escapes included:
// nothing is decoded and re-encoded, so the upstream receives the rest of the
// path and the query byte for byte (a%20b stays a%20b, group%2Fproject stays
// one segment). A path holding a dot segment ("." or "..") in any spelling an
// upstream might decode matches no route (Acceptable is false), so the API answers 400 and the
// request is neither metered nor forwarded. The spellings are: %2e for a dot,
// %2f, %5c and \ between segments as well as /, and a ;parameter after the
// dots ("..;x", which Tomcat reads as ".."). A malformed escape, a control
// byte, space, ? or # in the path is refused the same way. Refusing rather
// than resolving (RFC 3986 remove_dot_segments) gives every accepted path one
// meaning: the route metered is the route forwarded to, whatever decoding the
// upstream does, and nothing below a route's base can name a path above it.
// Clients resolve dot segments before sending (RFC 3986, section 5.2), so
// only handmade requests hold them.
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
	// Settle admits at Cost, then settles to the cost the upstream reports
	// in its Tollgate-Actual-Cost response header, or that the service
	// posts to /v1/settle within quota.SettleWindow (upstream routes only;
	// not with refund_on_5xx: a failed upstream reports an actual cost of 0).
	Settle bool `json:"settle,omitempty"`

	upstream *url.URL
	origin   string // scheme://host of the upstream, for Target
	base     string // the upstream's path, escaped as configured
	timeout  time.Duration
}

// UpstreamURL is the parsed upstream, nil for a built-in handler.
func (r *Route) UpstreamURL() *url.URL { return r.upstream }

// UpstreamTimeout bounds the whole upstream exchange.
func (r *Route) UpstreamTimeout() time.Duration { return r.timeout }

// Target returns the upstream URL for a raw request path that Match gave r
// for, and the raw query. The route's path is replaced by the upstream's; the
// rest of the path and the query are copied as they are, never unescaped or
// escaped again (url.URL.String would escape the % of a%20b once more). The
// one exception: fasthttp's server lets spaces and control bytes through in
// a query, and those are escaped, so that the upstream's request line stays
// a method, a target and a version.
func (r *Route) Target(path, rawQuery string) string {
	rest := strings.TrimPrefix(path, r.Path)
	dir, sep := strings.TrimSuffix(r.base, "/"), ""
	switch {
	case rest == "":
		dir = r.base
	case strings.HasSuffix(r.Path, "/"):
		sep = "/" // the route's slash, which TrimPrefix took
	}
	q := ""
	if rawQuery != "" {
		q = "?"
	}
	return r.origin + dir + sep + rest + q + escapeControls(rawQuery)
}

// escapeControls escapes the bytes no request-target may hold: controls,
// space, DEL, and # (which would start a fragment). It returns s itself when
// there are none, which is every query a well-behaved client sends.
func escapeControls(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f || c == '#' {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f || c == '#' {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
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
	if !strings.HasPrefix(r.Path, "/api/") || strings.Contains(r.Path, "*") || !Acceptable(r.Path) {
		return fmt.Errorf("path %q must start with /api/ and hold no ?, #, * or space, no dot segment and no malformed escape", r.Path)
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
		if r.RefundOn5xx || r.Timeout != "" || r.Settle {
			return fmt.Errorf("refund_on_5xx, settle and timeout apply to upstream routes only")
		}
	case r.Upstream != "":
		if r.Settle && r.RefundOn5xx {
			return fmt.Errorf("give settle or refund_on_5xx, not both (a settle route's upstream reports Tollgate-Actual-Cost: 0 when it failed)")
		}
		u, err := url.Parse(r.Upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
			return fmt.Errorf("upstream %q must be an http(s) URL without a query", r.Upstream)
		}
		if u.Path != "" && !Acceptable(u.EscapedPath()) {
			return fmt.Errorf("upstream %q must hold no dot segment", r.Upstream)
		}
		r.upstream, r.base = u, u.EscapedPath()
		o := *u
		o.Path, o.RawPath, o.ForceQuery, o.Fragment, o.RawFragment = "", "", false, "", ""
		r.origin = o.String()
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

// Match returns the route for a request's raw path (as sent, still escaped),
// or nil. A path that Acceptable refuses matches nothing.
func (t *Table) Match(method, path string) *Route {
	if !Acceptable(path) {
		return nil
	}
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

// Acceptable reports whether a raw path may be matched and forwarded: it
// starts with /, its escapes are well formed, it holds no byte that would
// end or split a request-target, and none of its segments is a dot segment
// in any spelling (see the package comment). A path it refuses is bad
// input, not an unknown route. It reads the path once and allocates
// nothing: it runs on every metered request.
func Acceptable(path string) bool {
	if path == "" || path[0] != '/' {
		return false
	}
	dots, other, param := 0, false, false // of the segment read so far
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c <= ' ' || c == 0x7f || c == '?' || c == '#':
			return false
		case c == '%':
			if i+2 >= len(path) || !isHex(path[i+1]) || !isHex(path[i+2]) {
				return false
			}
			c = unhex(path[i+1])<<4 | unhex(path[i+2])
			i += 2
		}
		switch {
		case c == '/' || c == '\\':
			if !other && (dots == 1 || dots == 2) {
				return false
			}
			dots, other, param = 0, false, false
		case param:
		case c == ';':
			param = true
		case c == '.':
			dots++
		default:
			other = true
		}
	}
	return other || (dots != 1 && dots != 2)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
