package httpapi

import (
	"bytes"
	"sync"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
)

// setForwarded writes the forwarding headers an upstream gets: the client's
// address (X-Forwarded-For), the host it asked for (X-Forwarded-Host) and
// its scheme (X-Forwarded-Proto), as the guard believes them: from the
// connection, or from a trusted proxy in front (TOLLGATE_TRUSTED_PROXIES).
// An upstream trusts Tollgate as its proxy, so every other header that
// states these facts, as the client wrote it, is removed first: Forwarded,
// X-Real-IP, the other X-Forwarded-* and the other spellings of the scheme
// (X-Url-Scheme, Front-End-Https), each also with '_' for '-' (a CGI-style
// upstream reads X_Forwarded_Host as X-Forwarded-Host). Call it before the
// Host header is rewritten for the upstream.
//
// It costs one pass over the header names and, once the pooled buffer
// has grown to fit, no allocation.
func setForwarded(c *fiber.Ctx, g *httpx.Guard) {
	h := &c.Request().Header
	// The values Tollgate believes, then the names of the headers to
	// remove (each followed by a NUL, which no header name holds), go in a
	// pooled buffer before anything is removed: the host may be read from
	// one of those headers, and fasthttp's setters keep no reference to
	// what they copy, but the compiler cannot tell.
	proto := g.Scheme(c)
	buf := forwardBufs.Get().(*[]byte)
	defer forwardBufs.Put(buf)
	b := g.ClientIP(c).AppendTo((*buf)[:0])
	nIP := len(b)
	b = append(b, g.HostBytes(c)...)
	nHost := len(b)
	h.VisitAll(func(k, _ []byte) {
		if isForwardingHeader(k) {
			b = append(append(b, k...), 0)
		}
	})
	*buf = b
	for names := b[nHost:]; len(names) > 0; {
		i := bytes.IndexByte(names, 0)
		h.DelBytes(names[:i])
		names = names[i+1:]
	}
	h.SetBytesV(fiber.HeaderXForwardedFor, b[:nIP])
	h.SetBytesV(fiber.HeaderXForwardedHost, b[nIP:nHost])
	h.Set(fiber.HeaderXForwardedProto, proto)
}

var forwardBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// isForwardingHeader reports whether the header named k states where a
// request came from or how, read case-insensitively and with '_' as '-'.
func isForwardingHeader(k []byte) bool {
	switch {
	case hasPrefixFold(k, "x-forwarded-"):
		return true
	case len(k) != len("forwarded") && len(k) != len("x-real-ip") && len(k) != len("x-url-scheme") && len(k) != len("front-end-https"):
		return false
	}
	return equalFold(k, "forwarded") || equalFold(k, "x-real-ip") || equalFold(k, "x-url-scheme") || equalFold(k, "front-end-https")
}

// equalFold compares a header name with a lowercase name, ASCII
// case-insensitively and with '_' read as '-'.
func equalFold(k []byte, name string) bool {
	return len(k) == len(name) && hasPrefixFold(k, name)
}

func hasPrefixFold(k []byte, prefix string) bool {
	if len(k) < len(prefix) {
		return false
	}
	for i := range len(prefix) {
		b := k[i]
		if b == '_' {
			b = '-'
		} else if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if b != prefix[i] {
			return false
		}
	}
	return true
}
