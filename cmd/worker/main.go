// Command worker reconciles usage counted in Redis into Postgres and bills it.
// It is wiring only: configuration, connections and the loop of steps.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tollgate/tollgate/internal/config"
	"github.com/tollgate/tollgate/internal/postgres"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	log := cfg.NewLogger(stdout)

	db, err := postgres.OpenMigrated(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	rdb, err := redisdb.Open(ctx, cfg.Redis)
	if err != nil {
		return err
	}
	defer rdb.Close()

	loop := &worker.Loop{
		Interval: cfg.ReconcileInterval,
		Log:      log,
		Steps: []worker.Step{
			{Name: "ping", Run: func(ctx context.Context) error {
				if err := rdb.Ping(ctx).Err(); err != nil {
					return fmt.Errorf("redis: %w", err)
				}
				return db.Ping(ctx)
			}},
		},
	}
	log.Info("worker started", "interval", cfg.ReconcileInterval.String())
	err = loop.Run(ctx)
	log.Info("worker stopped")
	return err
}
