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
// A request's path is first put in normal form (Normalize): escapes of
// unreserved characters (ALPHA, DIGIT, -, ., _, ~) are decoded and the hex of
// every other escape is written in capitals, as RFC 3986 (section 6.2.2)
// says every upstream must read them. Routes are matched on that form and
// the upstream receives it: /api/w/%65xpensive is /api/w/expensive, metered
// and forwarded as such. Nothing else is decoded or re-encoded: a%20b stays
// a%20b, group%2Fproject stays one segment, a ;parameter and an empty
// segment stay where they are, and the query goes byte for byte.
//
// Upstreams differ in what else they read into a path: some decode %2F, %5C
// or \ into a /, drop ;parameters (Tomcat) or empty segments (nginx's
// merge_slashes), or ignore case (IIS, ASP.NET). A path is matched a second
// time as the most lenient of them would read it (loose); when that picks
// another route, the path is ambiguous and refused (ErrAmbiguous): 400
// naming the path, neither metered nor forwarded. So whatever the upstream
// makes of a path it gets, the route it acts on is the route metered.
//
// A path holding a dot segment ("." or "..") in any spelling an upstream
// might decode is refused as well (ErrPath, and Acceptable is false): %2e
// for a dot, %2f, %5c and \ between segments as well as /, and a ;parameter
// after the dots ("..;x", which Tomcat reads as ".."). A malformed escape, a
// control byte, space, ? or # in the path is refused the same way. Refusing
// rather than resolving (RFC 3986 remove_dot_segments) gives every accepted
// path one meaning, and nothing below a route's base can name a path above
// it. Clients resolve dot segments before sending (RFC 3986, section 5.2),
// so only handmade requests hold them.
//
// It decides nothing about quotas and proxies nothing: it only says which
// route a request is.
package routes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
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

	loose    string // Path as the most lenient upstream reads it (appendLoose)
	upstream *url.URL
	origin   string // scheme://host of the upstream, for Target
	base     string // the upstream's path, escaped as configured
	timeout  time.Duration
}

// UpstreamURL is the parsed upstream, nil for a built-in handler.
func (r *Route) UpstreamURL() *url.URL { return r.upstream }

// UpstreamTimeout bounds the whole upstream exchange.
func (r *Route) UpstreamTimeout() time.Duration { return r.timeout }

// Target returns the upstream URL for a request path in normal form that
// Resolve gave r for, and the raw query. The route's path is replaced by the
// upstream's; the rest of the path and the query are copied as they are,
// never unescaped or escaped again (url.URL.String would escape the % of
// a%20b once more). The one exception: fasthttp's server lets spaces and
// control bytes through in a query, and those are escaped, so that the
// upstream's request line stays a method, a target and a version.
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
	// anyLoose: a route's path reads otherwise to a lenient upstream (a
	// capital, an escape): every path is then matched loose as well, since
	// one that holds nothing of the kind may still read as that route's.
	anyLoose bool
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
	raw, err := os.ReadFile(filepath.Clean(path))
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
		k := r.Method + " " + r.Path
		if seen[k] {
			return nil, fmt.Errorf("routes[%d]: %s is listed twice", i, k)
		}
		seen[k] = true
		// Two paths that read the same to a lenient upstream would make
		// every request to one of them ambiguous.
		for j, o := range doc.Routes[:i] {
			if o.loose == r.loose && o.Path != r.Path && (o.Method == r.Method || o.Method == "*" || r.Method == "*") {
				return nil, fmt.Errorf("routes[%d]: path %q is routes[%d]'s %q to an upstream that ignores case, ;parameters or empty segments, or reads %%2F, %%5C or \\ as /", i, r.Path, j, o.Path)
			}
		}
	}
	slices.SortStableFunc(doc.Routes, func(a, b *Route) int { return len(b.Path) - len(a.Path) })
	t := &Table{routes: doc.Routes}
	for _, r := range t.routes {
		t.anyLoose = t.anyLoose || r.loose != r.Path
	}
	return t, nil
}

func (r *Route) validate() error {
	r.Method = strings.ToUpper(r.Method)
	if r.Method == "ANY" {
		r.Method = "*"
	}
	if !slices.Contains(methods, r.Method) {
		return fmt.Errorf("method %q is not one of %v", r.Method, methods)
	}
	path, ok := Normalize(r.Path)
	if !strings.HasPrefix(path, "/api/") || strings.Contains(path, "*") || !ok {
		return fmt.Errorf("path %q must start with /api/ and hold no ?, #, * or space, no dot segment and no malformed escape", r.Path)
	}
	r.Path, r.loose = path, string(appendLoose(nil, path))
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

// Errors of Resolve: the path cannot be matched safely. Both are bad input
// (400 naming the path), not an unknown route.
var (
	// ErrPath: the path is not Acceptable (a dot segment, a malformed
	// escape, a control byte).
	ErrPath = errors.New("routes: not a plain path")
	// ErrAmbiguous: a lenient upstream would read the path as another
	// route's (see the package comment).
	ErrAmbiguous = errors.New("routes: a path an upstream may read as another route's")
)

// Resolve returns the route for a request's raw path (as sent, still
// escaped) and the path in normal form (Normalize), which the route was
// matched on and which Target forwards. The route is nil, with a nil error,
// when none matches; the error is ErrPath or ErrAmbiguous when the path
// cannot be matched safely. A path already in normal form (every path a
// well-behaved client sends without escapes) is returned as it is: no copy,
// no allocation.
func (t *Table) Resolve(method, raw string) (*Route, string, error) {
	f, ok := scan(raw)
	if !ok {
		return nil, "", ErrPath
	}
	path := raw
	if f&mustRewrite != 0 {
		path = rewrite(raw)
	}
	r := t.match(method, path)
	if r != nil && (f&readsOtherwise != 0 || t.anyLoose) {
		var scratch [256]byte
		if t.matchLoose(method, appendLoose(scratch[:0], path)) != r {
			return nil, path, ErrAmbiguous
		}
	}
	return r, path, nil
}

// Match returns the route for a request's raw path, or nil when none
// matches or Resolve refuses the path.
func (t *Table) Match(method, raw string) *Route {
	r, _, _ := t.Resolve(method, raw)
	return r
}

// match returns the route of longest path that is a prefix of path (in
// normal form), by whole segments.
func (t *Table) match(method, path string) *Route {
	for _, r := range t.routes {
		if (r.Method == "*" || r.Method == method) && matchPrefix(path, r.Path) {
			return r
		}
	}
	return nil
}

// matchLoose is match on loose forms (appendLoose): the route a lenient
// upstream would say a path belongs to. Loose forms only ever gain
// segment boundaries and lose what is not part of a route's path, so the
// route matched on the normal form also matches here; a longer one that
// matches only here is the ambiguity Resolve refuses. And any upstream
// reading between the two (decoding %2F but not dropping ;parameters, say)
// matches a route between them: when both agree, every reading agrees.
func (t *Table) matchLoose(method string, loose []byte) *Route {
	for _, r := range t.routes {
		if (r.Method == "*" || r.Method == method) && matchPrefix(loose, r.loose) {
			return r
		}
	}
	return nil
}

// matchPrefix matches whole path segments: /api/a matches /api/a and /api/a/b
// but not /api/ab; a prefix ending in / matches anything below it.
// The comparison of path (a string or bytes) with prefix copies nothing.
func matchPrefix[P string | []byte](path P, prefix string) bool {
	if len(path) < len(prefix) || string(path[:len(prefix)]) != prefix {
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
// input, not an unknown route.
func Acceptable(path string) bool {
	_, ok := scan(path)
	return ok
}

// Normalize returns path in normal form: escapes of unreserved characters
// decoded, the hex of the other escapes in capitals. ok is false when the
// path is not Acceptable. A path already in normal form is returned as it is.
func Normalize(path string) (string, bool) {
	f, ok := scan(path)
	if !ok {
		return "", false
	}
	if f&mustRewrite != 0 {
		path = rewrite(path)
	}
	return path, true
}

// What scan finds in an acceptable path.
const (
	// mustRewrite: an escape to decode (an unreserved character) or to
	// write in capitals.
	mustRewrite = 1 << iota
	// readsOtherwise: something a lenient upstream reads otherwise than
	// the normal form says (an escape, a \, a ;, an empty segment, a
	// capital), for which Resolve checks the loose match.
	readsOtherwise
)

// scan reads a raw path once, allocating nothing (it runs on every
// metered request): ok tells whether it is Acceptable, and the flags what
// Resolve must do beyond matching it as it is.
func scan(path string) (flags int, ok bool) {
	if path == "" || path[0] != '/' {
		return 0, false
	}
	dots, other, param := 0, false, false // of the segment read so far
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c <= ' ' || c == 0x7f || c == '?' || c == '#':
			return 0, false
		case c == '%':
			if i+2 >= len(path) || !isHex(path[i+1]) || !isHex(path[i+2]) {
				return 0, false
			}
			c = unhex(path[i+1])<<4 | unhex(path[i+2])
			if unreserved(c) || path[i+1] >= 'a' || path[i+2] >= 'a' {
				flags |= mustRewrite
			}
			flags |= readsOtherwise
			i += 2
		case i > 0 && lenientByte(c, path[i-1]):
			flags |= readsOtherwise
		}
		switch {
		case c == '/' || c == '\\':
			if !other && (dots == 1 || dots == 2) {
				return 0, false
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
	return flags, other || (dots != 1 && dots != 2)
}

// lenientByte reports whether a lenient upstream reads the byte c, after
// prev, otherwise than as itself: a \, a ;, a capital, a / after a /. (An
// escape is another such place.)
func lenientByte(c, prev byte) bool {
	return c == '\\' || c == ';' || 'A' <= c && c <= 'Z' || c == '/' && prev == '/'
}

// rewrite returns an acceptable path in normal form: each escape of an
// unreserved character decoded, every other escape's hex in capitals.
func rewrite(path string) string {
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(path))
	for i := 0; i < len(path); i++ {
		c := path[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		c = unhex(path[i+1])<<4 | unhex(path[i+2])
		if unreserved(c) {
			b = append(b, c)
		} else {
			b = append(b, '%', hex[c>>4], hex[c&15])
		}
		i += 2
	}
	return string(b)
}

// appendLoose appends an acceptable path as the most lenient upstream
// reads it: every escape decoded once, %2F, %5C and \ read as /, a
// ;parameter dropped from its segment, empty segments dropped, capitals
// read as small letters. It is what matchLoose matches; nothing is ever
// sent in this form.
func appendLoose(dst []byte, path string) []byte {
	return appendReading(dst, path, foldCase|splitEscaped)
}

// Ways of reading a path (appendReading), beyond what every lenient
// reading does (decode escapes, drop ;parameters and empty segments).
const (
	foldCase     = 1 << iota // capitals read as small letters
	splitEscaped             // %2F, %5C and \ read as / (otherwise kept as sent)
)

// appendReading appends a path as a lenient upstream reads it:
// every escape decoded once, a ;parameter dropped from its segment, empty
// segments dropped; with foldCase capitals read as small letters, with
// splitEscaped %2F, %5C and \ read as /. Without splitEscaped they stay in
// their segment as sent, so that a segment holding one never equals a
// segment of the splitting reading. A % that starts no escape (never in an
// acceptable path; perhaps in a policy's prefix stored before prefixes were
// checked) is read as itself.
func appendReading(dst []byte, path string, mode int) []byte {
	param := false
	for i := 0; i < len(path); i++ {
		c, escaped := path[i], false
		if c == '%' && i+2 < len(path) && isHex(path[i+1]) && isHex(path[i+2]) {
			c, escaped = unhex(path[i+1])<<4|unhex(path[i+2]), true
			i += 2
		}
		sep := c == '/' || c == '\\'
		switch {
		case c == '/' && !escaped || sep && mode&splitEscaped != 0:
			if len(dst) == 0 || dst[len(dst)-1] != '/' {
				dst = append(dst, '/')
			}
			param = false
		case param:
		case sep && escaped:
			dst = append(dst, path[i-2:i+1]...)
		case c == ';':
			param = true
		case 'A' <= c && c <= 'Z' && mode&foldCase != 0:
			dst = append(dst, c+'a'-'A')
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// UnderPrefix reports whether a request path in normal form falls under a
// policy's path prefix (in normal form too): the path starts with the
// prefix, or does as the most lenient upstream reads both (appendLoose), so
// that no spelling an upstream acts on as a path under the prefix (an
// empty segment, a ;parameter, another case, an escape) escapes it. It
// allocates nothing for paths and prefixes up to 256 bytes.
func UnderPrefix(path, prefix string) bool {
	// Where both spell alike and plainly up to their first difference,
	// and that difference is plain too, both readings differ there: the
	// answer of nearly every request, without reading either otherwise.
	i := 0
	for ; i < len(path) && i < len(prefix) && path[i] == prefix[i]; i++ {
		if path[i] == '%' || i > 0 && lenientByte(path[i], path[i-1]) {
			return underLoose(path, prefix)
		}
	}
	if i == len(prefix) {
		return true
	}
	if plainAt(prefix, i) && (i == len(path) || plainAt(path, i)) {
		return false
	}
	return underLoose(path, prefix)
}

// plainAt reports whether a lenient upstream reads s[i] as itself.
func plainAt(s string, i int) bool {
	return s[i] != '%' && (i == 0 || !lenientByte(s[i], s[i-1]))
}

// underLoose is UnderPrefix on the paths as the most lenient upstream
// reads them.
func underLoose(path, prefix string) bool {
	var p, q [256]byte
	return bytes.HasPrefix(appendLoose(p[:0], path), appendLoose(q[:0], prefix))
}

// Loose is a path as the most lenient upstream reads it (see appendLoose):
// what UnderPrefix compares.
func Loose(path string) string { return string(appendLoose(nil, path)) }

// Segment appends to dst the n-th segment (0-based, after the leading /)
// of a request path in normal form as an upstream acts on it: empty
// segments do not count, a ;parameter is not part of its segment, every
// escape is decoded, and case is kept. ok is false when the path has no
// such segment. The error is ErrAmbiguous when upstreams disagree on the
// segment: an encoded slash or backslash (%2F, %5C) or a \ in it or before
// it, which some read as / and others do not.
func Segment(dst []byte, path string, n int) (seg []byte, ok bool, err error) {
	var a, b [256]byte
	split, ok := nthSegment(appendReading(a[:0], path, splitEscaped), n)
	whole, wholeOK := nthSegment(appendReading(b[:0], path, 0), n)
	if ok != wholeOK || !bytes.Equal(split, whole) {
		return dst, false, ErrAmbiguous
	}
	return append(dst, split...), ok, nil
}

// nthSegment returns the n-th non-empty segment of a reading (which holds
// no empty segment but a last one after a final /).
func nthSegment(reading []byte, n int) ([]byte, bool) {
	rest := reading
	for i := 0; len(rest) > 0; i++ {
		rest = rest[1:] // the / before the segment
		end := bytes.IndexByte(rest, '/')
		if end < 0 {
			end = len(rest)
		}
		if i == n {
			return rest[:end], end > 0
		}
		rest = rest[end:]
	}
	return nil, false
}

// unreserved reports whether c is an unreserved character (RFC 3986,
// section 2.3), whose escape means c itself.
func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
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
