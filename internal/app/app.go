package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/config"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/telemetry"
)

// RunFunc is how a binary runs (RunAPI, RunWorker): until ctx ends,
// reading its configuration with getenv and writing its log lines to
// stdout. It returns nil after a graceful shutdown, and the error that
// stopped it otherwise.
type RunFunc func(ctx context.Context, getenv func(string) string, stdout io.Writer) error

// Main runs r as the process named name ("api", "worker") until SIGINT or
// SIGTERM, reading the process's environment and logging to its stdout, and
// returns the exit code: 0 once r returned nil; 1 after printing r's error
// to stderr, after name and a colon.
func Main(name string, r RunFunc) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := r(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	return 0
}

// base is what every binary starts with, open for as long as it serves.
type base struct {
	cfg    config.Config
	log    *slog.Logger
	traces *telemetry.Traces // nil without tracing; its methods allow it
	db     *pgxpool.Pool     // migrated
	rdb    redis.UniversalClient
}

// run is the binaries' common start-up: it loads the configuration, makes
// the logger, starts the traces of service, opens Postgres (migrating it)
// and Redis, then calls serve, which serves until ctx ends and shuts down.
// Once serve returns, Redis and Postgres close and the last spans are
// exported, in that order. An error before serve is returned as it is.
func run(ctx context.Context, service string, getenv func(string) string, stdout io.Writer,
	serve func(context.Context, *base) error) error {
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	log := cfg.NewLogger(stdout)
	traces, err := telemetry.Start(ctx, service, getenv)
	if err != nil {
		return err
	}
	if traces != nil {
		log.Info("traces on: exporting spans over OTLP/HTTP")
	}
	// The last spans are exported once everything else has stopped.
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), telemetry.ShutdownTimeout)
		defer cancel()
		if err := traces.Shutdown(sctx); err != nil {
			log.Warn("exporting the last spans failed", "err", err)
		}
	}()

	db, err := pgdb.OpenMigrated(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	rdb, err := redisdb.Open(ctx, cfg.Redis)
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()

	return serve(ctx, &base{cfg: cfg, log: log, traces: traces, db: db, rdb: rdb})
}
