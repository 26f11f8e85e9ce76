package worker

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/app"
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
	// Stop the worker once it has run two cycles, however long it takes to
	// start on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	var out strings.Builder
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		cycles := 0
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), `"msg":"worker cycle"`) {
				if cycles++; cycles == 2 {
					cancel()
				}
			}
		}
	}()
	err := app.RunWorker(ctx, func(k string) string { return env[k] }, pw)
	pw.Close()
	<-scanned
	if err != nil {
		t.Fatalf("run = %v, want nil after its context ends", err)
	}
	if n := strings.Count(out.String(), `"msg":"worker cycle"`); n < 2 {
		t.Fatalf("%d cycles logged within 60 s, want ≥2:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), `"msg":"worker stopped"`) {
		t.Fatalf("no graceful stop logged:\n%s", out.String())
	}
}

func TestWorkerRefusesBadConfig(t *testing.T) {
	t.Parallel()
	err := app.RunWorker(context.Background(), func(k string) string {
		return map[string]string{"TOLLGATE_RECONCILE_INTERVAL": "often"}[k]
	}, &strings.Builder{})
	if err == nil || !strings.Contains(err.Error(), "TOLLGATE_RECONCILE_INTERVAL") {
		t.Fatalf("run = %v, want an error naming TOLLGATE_RECONCILE_INTERVAL", err)
	}
}
