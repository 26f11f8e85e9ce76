package routes

import (
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"testing"
)

// Policies read request paths as the upstream acts on them: UnderPrefix
// for a path_prefix, Segment for a path:N value.

func TestUnderPrefix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path, prefix string
		want         bool
	}{
		{"/api/items/expensive", "/api/items/expensive", true},
		{"/api/items/expensive/x", "/api/items/expensive", true},
		{"/api/items/expensive-report", "/api/items/expensive", true},
		{"/api/items//expensive", "/api/items/expensive", true},
		{"/api/items///expensive/x", "/api/items/expensive", true},
		{"/api/items/expensive;v=1", "/api/items/expensive", true},
		{"/api/items/;x/expensive", "/api/items/expensive", true},
		{"/api/items;x/expensive", "/api/items/expensive", true},
		{"/api/items/Expensive", "/api/items/expensive", true},
		{"/api/items%2Fexpensive", "/api/items/expensive", true},
		{`/api/items\expensive`, "/api/items/expensive", true},
		{"/api/items/expensive", "/api/Items/", true},
		{"/api/items/x", "/api/sp%20ace/", false},
		{"/api/sp%20ace/x", "/api/sp%20ace/", true},
		{"/api/items/cheap", "/api/items/expensive", false},
		{"/api/items/expens", "/api/items/expensive", false},
		{"/api/items/x/expensive", "/api/items/expensive", false},
		{"/api/items/x%2Fexpensive", "/api/items/expensive", false},
		{"/api/items", "/api/items/", false},
		{"", "/api/", false},
		// a prefix stored before prefixes were checked reads as it can
		{"/api/%zz/x", "/api/%zz", true},
		{"/api/x", "/api/%2", false},
	} {
		if got := UnderPrefix(tc.path, tc.prefix); got != tc.want {
			t.Errorf("UnderPrefix(%q, %q) = %t, want %t", tc.path, tc.prefix, got, tc.want)
		}
	}
}

func TestSegment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path string
		n    int
		want string // "-": none; "!": ErrAmbiguous
	}{
		{"/api/items/42", 2, "42"},
		{"/api/items/42", 3, "-"},
		{"/api/items/42/", 3, "-"},
		{"/api/items//42", 2, "42"},
		{"/api//items/42", 2, "42"},
		{"/api/items/42;x", 2, "42"},
		{"/api/items/;x/42", 2, "42"},
		{"/api/items/42%3Bx", 2, "42"},
		{"/api/items/HOT", 2, "HOT"},
		{"/api/items/caf%C3%A9", 2, "café"},
		{"/api/items/a%20b", 2, "a b"},
		{"/api/items/a%25b", 2, "a%b"},
		{"/api/items/4%2F2", 2, "!"},
		{"/api/items/4%5C2", 2, "!"},
		{`/api/items/4\2`, 2, "!"},
		{"/api/a%2Fb/42", 2, "!"},
		{"/api/items/4%2F2", 3, "!"},
		{"/api/items/4%2F2", 1, "items"},
		{"/api/items/42;x%2Fy", 2, "42"},
		{"/api/a%2Fa/a", 2, "a"}, // both readings agree
		{"/", 0, "-"},
		{"/api", 0, "api"},
	} {
		got, ok, err := Segment(nil, tc.path, tc.n)
		s := string(got)
		switch {
		case err != nil:
			s = "!"
		case !ok:
			s = "-"
		}
		if s != tc.want {
			t.Errorf("Segment(%q, %d) = %q, %t, %v; want %q", tc.path, tc.n, got, ok, err, tc.want)
		}
	}
}

// TestPolicyReadingsAllocateNothing: the readings of paths and prefixes of
// ordinary length stay on the stack.
func TestPolicyReadingsAllocateNothing(t *testing.T) {
	var buf [64]byte
	for _, path := range []string{"/api/items/42", "/api/Items//42;v=1/x%2Fy"} {
		var err error
		if n := testing.AllocsPerRun(100, func() {
			UnderPrefix(path, "/api/items/4")
			UnderPrefix(path, "/api/Items/%34")
			_, _, err = Segment(buf[:0], path, 2)
		}); n != 0 {
			t.Errorf("%s: %v allocations, want 0", path, n)
		}
		if err != nil {
			t.Errorf("Segment(%s, 2): %v", path, err)
		}
	}
}

// TestPolicyReadingsAgreeWithTheReference: on random paths and prefixes
// built of what upstreams read otherwise (capitals, escapes of separators
// and letters, ;, \, empty segments), UnderPrefix (whose fast path decides
// most requests without reading either otherwise) and Segment answer as
// their references, written from the rules rather than the code.
func TestPolicyReadingsAgreeWithTheReference(t *testing.T) {
	t.Parallel()
	parts := []string{"/", "/", "a", "b", "A", "%61", "%41", "%2F", "%5C", `\`, ";", ";x", "%3B", "ab", "%20", "-"}
	rng := rand.New(rand.NewPCG(23, 3))
	gen := func() string {
		var b strings.Builder
		b.WriteString("/")
		for range rng.IntN(8) {
			b.WriteString(parts[rng.IntN(len(parts))])
		}
		p, ok := Normalize(b.String())
		if !ok {
			return "/"
		}
		return p
	}
	for range 20_000 {
		path, prefix := gen(), gen()
		want := strings.HasPrefix(path, prefix) || strings.HasPrefix(looseOf(path), looseOf(prefix))
		if got := UnderPrefix(path, prefix); got != want {
			t.Fatalf("UnderPrefix(%q, %q) = %t, want %t", path, prefix, got, want)
		}
		for n := range 4 {
			split, okSplit := nthRef(keptCase(path, true), n)
			whole, okWhole := nthRef(keptCase(path, false), n)
			got, ok, err := Segment(nil, path, n)
			if ambiguous := okSplit != okWhole || split != whole; ambiguous != (err != nil) {
				t.Fatalf("Segment(%q, %d): error %v, want ambiguous %t (%q / %q)", path, n, err, ambiguous, split, whole)
			}
			if err == nil && (ok != okSplit || string(got) != split) {
				t.Fatalf("Segment(%q, %d) = %q, %t; want %q, %t", path, n, got, ok, split, okSplit)
			}
		}
	}
}

// keptCase is a path's segments as a lenient upstream that keeps case
// reads them: escapes decoded (with split, %2F, %5C and \ as /; without,
// they stay as sent in their segment), each segment without its
// ;parameter, the empty ones dropped.
func keptCase(path string, split bool) []string {
	if split {
		path = strings.ReplaceAll(path, `\`, "/")
	}
	decoded := escape.ReplaceAllStringFunc(path, func(e string) string {
		b, _ := hex.DecodeString(e[1:])
		if b[0] == '/' || b[0] == '\\' {
			if split {
				return "/"
			}
			return e
		}
		return string(b)
	})
	var kept []string
	for _, seg := range strings.Split(decoded, "/") {
		if seg, _, _ = strings.Cut(seg, ";"); seg != "" {
			kept = append(kept, seg)
		}
	}
	return kept
}

func nthRef(segs []string, n int) (string, bool) {
	if n < len(segs) {
		return segs[n], true
	}
	return "", false
}
