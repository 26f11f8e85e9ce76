// Package envoy serves Tollgate's decisions to Envoy over gRPC: the rate
// limit service (envoy.service.ratelimit.v3.RateLimitService) and external
// authorization (envoy.service.auth.v3.Authorization) on one port, with the
// gRPC health service beside them.
//
// It translates Envoy's requests into asks of the decision core
// ((*httpapi.Server).Decide) and its decisions into Envoy's answers, the
// same status, headers and problem body a metered route would send. It
// does not decide anything itself, and touches quota state only through
// the decision core and the Gate's refund of a reservation.
package envoy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/internal/httpapi"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/telemetry"
)

// DefaultMeter is the meter of a rate limit descriptor without a meter
// entry, and of an ext_authz check without a meter context extension.
const DefaultMeter = "api"

// Bounds of what Envoy may send. A message over MaxRecvBytes is refused by
// gRPC itself (RESOURCE_EXHAUSTED); the others are refusals with a 400
// problem.
const (
	// MaxRecvBytes bounds one request message: a rate limit request, or
	// an ext_authz check with its headers (and body, when Envoy is told to
	// send it).
	MaxRecvBytes = 256 << 10
	// MaxDescriptors bounds the descriptors of one rate limit request.
	MaxDescriptors = 8
	// MaxEntries bounds the entries of one descriptor.
	MaxEntries = 16
	// MaxValue bounds an entry's key and value, and a context extension.
	MaxValue = 1024
	// MaxPath bounds the path a refusal names, as POST /v1/check does.
	MaxPath = 2048
)

// Decider decides asks: (*httpapi.Server).Decide.
type Decider interface {
	Decide(ctx context.Context, a httpapi.Ask) (httpapi.Decided, error)
}

// Refunder refunds a reserved admission whole: (*admission.Gate).RefundReserved.
type Refunder interface {
	RefundReserved(ctx context.Context, tenantID, requestID string) (quota.Settlement, error)
}

// Server serves the rate limit, ext_authz and health services on one
// gRPC server.
type Server struct {
	decide Decider
	refund Refunder
	log    *slog.Logger
	count  func(service, outcome string)
	grpc   *grpc.Server
	health *health.Server
}

// New returns a Server deciding through d and refunding through r, its
// health SERVING. count, when not nil, is told of every call: its service
// ("ratelimit", "ext_authz") and outcome ("ok", "refused", a refusal's
// error code such as "unauthorized", or "error" when not decided).
//
// tracer, when not nil (traces on), starts a server span for each call,
// continuing the trace of Envoy's traceparent metadata; the decision's
// spans and attributes (tenant, meter, decision) hang under it.
func New(d Decider, r Refunder, log *slog.Logger, count func(service, outcome string), tracer trace.Tracer) *Server {
	if count == nil {
		count = func(string, string) {}
	}
	s := &Server{decide: d, refund: r, log: log, count: count, health: health.NewServer()}
	var opts []grpc.ServerOption
	if tracer != nil {
		opts = append(opts, grpc.UnaryInterceptor(traced(tracer)))
	}
	s.grpc = grpc.NewServer(append(opts,
		grpc.MaxRecvMsgSize(MaxRecvBytes),
		grpc.MaxSendMsgSize(4<<20),
		grpc.MaxConcurrentStreams(1024),
		// Envoy keeps its connections open and may ping them.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)...)
	rlsv3.RegisterRateLimitServiceServer(s.grpc, rateLimitService{s})
	authv3.RegisterAuthorizationServer(s.grpc, authService{s})
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	for _, name := range []string{rlsv3.RateLimitService_ServiceDesc.ServiceName, authv3.Authorization_ServiceDesc.ServiceName} {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	return s
}

// Serve serves on ln until Shutdown; it returns nil after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// Shutdown answers NOT_SERVING to health checks, then stops gracefully:
// the calls in flight finish, within timeout, after which the connections
// still open are closed. It reports whether the graceful stop finished in
// time.
func (s *Server) Shutdown(timeout time.Duration) bool {
	s.health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		s.grpc.Stop()
		<-done
		return false
	}
}

// refundAll gives back the reservations of the admitted asks of a call
// refused as a whole. A refund runs to its end even when Envoy has hung up.
func (s *Server) refundAll(ctx context.Context, admitted []httpapi.Decided) {
	if len(admitted) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, d := range admitted {
		if d.RequestID == "" {
			s.log.Warn("an admitted descriptor of a refused rate limit call has no reservation to refund; its cost stands",
				"tenant_id", d.Principal.Tenant.ID, "meter", d.Request.Meter)
			continue
		}
		if _, err := s.refund.RefundReserved(ctx, d.Principal.Tenant.ID, d.RequestID); err != nil {
			s.log.Error("refunding an admitted descriptor of a refused rate limit call failed",
				"tenant_id", d.Principal.Tenant.ID, "request_id", d.RequestID, "err", err)
		}
	}
}

// cannotDecide reports whether err means Tollgate could not decide at all
// (a bug, Postgres away): the one case answered with a gRPC error, where
// Envoy's failure mode applies. Every other error is an answer: a refusal
// with its problem.
func cannotDecide(err error) bool {
	return quota.ErrorCode(err) == quota.CodeInternal
}

// traced is the interceptor of New's tracer: a server span per call, named
// by its full method, marked failed when the call answers a gRPC error.
func traced(tracer trace.Tracer) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		ctx, span := telemetry.StartServer(ctx, tracer, info.FullMethod, telemetry.MetadataCarrier(md),
			attribute.String("rpc.system", "grpc"), attribute.String("rpc.method", info.FullMethod))
		defer span.End()
		resp, err := handler(ctx, req)
		if err != nil {
			span.SetStatus(codes.Error, status.Code(err).String())
		}
		return resp, err
	}
}
