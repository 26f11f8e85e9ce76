package httpapi

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate/tollgate/internal/httpapi/connlimit"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
)

// Operations: /healthz, /readyz and /metrics. By default they are served
// with everything else. With an operations listener (Options.Ops, for
// TOLLGATE_OPS_ADDR) the metrics and the readiness checks, which name the
// dependencies and their errors (addresses, schema versions), are served
// there only; the public listener keeps /healthz and a /readyz that says
// ready or not and nothing more, for a load balancer's probe.

// newOpsApp builds the operations listener's app. It logs no access: a
// scraper's requests every few seconds would drown the log.
func newOpsApp(log *slog.Logger) *fiber.App {
	app := fiber.New(fiber.Config{
		AppName:               "tollgate-ops",
		DisableStartupMessage: true,
		ErrorHandler:          httpx.ErrorHandler(log, nil, nil),
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           120 * time.Second,
	})
	app.Server().CloseOnShutdown = true
	app.Use(recover.New())
	return app
}

// OpsApp returns the operations listener's app, nil without Options.Ops.
func (s *Server) OpsApp() *fiber.App { return s.ops }

// maxOpsConns caps the operations listener's connections: its clients are
// a few scrapers and probes.
const maxOpsConns = 64

// ServeOps serves the operations app on ln until ShutdownOps; it must not
// be called without Options.Ops. The listener goes through connlimit, as
// the public one does, so that a shortage of file descriptors in the
// process pauses it instead of stopping it for good.
func (s *Server) ServeOps(ln net.Listener) error {
	l := connlimit.New(ln, connlimit.Config{Max: maxOpsConns, Log: s.log})
	s.ops.Server().ConnState = l.ConnState
	return s.ops.Listener(l)
}

// ShutdownOps stops the operations app within timeout.
func (s *Server) ShutdownOps(timeout time.Duration) error {
	return s.ops.ShutdownWithTimeout(timeout)
}

// opsRoutes registers the operations routes, on the public app or split
// with the operations app.
func (s *Server) opsRoutes() {
	metrics := adaptor.HTTPHandler(promhttp.HandlerFor(s.metrics.Registry, promhttp.HandlerOpts{}))
	s.app.Get("/healthz", s.healthz)
	if s.ops == nil {
		s.app.Get("/readyz", s.readyz)
		s.app.Get("/metrics", metrics)
		return
	}
	s.app.Get("/readyz", s.readyzStatus)
	s.ops.Get("/healthz", s.healthz)
	s.ops.Get("/readyz", s.readyz)
	s.ops.Get("/metrics", metrics)
}

func (s *Server) healthz(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"status": "ok"})
}

// readyz answers 200 only when every dependency is ready (for the api:
// Redis and Postgres answer and the schema is the one this binary expects),
// with each check's outcome.
func (s *Server) readyz(c *fiber.Ctx) error {
	checks, ready := s.readiness(c)
	if !ready {
		return httpx.WriteProblem(c, httpx.Problem{Status: fiber.StatusServiceUnavailable, Title: "Not Ready",
			Detail: "a dependency is not ready", Extra: map[string]any{"checks": checks}})
	}
	return c.JSON(fiber.Map{"status": "ready", "checks": checks})
}

// readyzStatus is readyz without the checks: the public listener's when an
// operations listener has them.
func (s *Server) readyzStatus(c *fiber.Ctx) error {
	if _, ready := s.readiness(c); !ready {
		return httpx.WriteProblem(c, httpx.Problem{Status: fiber.StatusServiceUnavailable, Title: "Not Ready",
			Detail: "a dependency is not ready"})
	}
	return c.JSON(fiber.Map{"status": "ready"})
}

// readiness runs every ready check, within 2 s in all, and reports each
// one's outcome ("ok" or its error) and whether all passed.
func (s *Server) readiness(c *fiber.Ctx) (fiber.Map, bool) {
	ctx, cancel := context.WithTimeout(c.UserContext(), 2*time.Second)
	defer cancel()
	checks := fiber.Map{}
	ready := true
	for _, r := range s.ready {
		checks[r.Name] = "ok"
		if err := r.Check(ctx); err != nil {
			checks[r.Name], ready = err.Error(), false
		}
	}
	return checks, ready
}
