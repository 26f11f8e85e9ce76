package app

import (
	"fmt"
	"log/slog"
	"net"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/internal/envoy"
	"github.com/tollgate/tollgate/internal/httpapi"
)

// grpcListener serves the gRPC services for Envoy (internal/envoy) on
// TOLLGATE_GRPC_ADDR, when it is set.
type grpcListener struct {
	srv  *envoy.Server
	addr string     // the bound address; empty without a listener
	done chan error // Serve's end
}

// serveGRPC listens on addr and serves the Envoy services there, deciding
// through d, refunding through r and counting the calls in metrics; with
// no addr it serves nothing, and
// its failed channel never delivers.
func serveGRPC(addr string, d envoy.Decider, r envoy.Refunder, metrics *httpapi.Metrics, log *slog.Logger, tracer trace.Tracer) (*grpcListener, error) {
	g := &grpcListener{}
	if addr == "" {
		return g, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("TOLLGATE_GRPC_ADDR: listen %s: %w", addr, err)
	}
	count := func(service, outcome string) { metrics.Envoy.WithLabelValues(service, outcome).Inc() }
	g.srv, g.addr, g.done = envoy.New(d, r, log, count, tracer), ln.Addr().String(), make(chan error, 1)
	go func() { g.done <- g.srv.Serve(ln) }()
	return g, nil
}

// failed delivers the error Serve stopped with before shutdown; nil (blocks
// forever) without a listener.
func (g *grpcListener) failed() <-chan error { return g.done }

// shutdown stops the services gracefully within timeout, and waits for
// Serve to return.
func (g *grpcListener) shutdown(timeout time.Duration, log *slog.Logger) error {
	if g.done == nil {
		return nil
	}
	if !g.srv.Shutdown(timeout) {
		log.Warn("grpc shutdown timed out; closed the calls still open")
	}
	if err := <-g.done; err != nil {
		return fmt.Errorf("api: grpc listener: %w", err)
	}
	return nil
}
