package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/utils"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/internal/admission"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/routes"
)

// metered serves every route under /api/: the tenant's key resolved (from
// the cache), one admission for the matched route, the quota headers on
// every answer, then the built-in handler or the upstream. It authenticates
// itself rather than behind tenantAuth, so that the principal stays a local
// value instead of an allocation in the context's locals.
func (s *Server) metered(c *fiber.Ctx) error {
	p, err := s.authenticate(c)
	if err != nil {
		return err
	}
	route, err := s.resolveRoute(c)
	if err != nil {
		return err
	}
	if s.tracer != nil {
		traceMetered(c, route, p.Tenant.ID)
	}
	if !oneContentLength(&c.Request().Header) {
		c.Context().SetConnectionClose() // where the request ends is unknown
		return quota.FieldError("Content-Length", "must be stated once: two different lengths leave the end of the request unknown")
	}
	if err := httpx.ReadBody(c, s.bodyLimit); err != nil { // now that the key is known
		return err
	}
	req := quota.Request{
		TenantID: p.Tenant.ID, Meter: route.Meter, Cost: route.Cost, Limits: p.Limits,
		Overage: p.Tier.Overage, OveragePriceCentsPer1K: p.Tier.OveragePriceCentsPer1K, FailOpen: p.Tier.FailOpen,
		MeterQuotas: p.Tier.MeterQuotas, Calendar: p.Calendar,
	}
	if err := idempotent(c, route, &req); err != nil {
		return err
	}
	calls, err := s.policyCalls(c, p, route)
	if err != nil {
		return err
	}
	ctx := c.UserContext()
	var watch *hangupWatch
	if len(calls) > 0 {
		req.Policies, req.RequestID = calls, httpx.UniqueID(c)
		if mayWait(calls) {
			ctx, watch = untilHangup(c)
			defer watch.finish()
		}
	}
	start := time.Now()
	d, err := s.adm.Admit(ctx, &p, &req)
	s.metrics.Admission.Observe(time.Since(start).Seconds())
	if err != nil {
		s.count(c, route, "unavailable", p.Tier.Slug, d)
		return err
	}
	if len(d.Policies) > 0 {
		s.countPolicies(d)
	}
	if err := idemRefusal(c, d); err != nil {
		s.count(c, route, admission.Outcome(d), p.Tier.Slug, d)
		return err
	}
	if d.Fallback != nil {
		s.count(c, route, "degraded", p.Tier.Slug, d)
		setRateLimitHeaders(c, d)
		return writeFallback(c, d)
	}
	if !d.Allowed {
		s.count(c, route, "refused", p.Tier.Slug, d)
		setRateLimitHeaders(c, d)
		if refusedForCredit(d) {
			return writeCreditRefusal(c, d, p.Tier.TopUpURL, c.Path())
		}
		return writeRefusal(c, refusalProblem(d, p.RefusalUpgrade(&d), c.Path()))
	}
	if d.Replayed() {
		// (nothing to release: a replay holds no lease or place in flight,
		// Gate.Admit gave back what its policies took)
		s.count(c, route, "replayed", p.Tier.Slug, d)
		return s.replay(c, &req, d)
	}
	s.count(c, route, "allowed", p.Tier.Slug, d)
	if len(d.Policies) > 0 {
		defer s.adm.Release(c.UserContext(), &req, &d)
		waitDelay(ctx, d)
		if ctx.Err() != nil {
			// The client hung up while its request waited: it ran nothing
			// and has no answer to store, so its key is given back (a
			// retry runs), as when a handler fails before answering.
			s.adm.Finish(c.UserContext(), &req, &d, false, false)
			return ctx.Err()
		}
		watch.end() // it waits no more
	}

	// A settle route reserves the admission for settling (one more Redis
	// round trip, for those routes only) under a random id (UniqueID), which
	// the upstream gets and the client is answered in Tollgate-Request-Id.
	settleID := ""
	if route.Settle {
		// (a fail-open admission is reserved on this node: Gate.Reserve)
		if id := httpx.UniqueID(c); s.adm.Reserve(c.UserContext(), id, &req, &d) {
			settleID = id
		}
	}
	failed := false // what refund_on_5xx gives back: the upstream did not do the work
	if route.UpstreamURL() != nil {
		// An answer stored for idempotent repeats is read whole when it
		// fits admission.MaxReplayBody.
		failed, err = s.forward(c, route, p.Tenant.ID, settleID, req.IdempotencyKey != "" && !d.Degraded)
	} else {
		err = s.builtin(c, route, p.Tenant.ID, p.Tier.Slug, d)
	}
	// Proxying replaces the response headers, so the quota headers go last.
	setRateLimitHeaders(c, d)
	if settleID != "" {
		s.settleFromHeader(c, p.Tenant.ID, route, settleID, err)
	}
	switch s.adm.Finish(c.UserContext(), &req, &d, route.RefundOn5xx && (err != nil || failed), err == nil) {
	case admission.AfterRefunded:
		c.Set("Tollgate-Refunded", httpx.Itoa(route.Cost))
	case admission.AfterKeepAnswer:
		s.storeAnswer(c, &req)
	}
	return err
}

// mayWait reports whether a request of these policies may wait before it
// proceeds: one of them queues its refusals.
func mayWait(calls []quota.PolicyCall) bool {
	for _, c := range calls {
		if c.Policy.OnRefuse == quota.RefuseQueue {
			return true
		}
	}
	return false
}

// count counts a metered request's outcome, and records it on its span.
func (s *Server) count(c *fiber.Ctx, r *routes.Route, outcome, tier string, d quota.Decision) {
	s.metrics.request(r.Meter, outcome, tier).Inc()
	if s.tracer != nil {
		admission.TraceOutcome(c.UserContext(), outcome, d)
	}
}

// forward proxies the request to the route's upstream and makes its answer
// the client's, the body streamed (proxybody.go). The tenant's key is not
// forwarded; the upstream learns the tenant from X-Tollgate-Tenant-Id, and a
// settle route's request id from Tollgate-Request-Id (settleID, when
// reserved), after every header of a client's that would pass for one of
// these is removed (proxyheaders.go). whole reads an answer that fits
// MaxReplayBody whole, so that it can be stored for idempotent repeats; a
// longer one stays a stream, which storeAnswer records as too large.
//
// failed reports that the upstream did not do the work, as far as the
// proxy knows: it did not answer at all (upstreamFailure), or answered
// 5xx. An answer the proxy could not read or pass on is not a failure of
// the upstream's: it answered.
func (s *Server) forward(c *fiber.Ctx, route *routes.Route, tenantID, settleID string, whole bool) (failed bool, err error) {
	target := proxyTarget(c, route) // before the request URI is rewritten
	req := c.Request()
	h := &req.Header
	setForwarded(c, s.guard) // strips the client's headers first
	h.Set("X-Tollgate-Tenant-Id", tenantID)
	if settleID != "" {
		h.Set(hdrSettleID, settleID)
	}
	h.SetHost(route.UpstreamURL().Host)

	// The request itself goes upstream, its URI replaced for the exchange
	// (as Fiber's proxy middleware does): the client's URI is restored
	// after it, for the access log and the answers that name the path.
	original := utils.CopyString(c.OriginalURL())
	req.SetRequestURI(target)
	req.URI().SetScheme(route.UpstreamURL().Scheme)
	var span trace.Span
	if s.tracer != nil {
		span = s.startUpstream(c, route, h)
	}
	up := fasthttp.AcquireResponse()
	err = s.upstream.DoTimeout(req, up, route.UpstreamTimeout())
	req.SetRequestURI(original)
	// The upstream's status, when its header was read (200 when it was
	// not: fasthttp's default, never 5xx).
	upStatus := up.StatusCode()
	if span != nil {
		endUpstream(span, upStatus, err)
	}
	if err == nil {
		err = s.answer(c, up, route, settleID != "", whole)
	} else {
		fasthttp.ReleaseResponse(up)
	}
	if err == nil {
		return upStatus >= 500, nil
	}
	c.Response().Reset()
	status, detail, answered := upstreamFailure(err)
	s.log.Warn("upstream failed", "meter", route.Meter, "answered", answered, "err", err)
	return !answered || upStatus >= 500, httpx.WriteProblem(c, httpx.Problem{Status: status, Detail: detail, Instance: c.Path()})
}

// upstreamFailure is the client's answer to an exchange with the upstream
// that failed, and whether the upstream answered: sent at least the start
// of an answer, which the proxy could not read whole or would not pass on
// (headers past the limit, a body past the maximum, an answer that broke
// off). A refund_on_5xx route refunds the requests whose upstream did not
// answer: it could not be dialled, the request could not be sent, the
// connection closed or the timeout passed before a byte of answer came. An
// error of no known kind counts as no answer.
func upstreamFailure(err error) (status int, detail string, answered bool) {
	var small *fasthttp.ErrSmallBuffer
	// fasthttp reports a failure to read the first byte of an answer as
	// io.EOF (ErrConnectionClosed) or ErrTimeout: a read error comes after.
	var op *net.OpError
	read := errors.As(err, &op) && op.Op == "read"
	switch {
	case errors.As(err, &small):
		return fiber.StatusBadGateway, "the upstream's answer could not be read: its headers are larger than this API reads", true
	case errors.Is(err, fasthttp.ErrBodyTooLarge), errors.Is(err, errAnswerTooLarge):
		return fiber.StatusBadGateway, "the upstream's answer is larger than this API passes on", true
	case read && op.Timeout():
		return fiber.StatusGatewayTimeout, "the upstream's answer did not arrive in time", true
	case read, errors.Is(err, errAnswerBroken), errors.Is(err, io.ErrUnexpectedEOF):
		return fiber.StatusBadGateway, "the upstream's answer broke off", true
	case errors.Is(err, fasthttp.ErrTimeout):
		return fiber.StatusGatewayTimeout, "the upstream did not answer in time", false
	}
	return fiber.StatusBadGateway, "the upstream could not be reached", false
}

// errAnswerBroken: the upstream's answer ended before its body did, while
// it was read ahead.
var errAnswerBroken = errors.New("httpapi: the upstream's answer broke off")

// answer makes the upstream's answer up the client's: its status and
// headers (less those of proxyheaders.go and Server), and its body, moved
// when fasthttp read it whole, streamed otherwise. It takes up over: up is
// released here, or by the body's Close once the server has sent it.
func (s *Server) answer(c *fiber.Ctx, up *fasthttp.Response, route *routes.Route, settling, whole bool) error {
	resp := c.Response()
	size := int64(up.Header.ContentLength()) // -1: chunked
	if s.opts.MaxResponseBytes > 0 && size > s.opts.MaxResponseBytes && !c.Request().Header.IsHead() {
		closeUnread(up)
		return errAnswerTooLarge
	}
	stream := up.BodyStream()
	if stream != nil && size >= 0 && size <= bufferedAnswer {
		// fasthttp read this one whole; Body takes it from the stream and
		// gives the connection back.
		_ = up.Body()
		stream = nil
	}
	var prefix *bytebufferpool.ByteBuffer
	if stream != nil && whole && size < 0 {
		// A chunked answer may still fit: read ahead to know. (One of
		// known length past MaxReplayBody is stored as too large unread.)
		prefix = bytebufferpool.Get()
		n, rerr := io.CopyN(prefix, stream, admission.MaxReplayBody+1)
		switch {
		case rerr != nil && !errors.Is(rerr, io.EOF):
			bytebufferpool.Put(prefix)
			closeUnread(up)
			return fmt.Errorf("%w: %w", errAnswerBroken, rerr)
		case s.opts.MaxResponseBytes > 0 && n > s.opts.MaxResponseBytes:
			bytebufferpool.Put(prefix)
			closeUnread(up)
			return errAnswerTooLarge
		case n <= admission.MaxReplayBody:
			// Whole: the stream is at its end.
			_ = up.CloseBodyStream()
			up.SwapBody(prefix.B)
			prefix.B = nil
			bytebufferpool.Put(prefix)
			prefix, stream = nil, nil
		}
	}
	up.Header.CopyTo(&resp.Header)
	resp.Header.ResetConnectionClose() // the upstream's connection's, not the client's
	resp.Header.Del(fiber.HeaderServer)
	stripAnswerHeaders(&resp.Header, settling)
	stripAnswerCookies(&resp.Header)
	confineAnswer(&resp.Header)
	if stream == nil {
		// The body is in up's buffer: swap it into the response's, no copy.
		resp.SwapBody(up.SwapBody(resp.SwapBody(nil)))
		fasthttp.ReleaseResponse(up)
		return nil
	}
	// (A prefix is read ahead of chunked answers only: size is -1 then.)
	b := &upstreamBody{up: up, r: stream, prefix: prefix, size: size, left: -1, log: s.log, meter: route.Meter}
	if s.opts.MaxResponseBytes > 0 {
		b.left = s.opts.MaxResponseBytes
		if prefix != nil {
			b.left -= int64(len(prefix.B))
		}
	}
	resp.SetBodyStream(b, int(size))
	return nil
}

// closeUnread ends an upstream answer whose body is not read: its
// connection is closed, not pooled with the rest of the answer on it.
func closeUnread(up *fasthttp.Response) {
	up.SetConnectionClose()
	_ = up.CloseBodyStream()
	fasthttp.ReleaseResponse(up)
}

// builtin serves the demo handlers, so a fresh install has something to
// call. Their bodies are written by hand-made encoders (jsonappend.go): the
// same JSON as encoding/json would write for them, without reflection.
func (s *Server) builtin(c *fiber.Ctx, route *routes.Route, tenantID, tier string, d quota.Decision) error {
	var scratch [builtinBytes]byte
	var b []byte
	switch route.Handler {
	case routes.HandlerEcho:
		b = echoBody{
			tenantID: tenantID, tier: tier, method: c.Method(), path: c.Path(),
			query: c.Request().URI().QueryString(), meter: route.Meter, cost: route.Cost, time: d.Now,
		}.appendJSON(scratch[:0])
	case routes.HandlerReport:
		c.Status(fiber.StatusCreated)
		b = reportBody{tenantID: tenantID, now: d.Now}.appendJSON(scratch[:0])
	default:
		return fmt.Errorf("httpapi: route %s has no handler", route.Path)
	}
	c.Response().Header.SetContentType(fiber.MIMEApplicationJSON)
	c.Response().SetBody(b)
	return nil
}

// hdrSettleID carries the id of a settle route's request: to the upstream,
// and back to the client (X-Request-ID may be one a client sent).
const (
	hdrSettleID   = "Tollgate-Request-Id"
	hdrActualCost = "Tollgate-Actual-Cost"
)

// settleFromHeader settles a settle route's request to the cost its
// upstream reported in Tollgate-Actual-Cost, if it did: a non-negative
// integer up to quota.MaxQuantity; anything else is logged and ignored (the
// route cost stands until a POST /v1/settle, or for good). The header is not
// passed on to the client, which learns the outcome in
// Tollgate-Settled-Cost.
func (s *Server) settleFromHeader(c *fiber.Ctx, tenantID string, route *routes.Route, id string, ferr error) {
	c.Set(hdrSettleID, id)
	if ferr != nil {
		return
	}
	raw := c.Response().Header.Peek(hdrActualCost)
	if raw == nil {
		return
	}
	v := string(raw)
	c.Response().Header.Del(hdrActualCost)
	actual, perr := strconv.ParseInt(v, 10, 64)
	if perr != nil || actual < 0 || actual > quota.MaxQuantity || v[0] == '+' {
		s.log.Warn("ignoring a bad Tollgate-Actual-Cost; the route cost stands", "tenant_id", tenantID, "meter", route.Meter, "value", v)
		return
	}
	if s.adm.SettleByUpstream(c.UserContext(), tenantID, route.Meter, id, actual) {
		c.Set("Tollgate-Settled-Cost", httpx.Itoa(actual))
	}
}
