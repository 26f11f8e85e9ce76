package httpapi

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// TestConfiningAnAnswerAllocatesNothing: what every proxied answer gets on
// its way (the cookie strip with no cookie to strip, the sandbox and
// nosniff) costs no allocation once the response's header storage holds
// them, as a reused server response's does. (Not parallel: AllocsPerRun
// counts the whole process.)
func TestConfiningAnAnswerAllocatesNothing(t *testing.T) {
	var h fasthttp.ResponseHeader
	answer := func() {
		h.Reset()
		h.SetContentType("text/html")
		h.Set("X-Upstream", "1")
		stripAnswerHeaders(&h, false)
		stripAnswerCookies(&h)
		confineAnswer(&h)
	}
	answer()
	if n := testing.AllocsPerRun(100, answer); n != 0 {
		t.Errorf("confining an answer: %.1f allocations, want 0", n)
	}
	if got := string(h.Peek("Content-Security-Policy")); got != "sandbox" {
		t.Errorf("Content-Security-Policy %q, want sandbox", got)
	}
	if got := string(h.Peek("X-Content-Type-Options")); got != "nosniff" {
		t.Errorf("X-Content-Type-Options %q, want nosniff", got)
	}
}
