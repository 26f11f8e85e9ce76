package httpapi

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/admission"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/routes"
)

// Idempotency-Key on metered routes, after the IETF Idempotency-Key draft
// and Stripe's practice:
//
//   - the key is scoped to the tenant for 24 hours; the first request with it
//     is identified by its fingerprint: method, path and query as sent, and
//     the SHA-256 of its body as sent (encoded, if it came so);
//   - a repeat of the same request is answered with the first answer,
//     stored after it was sent: its status, the headers in replayHeaders and
//     the body up to admission.MaxReplayBody, marked Idempotent-Replayed: true; neither
//     the handler nor the upstream runs again and no quota is counted, but
//     the repeat still passes (and consumes) the burst limits, since it is
//     load all the same;
//   - a repeat while the first is still in flight is 409, to be retried;
//   - the same key with another method, path or body is 422;
//   - a first request that was refunded (an upstream 5xx on a refunding
//     route) releases its key: it did not happen, so a retry runs again;
//   - a first request whose node died before storing the answer holds the
//     key for the route's upstream timeout plus a margin (the lease); then a
//     retry runs again;
//   - a tenant's records take bounded room (quota.AnswerLimits): a new key
//     past it is 429 before it runs, consuming nothing, and a first
//     request holds room for the largest answer until its own is stored,
//     so that an admitted request always has room for its answer.

// leaseMargin is added to a route's timeout for the in-flight lease.
const leaseMargin = 30 * time.Second

// builtinLease is the lease of the built-in handlers' requests.
const builtinLease = 30 * time.Second

// replayHeaders are the answer headers stored and replayed: those that
// describe the representation. Hop-by-hop headers, cookies and the rate
// limit headers (recomputed for every answer) are never stored.
var replayHeaders = []string{
	fiber.HeaderContentType, fiber.HeaderContentEncoding, fiber.HeaderContentLanguage,
	fiber.HeaderContentDisposition, fiber.HeaderCacheControl, fiber.HeaderETag,
	fiber.HeaderLastModified, fiber.HeaderLocation, fiber.HeaderVary, fiber.HeaderExpires,
}

// fingerprint identifies a metered request for its idempotency key. The
// body is hashed as it came, the bytes the upstream gets: Fiber's c.Body()
// would inflate one sent with a Content-Encoding, without bound.
func fingerprint(c *fiber.Ctx) string {
	body := sha256.Sum256(c.Request().Body())
	h := sha256.New()
	h.Write(c.Request().Header.Method())
	h.Write([]byte{'\n'})
	h.Write(c.Request().RequestURI())
	h.Write([]byte{'\n'})
	h.Write(body[:])
	return hex.EncodeToString(h.Sum(nil))
}

// idempotent fills req's idempotency fields from the request's
// Idempotency-Key, if any.
func idempotent(c *fiber.Ctx, route *routes.Route, req *quota.Request) error {
	key, err := httpx.IdempotencyKey(c)
	if err != nil || key == "" {
		return err
	}
	req.IdempotencyKey = strings.Clone(key)
	req.IdempotencyFingerprint = fingerprint(c)
	// (the claim on the tenant's room, which storing or releasing the
	// answer settles)
	req.IdempotencyClaim = httpx.NewID()
	req.IdempotencyLease = builtinLease
	if route.UpstreamURL() != nil {
		req.IdempotencyLease = route.UpstreamTimeout() + leaseMargin
	}
	return nil
}

// idemRefusal answers a request its idempotency key decided: in flight,
// mismatched, or past the tenant's room for stored answers (with its
// Retry-After). It reports nil for any other decision.
func idemRefusal(c *fiber.Ctx, d quota.Decision) error {
	if d.Idem == quota.IdemLimit {
		c.Set(fiber.HeaderRetryAfter, strconv.FormatInt(max(1, quota.CeilSeconds(d.RetryAfter)), 10))
	}
	return admission.IdemError(d)
}

// replay answers a repeat with the first request's stored answer.
func (s *Server) replay(c *fiber.Ctx, req *quota.Request, d quota.Decision) error {
	a, err := s.adm.Replay(c.UserContext(), req)
	if err != nil {
		return err
	}
	setRateLimitHeaders(c, d)
	for _, line := range strings.Split(a.Header, "\n") {
		if name, value, ok := strings.Cut(line, ": "); ok {
			c.Set(name, value)
		}
	}
	confineAnswer(&c.Response().Header)
	c.Status(a.Status)
	return c.Send(a.Body)
}

// storeAnswer keeps the answer just made for the repeats of req: its
// status, the headers in replayHeaders and its body. It runs after the
// handler, whether or not the client is still there.
func (s *Server) storeAnswer(c *fiber.Ctx, req *quota.Request) {
	resp := c.Response()
	var hdr strings.Builder
	for _, name := range replayHeaders {
		if v := resp.Header.Peek(name); len(v) > 0 {
			hdr.WriteString(name)
			hdr.WriteString(": ")
			hdr.Write(v)
			hdr.WriteByte('\n')
		}
	}
	a := admission.Answer{Status: resp.StatusCode(), Header: hdr.String()}
	if resp.IsBodyStream() {
		// Only an upstream's answer past MaxReplayBody is left a stream
		// (forward); it is not read here, where it would be held whole.
		a.Streamed, a.Size = true, resp.Header.ContentLength()
	} else {
		a.Body = resp.Body()
	}
	s.adm.KeepAnswer(c.UserContext(), req, a)
}
