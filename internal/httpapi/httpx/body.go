// Package httpx holds the HTTP helpers the api's handler packages share:
// bounded body reading and strict JSON decoding, problem+json errors, request
// IDs, bearer and idempotency-key parsing, the authentication-failure guard,
// and streamed JSON and CSV answers.
//
// It holds no handler and no product rule: only what the three parts of the
// HTTP layer share.
package httpx

import (
	"errors"
	"io"
	"net"
	"slices"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/bytebufferpool"

	"github.com/tollgate/tollgate/internal/quota"
)

// Request bodies are read where their sender is known. The server streams
// them (Fiber's StreamRequestBody): before the handler runs, fasthttp has
// read at most a few KiB of a body (httpapi's readAhead), whatever length
// the request announces, and the rest waits on the connection. A handler reads the body with ReadBody
// once it has checked the key, token or session that lets it: until then a
// connection costs the api a small, fixed amount, never the announced
// length. BodyGuard, in front of every route, refuses a body announced
// longer than the limit and closes a connection whose body was left unread,
// so that the next request on it is never read from the middle of a body.

// ReadBody reads the request's body whole, within limit bytes, growing its
// buffer as bytes arrive; from then on c.Body() is the body. A body past
// the limit is 413, and one that breaks off, or does not arrive within the
// read timeout, 400 or 408: each closes the connection, whose remaining
// bytes are unread. It does nothing when the body was read already (or
// there is none).
func ReadBody(c *fiber.Ctx, limit int) error {
	req := c.Request()
	if !req.IsBodyStream() {
		return nil
	}
	if req.Header.ContentLength() > limit {
		return tooLarge(c, limit)
	}
	buf := bytebufferpool.Get()
	defer bytebufferpool.Put(buf)
	stream := req.BodyStream()
	for {
		if len(buf.B) > limit {
			return tooLarge(c, limit)
		}
		if len(buf.B) == cap(buf.B) {
			buf.B = slices.Grow(buf.B, min(max(cap(buf.B), 4096), limit+1-len(buf.B)))
		}
		n, err := stream.Read(buf.B[len(buf.B):min(cap(buf.B), limit+1)])
		buf.B = buf.B[:len(buf.B)+n]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return brokenBody(c, err)
		}
	}
	if len(buf.B) > limit {
		return tooLarge(c, limit)
	}
	if n := req.Header.ContentLength(); n >= 0 && len(buf.B) != n {
		// fasthttp's stream ends at the connection's end as at the body's.
		return brokenBody(c, io.ErrUnexpectedEOF)
	}
	req.SetBody(buf.B) // a copy; the stream is closed
	if req.Header.ContentLength() < 0 {
		// A chunked body goes on (to an upstream) with its length.
		req.Header.SetContentLength(len(buf.B))
	}
	return nil
}

func brokenBody(c *fiber.Ctx, err error) error {
	c.Context().SetConnectionClose()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fiber.NewError(fiber.StatusRequestTimeout, "the request body did not arrive in time")
	}
	return quota.Errorf(quota.CodeInvalid, "the request body broke off before its end, or its chunks are malformed")
}

func tooLarge(c *fiber.Ctx, limit int) error {
	c.Context().SetConnectionClose()
	return quota.Errorf(quota.CodeTooLarge, "the request body is larger than the %d bytes this API takes", limit)
}

// PlainBody is ReadBody as a middleware, for a group of routes behind
// their authentication that read bodies themselves: it refuses one sent
// with a Content-Encoding, as DecodeJSON does.
func PlainBody(limit int) fiber.Handler {
	return func(c *fiber.Ctx) error {
		if err := plain(c); err != nil {
			return err
		}
		if err := ReadBody(c, limit); err != nil {
			return err
		}
		return c.Next()
	}
}

// plain refuses a body sent with a Content-Encoding (415) to the routes
// that read bodies: Fiber's c.Body() inflates one without bound (a few
// hundred KiB of gzip are gigabytes), and none of them takes one.
func plain(c *fiber.Ctx) error {
	if enc := c.Request().Header.ContentEncoding(); len(enc) > 0 && !strings.EqualFold(string(enc), "identity") {
		return quota.Errorf(quota.CodeUnsupported, "the body must be sent as is, without a Content-Encoding")
	}
	return nil
}

// BodyGuard goes in front of every route: a request that announces a body
// longer than limit is 413 before anything else runs, and a connection
// whose request body was not read (a refusal before authentication, a
// route that takes no body) is closed after the answer.
func BodyGuard(limit int) fiber.Handler {
	return func(c *fiber.Ctx) error {
		req := c.Request()
		if req.IsBodyStream() && req.Header.ContentLength() > limit {
			return tooLarge(c, limit)
		}
		err := c.Next()
		if req.IsBodyStream() && req.Header.ContentLength() != 0 {
			c.Context().SetConnectionClose()
		}
		return err
	}
}
