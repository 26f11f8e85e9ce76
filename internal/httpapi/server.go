// Package httpapi is Tollgate's HTTP layer: the Fiber app, its middleware,
// every route (registered in routes) and the one mapping of errors to
// problem+json. Handlers are thin: parse, call the domain, encode.
package httpapi

import (
	"context"
	"log/slog"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/gofiber/fiber/v2/middleware/requestid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/postgres"
)

// Options are the settings the HTTP layer needs.
type Options struct {
	BodyLimit    int
	AdminToken   string
	ServiceToken string
}

// Server holds the Fiber app and what its handlers use.
type Server struct {
	app  *fiber.App
	log  *slog.Logger
	db   *pgxpool.Pool
	rdb  redis.UniversalClient
	opts Options
}

// New builds the Fiber app with every route registered.
func New(log *slog.Logger, db *pgxpool.Pool, rdb redis.UniversalClient, opts Options) *Server {
	s := &Server{log: log, db: db, rdb: rdb, opts: opts}
	s.app = fiber.New(fiber.Config{
		AppName:               "tollgate",
		BodyLimit:             opts.BodyLimit,
		DisableStartupMessage: true,
		ErrorHandler:          errorHandler(log),
		ReadTimeout:           30 * time.Second,
		WriteTimeout:          60 * time.Second,
		IdleTimeout:           120 * time.Second,
	})
	s.routes()
	return s
}

// App returns the Fiber app, for Listener and for tests' app.Test.
func (s *Server) App() *fiber.App { return s.app }

// routes registers every route of the service, in one place.
func (s *Server) routes() {
	s.app.Use(requestid.New(requestid.Config{ContextKey: localRequestID}))
	s.app.Use(accessLog(s.log))
	s.app.Use(recover.New())

	s.app.Get("/healthz", s.healthz)
	s.app.Get("/readyz", s.readyz)
}

func (s *Server) healthz(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"status": "ok"})
}

// readyz answers 200 only when Redis and Postgres answer and the schema is
// the one this binary expects.
func (s *Server) readyz(c *fiber.Ctx) error {
	ctx, cancel := context.WithTimeout(c.UserContext(), 2*time.Second)
	defer cancel()
	checks := fiber.Map{"redis": "ok", "postgres": "ok", "schema": "ok"}
	ready := true
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		checks["redis"], ready = err.Error(), false
	}
	if err := s.db.Ping(ctx); err != nil {
		checks["postgres"], ready = err.Error(), false
	} else if err := postgres.SchemaCurrent(ctx, s.db); err != nil {
		checks["schema"], ready = err.Error(), false
	}
	if !ready {
		return writeProblem(c, Problem{Status: fiber.StatusServiceUnavailable, Title: "Not Ready",
			Detail: "a dependency is not ready", Extra: map[string]any{"checks": checks}})
	}
	return c.JSON(fiber.Map{"status": "ready", "checks": checks})
}
