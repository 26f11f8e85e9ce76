package routes

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/valyala/fasthttp"
)

// FuzzProxyPath sends arbitrary request-targets through what the API does
// with them: fasthttp parses the target, Resolve puts the raw path in
// normal form and picks a route on it, Target builds the upstream URL and a
// fasthttp client that does not normalize paths (as the API's) writes the
// request line. Whatever the input, the path is refused, or its normal form
// is the reference's (normal), the route is the one of longest prefix of
// that form and the same on its loose reading (looseOf) — a path whose two
// readings pick two routes is refused —, and the upstream gets a path under
// the route's base with no dot segment in any spelling, escaped no more
// than it was sent, and the query as sent. Seeds are in
// testdata/fuzz/FuzzProxyPath.
func FuzzProxyPath(f *testing.F) {
	tab := proxyTable(f)
	f.Fuzz(func(t *testing.T, target string) {
		var in fasthttp.URI
		if err := in.Parse([]byte("tollgate.test"), []byte(target)); err != nil {
			return // the server answers 400 before any handler
		}
		raw, query := string(in.PathOriginal()), string(in.QueryString())
		path, ok := Normalize(raw)
		if ok != clean(raw) {
			t.Fatalf("%q: Normalize ok=%t, want %t", raw, ok, !ok)
		}
		if ok && path != normal(raw) {
			t.Fatalf("%q: normal form %q, want %q", raw, path, normal(raw))
		}
		for _, method := range []string{"GET", "POST"} {
			r := tab.Match(method, raw)
			want := longestPrefix(tab, method, path)
			if want != nil && looseRoute(tab, method, path) != want {
				want = nil // ambiguous: refused
			}
			if r == nil {
				if want != nil && ok {
					t.Fatalf("%s %q: refused, want route %s", method, raw, want.Path)
				}
				continue
			}
			if r != want {
				t.Fatalf("%s %q: matched %s, want %v", method, raw, r.Path, want)
			}
			if !ok {
				t.Fatalf("%s %q: matched %s, want it refused", method, raw, r.Path)
			}
			if r.UpstreamURL() == nil {
				continue
			}
			host, sent := wire(t, r.Target(path, query))
			if host != r.UpstreamURL().Host {
				t.Fatalf("%q: sent to host %q, want %q", raw, host, r.UpstreamURL().Host)
			}
			sentPath, sentQuery, _ := strings.Cut(sent, "?")
			base, rest := r.UpstreamURL().EscapedPath(), strings.TrimPrefix(path, r.Path)
			if under := strings.TrimSuffix(base, "/") + "/"; sentPath != base && sentPath != "/" && !strings.HasPrefix(sentPath, under) {
				t.Fatalf("%q: upstream path %q is not under the base %q", raw, sentPath, base)
			}
			if !strings.HasSuffix(sentPath, rest) {
				t.Fatalf("%q: upstream path %q does not end with the rest %q in normal form", raw, sentPath, rest)
			}
			if !clean(sentPath) {
				t.Fatalf("%q: upstream path %q holds a dot segment or a bad escape", raw, sentPath)
			}
			if strings.Contains(sent, "%25") && !strings.Contains(target, "%25") && !strings.Contains(base, "%25") {
				t.Fatalf("%q: upstream request-target %q is escaped twice", target, sent)
			}
			if sentQuery != query && !strings.ContainsFunc(query, isControl) {
				t.Fatalf("%q: upstream query %q, want %q", target, sentQuery, query)
			}
			if strings.ContainsFunc(sent, isControl) {
				t.Fatalf("%q: upstream request-target %q holds a space or a control", target, sent)
			}
		}
	})
}

// wire writes the request for url as the API's upstream client does and
// returns the Host header and the request-target of its request line.
func wire(tb testing.TB, url string) (host, target string) {
	tb.Helper()
	var req fasthttp.Request
	req.SetRequestURI(url)
	req.URI().DisablePathNormalizing = true
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	if err := req.Write(w); err != nil {
		tb.Fatalf("write %q: %v", url, err)
	}
	_ = w.Flush()
	line, _, _ := strings.Cut(buf.String(), "\r\n")
	method, rest, _ := strings.Cut(line, " ")
	target, proto, _ := strings.Cut(rest, " ")
	if method != "GET" || proto != "HTTP/1.1" {
		tb.Fatalf("write %q: request line %q", url, line)
	}
	return string(req.Header.Host()), target
}

func isControl(r rune) bool { return r <= ' ' || r == 0x7f }

// longestPrefix is Match's reference: the longest route path that is the
// whole path or a prefix of it ending at a segment boundary.
func longestPrefix(tab *Table, method, path string) *Route {
	var best *Route
	for _, r := range tab.All() {
		if r.Method != "*" && r.Method != method {
			continue
		}
		if path != r.Path && !strings.HasPrefix(path, strings.TrimSuffix(r.Path, "/")+"/") {
			continue
		}
		if best == nil || len(r.Path) > len(best.Path) {
			best = r
		}
	}
	return best
}

// separators are the spellings of a segment boundary some upstream honours.
var separators = strings.NewReplacer("%2f", "/", "%2F", "/", "%5c", "/", "%5C", "/", `\`, "/")

// clean is acceptable's reference, written the slow way: the path starts
// with /, holds no byte that ends a request-target, and no segment unescapes
// to . or .. once a ;parameter is cut.
func clean(path string) bool {
	if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, "?#") {
		return false
	}
	for _, c := range []byte(path) {
		if c <= ' ' || c == 0x7f {
			return false
		}
	}
	for _, seg := range strings.Split(separators.Replace(path), "/") {
		s, err := url.PathUnescape(seg)
		if err != nil {
			return false
		}
		if s, _, _ = strings.Cut(s, ";"); s == "." || s == ".." {
			return false
		}
	}
	return true
}

var escape = regexp.MustCompile(`%[0-9A-Fa-f]{2}`)

// normal is Normalize's reference: each escape of an unreserved character
// decoded, the others in capitals.
func normal(path string) string {
	return escape.ReplaceAllStringFunc(path, func(e string) string {
		b, _ := hex.DecodeString(e[1:])
		if c := rune(b[0]); unicode.IsLetter(c) && c < 0x80 || unicode.IsDigit(c) && c < 0x80 || strings.ContainsRune("-._~", c) {
			return string(c)
		}
		return strings.ToUpper(e)
	})
}

// looseOf is appendLoose's reference: the path decoded, with \ as /, split
// into segments; each loses its ;parameter and its capitals, and the empty
// ones are dropped (a trailing / stays).
func looseOf(path string) string {
	decoded := escape.ReplaceAllStringFunc(strings.ReplaceAll(path, `\`, "/"), func(e string) string {
		b, _ := hex.DecodeString(e[1:])
		if b[0] == '\\' {
			return "/"
		}
		return string(b)
	})
	var kept []string
	segs := strings.Split(decoded, "/")
	for _, seg := range segs {
		if seg, _, _ = strings.Cut(seg, ";"); seg != "" {
			kept = append(kept, strings.ToLower(seg))
		}
	}
	out := "/" + strings.Join(kept, "/")
	if last, _, _ := strings.Cut(segs[len(segs)-1], ";"); last == "" && len(kept) > 0 {
		out += "/"
	}
	return out
}

// looseRoute is the route a lenient upstream says path (in normal form)
// belongs to: the first, in the table's order, whose path reads as a
// prefix of path's reading by whole segments.
func looseRoute(tab *Table, method, path string) *Route {
	p := looseOf(path)
	for _, r := range tab.All() {
		if r.Method != "*" && r.Method != method {
			continue
		}
		if rp := looseOf(r.Path); p == rp || strings.HasPrefix(p, strings.TrimSuffix(rp, "/")+"/") {
			return r
		}
	}
	return nil
}
