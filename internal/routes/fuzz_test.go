package routes

import (
	"bufio"
	"bytes"
	"net/url"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// FuzzProxyPath sends arbitrary request-targets through what the API does
// with them: fasthttp parses the target, Match picks a route on the raw path,
// Target builds the upstream URL and a fasthttp client that does not
// normalize paths (as the API's) writes the request line. Whatever the input,
// the path is refused, or the upstream gets a path under the route's base
// with no dot segment in any spelling, escaped no more than it was sent, and
// the query as sent. Seeds are in testdata/fuzz/FuzzProxyPath.
func FuzzProxyPath(f *testing.F) {
	tab := proxyTable(f)
	f.Fuzz(func(t *testing.T, target string) {
		var in fasthttp.URI
		if err := in.Parse([]byte("tollgate.test"), []byte(target)); err != nil {
			return // the server answers 400 before any handler
		}
		path, query := string(in.PathOriginal()), string(in.QueryString())
		for _, method := range []string{"GET", "POST"} {
			r, want := tab.Match(method, path), longestPrefix(tab, method, path)
			if r == nil {
				if want != nil && clean(path) {
					t.Fatalf("%s %q: refused, want route %s", method, path, want.Path)
				}
				continue
			}
			if r != want {
				t.Fatalf("%s %q: matched %s, want %v", method, path, r.Path, want)
			}
			if !clean(path) {
				t.Fatalf("%s %q: matched %s, want it refused", method, path, r.Path)
			}
			if r.UpstreamURL() == nil {
				continue
			}
			host, sent := wire(t, r.Target(path, query))
			if host != r.UpstreamURL().Host {
				t.Fatalf("%q: sent to host %q, want %q", path, host, r.UpstreamURL().Host)
			}
			sentPath, sentQuery, _ := strings.Cut(sent, "?")
			base, rest := r.UpstreamURL().EscapedPath(), strings.TrimPrefix(path, r.Path)
			if under := strings.TrimSuffix(base, "/") + "/"; sentPath != base && sentPath != "/" && !strings.HasPrefix(sentPath, under) {
				t.Fatalf("%q: upstream path %q is not under the base %q", path, sentPath, base)
			}
			if !strings.HasSuffix(sentPath, rest) {
				t.Fatalf("%q: upstream path %q does not end with the rest %q as sent", path, sentPath, rest)
			}
			if !clean(sentPath) {
				t.Fatalf("%q: upstream path %q holds a dot segment or a bad escape", path, sentPath)
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
