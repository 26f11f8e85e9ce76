package httpapi

import (
	"context"
	"strconv"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/utils"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/internal/routes"
	"github.com/tollgate/tollgate/internal/telemetry"
)

// Traces (OpenTelemetry, when Deps.Tracer is set): a server span for each
// metered request and each call of the decision API, the admission as its
// child, and a client span for the proxied call of the upstream, which
// gets the trace in its traceparent. With no tracer, none of this runs:
// every entry tests s.tracer first, and traced does not wrap the handler.
//
// No span carries an API key, a token, a query string or a body: tenants
// are named by id, requests by path.

// The semantic conventions' HTTP attributes.
const (
	attrMethod     = attribute.Key("http.request.method")
	attrStatus     = attribute.Key("http.response.status_code")
	attrRoute      = attribute.Key("http.route")
	attrPath       = attribute.Key("url.path")
	attrScheme     = attribute.Key("url.scheme")
	attrClient     = attribute.Key("client.address")
	attrServer     = attribute.Key("server.address")
	attrServerPort = attribute.Key("server.port")
)

// traced wraps h in a server span when tracing is on (h itself otherwise):
// the caller's trace continued from its traceparent, named for the method
// and route, ended once the answer is made (the error handler answers an
// error here, as AccessLog does, so that the span has the final status).
func (s *Server) traced(h fiber.Handler) fiber.Handler {
	if s.tracer == nil {
		return h
	}
	return func(c *fiber.Ctx) error {
		route, method := c.Route().Path, methodOf(c)
		ctx, span := telemetry.StartServer(c.UserContext(), s.tracer, method+" "+route, requestCarrier{&c.Request().Header},
			attrMethod.String(method), attrRoute.String(route),
			attrPath.String(utils.CopyString(c.Path())), attrScheme.String(s.guard.Scheme(c)),
			attrClient.String(s.guard.ClientIP(c).String()))
		defer span.End() // (also when h panics: recover is outside)
		c.SetUserContext(ctx)
		if err := h(c); err != nil {
			if herr := c.App().ErrorHandler(c, err); herr != nil {
				_ = c.SendStatus(fiber.StatusInternalServerError)
			}
		}
		status := c.Response().StatusCode()
		span.SetAttributes(attrStatus.Int(status))
		if status >= 500 {
			span.SetStatus(codes.Error, "")
		}
		return nil
	}
}

// traceMetered names a metered request's span for its route and tenant.
func traceMetered(c *fiber.Ctx, route *routes.Route, tenantID string) {
	span := trace.SpanFromContext(c.UserContext())
	span.SetName(methodOf(c) + " " + route.Path)
	span.SetAttributes(attrRoute.String(route.Path), telemetry.TenantID.String(tenantID),
		telemetry.Meter.String(route.Meter), telemetry.Cost.Int64(route.Cost))
}

// startUpstream starts the client span of a proxied call and puts its
// traceparent on the request to the upstream (replacing any the client
// sent, with its tracestate).
func (s *Server) startUpstream(c *fiber.Ctx, route *routes.Route, h *fasthttp.RequestHeader) trace.Span {
	u := route.UpstreamURL()
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	n, _ := strconv.Atoi(port)
	method := methodOf(c)
	ctx, span := s.tracer.Start(c.UserContext(), method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrMethod.String(method), attrServer.String(u.Hostname()), attrServerPort.Int(n),
			telemetry.Meter.String(route.Meter)))
	h.Del("Tracestate")
	telemetry.Propagator.Inject(ctx, requestCarrier{h})
	return span
}

// endUpstream ends the client span of a proxied call: the upstream's
// status when it answered, the error when it did not.
func endUpstream(span trace.Span, status int, err error) {
	if err != nil {
		span.SetStatus(codes.Error, "upstream failed")
		span.RecordError(err)
	} else {
		span.SetAttributes(attrStatus.Int(status))
		if status >= 500 {
			span.SetStatus(codes.Error, "")
		}
	}
	span.End()
}

// traceRef records on the span of ctx the tenant and request id a call of
// /v1/settle, /v1/refund or /v1/release names.
func (s *Server) traceRef(ctx context.Context, tenantID, requestID string) {
	if s.tracer == nil {
		return
	}
	trace.SpanFromContext(ctx).SetAttributes(telemetry.TenantID.String(utils.CopyString(tenantID)),
		telemetry.RequestID.String(utils.CopyString(requestID)))
}

// methodOf is the request's method as a span may keep it: c.Method() is
// fasthttp's buffer, reused by the next request. A method not of HTTP's
// is "_OTHER", as the semantic conventions name it.
func methodOf(c *fiber.Ctx) string {
	switch m := c.Method(); m {
	case fiber.MethodGet:
		return fiber.MethodGet
	case fiber.MethodHead:
		return fiber.MethodHead
	case fiber.MethodPost:
		return fiber.MethodPost
	case fiber.MethodPut:
		return fiber.MethodPut
	case fiber.MethodPatch:
		return fiber.MethodPatch
	case fiber.MethodDelete:
		return fiber.MethodDelete
	case fiber.MethodOptions:
		return fiber.MethodOptions
	case fiber.MethodConnect:
		return fiber.MethodConnect
	case fiber.MethodTrace:
		return fiber.MethodTrace
	}
	return "_OTHER"
}

// requestCarrier is a fasthttp request header as a propagation carrier.
type requestCarrier struct{ h *fasthttp.RequestHeader }

func (r requestCarrier) Get(key string) string { return string(r.h.Peek(key)) }
func (r requestCarrier) Set(key, value string) { r.h.Set(key, value) }
func (r requestCarrier) Keys() []string {
	var keys []string
	r.h.VisitAll(func(k, _ []byte) { keys = append(keys, string(k)) })
	return keys
}
