package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
)

func TestWorkerRunsAndStopsGracefully(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"REDIS_URL":                    testenv.RedisURL(t),
		"DATABASE_URL":                 testenv.NewDatabase(t),
		"TOLLGATE_RECONCILE_INTERVAL":  "100ms",
		"TOLLGATE_LOG_LEVEL":           "debug",
		"TOLLGATE_WORKER_METRICS_ADDR": "127.0.0.1:0",
		"TOLLGATE_REDIS_PREFIX":        testenv.Prefix(t, testenv.Redis(t)),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, func(k string) string { return env[k] }, &out); err != nil {
		t.Fatalf("run = %v, want nil after its context ends", err)
	}
	if n := strings.Count(out.String(), `"msg":"worker cycle"`); n < 2 {
		t.Fatalf("%d cycles logged, want ≥2:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), `"msg":"worker stopped"`) {
		t.Fatalf("no graceful stop logged:\n%s", out.String())
	}
}

func TestWorkerRefusesBadConfig(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), func(k string) string {
		return map[string]string{"TOLLGATE_RECONCILE_INTERVAL": "often"}[k]
	}, &strings.Builder{})
	if err == nil || !strings.Contains(err.Error(), "TOLLGATE_RECONCILE_INTERVAL") {
		t.Fatalf("run = %v, want an error naming TOLLGATE_RECONCILE_INTERVAL", err)
	}
}
