package app

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestRunRefusesBadConfigBeforeServing: a configuration error is returned
// as config.Load words it (naming the variable), and serve never runs.
func TestRunRefusesBadConfigBeforeServing(t *testing.T) {
	t.Parallel()
	served := false
	err := run(context.Background(), "tollgate-test", func(k string) string {
		return map[string]string{"TOLLGATE_RECONCILE_INTERVAL": "often"}[k]
	}, &strings.Builder{}, func(context.Context, *base) error {
		served = true
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "TOLLGATE_RECONCILE_INTERVAL") {
		t.Errorf("run = %v, want an error naming TOLLGATE_RECONCILE_INTERVAL", err)
	}
	if served {
		t.Error("serve ran with a bad configuration")
	}
}

// TestRunServesOnMigratedPostgresAndRedisThenClosesThem: serve gets the
// configuration, a logger writing to stdout, Postgres migrated from empty
// and a Redis that answers; run returns serve's error, and Postgres and
// Redis are closed once it has.
func TestRunServesOnMigratedPostgresAndRedisThenClosesThem(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"REDIS_URL":             testenv.RedisURL(t),
		"DATABASE_URL":          testenv.NewDatabase(t), // empty: run must migrate it
		"TOLLGATE_REDIS_PREFIX": "tg-app-run",
	}
	var logs strings.Builder
	served := errors.New("served")
	var got *base
	err := run(context.Background(), "tollgate-test", func(k string) string { return env[k] }, &logs,
		func(ctx context.Context, b *base) error {
			got = b
			if err := pgdb.SchemaCurrent(ctx, b.db); err != nil {
				t.Errorf("serve: schema %v, want current", err)
			}
			if err := b.rdb.Ping(ctx).Err(); err != nil {
				t.Errorf("serve: redis ping %v", err)
			}
			if b.cfg.RedisPrefix != "tg-app-run" {
				t.Errorf("serve: cfg.RedisPrefix %q, want the environment's", b.cfg.RedisPrefix)
			}
			b.log.Info("serving")
			return served
		})
	if !errors.Is(err, served) {
		t.Fatalf("run = %v, want serve's error", err)
	}
	if got == nil {
		t.Fatal("serve never ran")
	}
	if !strings.Contains(logs.String(), `"msg":"serving"`) {
		t.Errorf("the logger did not write to stdout: %q", logs.String())
	}
	if err := got.rdb.Ping(context.Background()).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("redis ping after run = %v, want %v", err, redis.ErrClosed)
	}
	if err := got.db.Ping(context.Background()); err == nil {
		t.Error("postgres ping after run succeeded, want the pool closed")
	}
}
