package httpapi

import (
	"sync"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
)

// setForwarded strips the request's headers for the upstream
// (stripRequestHeaders) and writes the forwarding headers it gets: the
// client's address (X-Forwarded-For), the host it asked for
// (X-Forwarded-Host) and its scheme (X-Forwarded-Proto), as the guard
// believes them: from the connection, or from a trusted proxy in front
// (TOLLGATE_TRUSTED_PROXIES). An upstream trusts Tollgate as its proxy, so
// every other header that states these facts, as the client wrote it, is
// among those stripped (forwardingHeader). Call it before the Host header is
// rewritten for the upstream.
//
// It costs the strip's visit of the header names and, once the pooled
// buffer has grown to fit, no allocation.
func setForwarded(c *fiber.Ctx, g *httpx.Guard) {
	h := &c.Request().Header
	// The values Tollgate believes go in a pooled buffer before anything
	// is removed: the host may be read from one of the headers stripped.
	proto := g.Scheme(c)
	buf := forwardBufs.Get().(*[]byte)
	defer forwardBufs.Put(buf)
	b := g.ClientIP(c).AppendTo((*buf)[:0])
	nIP := len(b)
	b = append(b, g.HostBytes(c)...)
	*buf = b
	stripRequestHeaders(h)
	h.SetBytesV(fiber.HeaderXForwardedFor, b[:nIP])
	h.SetBytesV(fiber.HeaderXForwardedHost, b[nIP:])
	h.Set(fiber.HeaderXForwardedProto, proto)
}

var forwardBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// forwardingHeaders are the headers, besides X-Forwarded-*, that state
// where a request came from or how.
var forwardingHeaders = []string{"forwarded", "x-real-ip", "x-url-scheme", "front-end-https"}

// forwardingHeader reports whether the header named k states where a
// request came from or how, read case-insensitively and with '_' as '-'.
func forwardingHeader(k []byte) bool {
	return headerHasPrefix(k, "x-forwarded-") || headerIsOneOf(k, forwardingHeaders)
}
