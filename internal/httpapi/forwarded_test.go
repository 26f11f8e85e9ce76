package httpapi

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
)

// TestSetForwardedAllocatesNothing: the forwarding headers of a proxied
// request are rewritten without an allocation, even behind a trusted proxy
// that sends several of them (the headers are those the last run set, plus
// the proxy's).
func TestSetForwardedAllocatesNothing(t *testing.T) {
	app := fiber.New(fiber.Config{EnableTrustedProxyCheck: true})
	var fc fasthttp.RequestCtx
	fc.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 4711}, nil)
	fc.Request.Header.SetHost("api.example")
	for _, kv := range [][2]string{{"X-Forwarded-For", "198.51.100.9"}, {"X-Forwarded-Host", "app.example"},
		{"X-Forwarded-Proto", "https"}, {"X-Forwarded-Port", "443"}, {"X-Real-Ip", "198.51.100.9"}} {
		fc.Request.Header.Add(kv[0], kv[1])
	}
	c := app.AcquireCtx(&fc)
	defer app.ReleaseCtx(c)
	g := httpx.NewGuard([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, time.Now, nil)
	setForwarded(c, g)
	h := &fc.Request.Header
	if got := [3]string{string(h.Peek("X-Forwarded-For")), string(h.Peek("X-Forwarded-Host")), string(h.Peek("X-Forwarded-Proto"))}; got != [3]string{"198.51.100.9", "app.example", "https"} {
		t.Fatalf("forwarded headers %q, want the client, the proxy's host and https", got)
	}
	if h.Peek("X-Real-Ip") != nil || h.Peek("X-Forwarded-Port") != nil {
		t.Errorf("X-Real-Ip %q, X-Forwarded-Port %q left for the upstream", h.Peek("X-Real-Ip"), h.Peek("X-Forwarded-Port"))
	}
	if n := testing.AllocsPerRun(100, func() {
		h.Add("X-Real-Ip", "198.51.100.9")
		setForwarded(c, g)
	}); n != 0 {
		t.Errorf("setForwarded allocates %.1f times per request, want 0", n)
	}
}
