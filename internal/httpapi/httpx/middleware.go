package httpx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/netip"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// Request IDs. A request that brings an X-Request-ID keeps it (a proxy in
// front of us named it); any other gets <process>-<connection>-<request>:
// 16 hex digits drawn at random when the process starts, then, in hex,
// fasthttp's number of the connection (a process-wide counter) and the
// number of the request on that connection. That is unique within the
// process by construction and across processes by the random part, as a
// UUID would be, but costs nothing to make: the ID is never stored, only
// written into the response header and, when something logs it,
// formatted again from the same numbers.
var requestIDProcess = func() (p [16]byte) {
	var seed [8]byte
	_, _ = rand.Read(seed[:]) // crypto/rand.Read never fails
	hex.Encode(p[:], seed[:])
	return p
}()

// ProcessID is the random part of this process's request IDs, which every
// ID it generates starts with.
func ProcessID() string { return string(requestIDProcess[:]) }

var hdrRequestID = CanonicalHeader(fiber.HeaderXRequestID)

// requestIDBytes is room for the longest generated ID.
const requestIDBytes = len(requestIDProcess) + 2*(1+16)

func appendRequestID(dst []byte, ctx *fasthttp.RequestCtx) []byte {
	dst = append(dst, requestIDProcess[:]...)
	dst = append(dst, '-')
	dst = strconv.AppendUint(dst, ctx.ConnID(), 16)
	dst = append(dst, '-')
	return strconv.AppendUint(dst, ctx.ConnRequestNum(), 16)
}

// RequestIDs answers every request with its ID in X-Request-ID, set once
// the answer is made: a proxied answer replaces the response headers, and
// the ID can be made again at any time.
func RequestIDs(c *fiber.Ctx) error {
	err := c.Next()
	SetRequestID(c)
	return err
}

// SetRequestID sets the X-Request-ID header of c's response to the request's
// ID (RequestID), replacing any the answer carries.
func SetRequestID(c *fiber.Ctx) {
	var scratch [requestIDBytes]byte
	c.Response().Header.SetCanonical(hdrRequestID, AppendRequestIDOf(scratch[:0], c))
}

// RequestID returns the request's ID, for logging; what RequestIDs sent.
func RequestID(c *fiber.Ctx) string {
	var scratch [requestIDBytes]byte
	return string(AppendRequestIDOf(scratch[:0], c))
}

// AppendRequestIDOf appends the request's ID: the one it brought, or the
// one RequestIDs made for it.
func AppendRequestIDOf(dst []byte, c *fiber.Ctx) []byte {
	if rid := c.Request().Header.PeekBytes(hdrRequestID); len(rid) > 0 {
		return append(dst, rid...)
	}
	return appendRequestID(dst, c.Context())
}

// AccessLog logs one line per request at the edge, after the error handler
// has set the final status. When the logger would drop the line (a level
// above info, or above error for a 5xx), nothing of it is built.
func AccessLog(log *slog.Logger, clientIP func(*fiber.Ctx) netip.Addr) fiber.Handler {
	return func(c *fiber.Ctx) error {
		start := time.Now()
		err := c.Next()
		if err != nil {
			// Let the error handler write the answer now so the status is final.
			if herr := c.App().ErrorHandler(c, err); herr != nil {
				_ = c.SendStatus(fiber.StatusInternalServerError)
			}
		}
		status := c.Response().StatusCode()
		level := slog.LevelInfo
		if status >= 500 {
			level = slog.LevelError
		}
		ctx := c.UserContext()
		if !log.Enabled(ctx, level) {
			return nil
		}
		logRequest(ctx, log, level, c, status, time.Since(start), clientIP)
		return nil
	}
}

// logRequest writes the access log line; apart from AccessLog so that the
// attributes, which escape to the handler, cost nothing when it is off. The
// request ID and the client's address share one string: one allocation.
func logRequest(ctx context.Context, log *slog.Logger, level slog.Level, c *fiber.Ctx, status int,
	took time.Duration, clientIP func(*fiber.Ctx) netip.Addr) {
	var scratch [requestIDBytes + len("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")]byte
	b := AppendRequestIDOf(scratch[:0], c)
	n := len(b)
	if ip := clientIP(c); ip.IsValid() {
		b = ip.AppendTo(b)
	} else {
		b = append(b, "invalid IP"...) // what String says of it
	}
	both := string(b)
	log.LogAttrs(ctx, level, "request",
		slog.String("method", c.Method()),
		slog.String("path", c.Path()),
		slog.Int("status", status),
		slog.Float64("duration_ms", float64(took.Microseconds())/1000),
		slog.String("request_id", both[:n]),
		slog.String("remote_ip", both[n:]),
	)
}

// CanonicalHeader is name in the canonical form fasthttp stores, for the
// Set*Canonical calls that skip normalizing on every request.
func CanonicalHeader(name string) []byte { return fasthttp.AppendNormalizedHeaderKey(nil, name) }

// UniqueID returns an ID of the request that no other request of any node
// has, and that nobody can guess: 128 bits from crypto/rand, in 32 hex
// digits (never the client's X-Request-ID, which a client could repeat,
// nor the X-Request-ID made here, whose process prefix every answer of
// the node shows and whose counters follow one another). It names what
// another party could act on: a settle route's request (settled by its
// id), a concurrency policy's lease, a sliding log's entry. Each call
// makes a new one.
func UniqueID(*fiber.Ctx) string { return NewID() }

// NewID returns 128 random bits from crypto/rand in 32 hex digits.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	var h [32]byte
	hex.Encode(h[:], b[:])
	return string(h[:])
}
