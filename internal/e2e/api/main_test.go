package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/app"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestMain lets a test re-run this binary as the real api command, so that
// the process's exit code and stderr can be checked.
func TestMain(m *testing.M) {
	if os.Getenv("TOLLGATE_TEST_RUN_MAIN") == "1" {
		os.Exit(app.Main("api", app.RunAPI))
	}
	os.Exit(m.Run())
}

// startAPI runs the api with env on port 0 and returns its base URL; the
// server is shut down gracefully at cleanup and run must return nil.
func startAPI(tb testing.TB, env map[string]string) string {
	tb.Helper()
	base, _ := startStoppableAPI(tb, env)
	return base
}

// startStoppableAPI is startAPI that also returns stop, which shuts the
// server down gracefully (at once; cleanup does it otherwise) and waits
// for run to return nil.
func startStoppableAPI(tb testing.TB, env map[string]string) (base string, stop func()) {
	tb.Helper()
	base, _, stop = startListeningAPI(tb, env)
	return base, stop
}

// startListeningAPI is startStoppableAPI that also returns the address of
// the gRPC listener ("" when TOLLGATE_GRPC_ADDR is unset).
func startListeningAPI(tb testing.TB, env map[string]string) (base, grpcAddr string, stop func()) {
	tb.Helper()
	env["TOLLGATE_ADDR"] = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	sink := &logSink{addr: make(chan string, 1)}
	done := make(chan error, 1)
	go func() { done <- app.RunAPI(ctx, func(k string) string { return env[k] }, sink) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("run returned %v after shutdown, want nil", err)
				}
			case <-time.After(15 * time.Second):
				tb.Error("run did not return within 15s of shutdown")
			}
		})
	}
	tb.Cleanup(stop)
	select {
	case a := <-sink.addr:
		return "http://" + a, sink.grpcAddr, stop
	case err := <-done:
		tb.Fatalf("run ended before listening: %v", err)
	case <-time.After(30 * time.Second):
		tb.Fatal("api did not listen within 30s")
	}
	return "", "", stop
}

// logSink takes the api's log lines (one Write each, from slog) and keeps
// only the address of the "listening" line: no pipe, and no line parsed
// but that one, so that benchmarks count none of it as the server's.
type logSink struct {
	addr     chan string
	grpcAddr string // the line's grpc_addr, set before addr delivers
	found    atomic.Bool
}

func (w *logSink) Write(p []byte) (int, error) {
	if !w.found.Load() && bytes.Contains(p, []byte(`"msg":"listening"`)) {
		var line struct {
			Addr     string
			GRPCAddr string `json:"grpc_addr"`
		}
		if json.Unmarshal(p, &line) == nil && line.Addr != "" {
			w.found.Store(true)
			w.grpcAddr = line.GRPCAddr
			w.addr <- line.Addr
		}
	}
	return len(p), nil
}

func TestRunServesHealthAndReadiness(t *testing.T) {
	t.Parallel()
	base := startAPI(t, map[string]string{
		"REDIS_URL":    testenv.RedisURL(t),
		"DATABASE_URL": testenv.NewDatabase(t), // empty: run must migrate it
	})
	for _, tc := range []struct {
		path        string
		status      int
		contentType string
	}{
		{"/healthz", 200, "application/json"},
		{"/readyz", 200, "application/json"},
		{"/no/such/route", 404, "application/problem+json"},
	} {
		resp, err := http.Get(base + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("GET %s: status %d, want %d (%s)", tc.path, resp.StatusCode, tc.status, body)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, tc.contentType) {
			t.Errorf("GET %s: Content-Type %q, want %q", tc.path, ct, tc.contentType)
		}
		if resp.Header.Get("X-Request-ID") == "" {
			t.Errorf("GET %s: no X-Request-ID", tc.path)
		}
	}
}

// TestMisconfigurationExitsNamingTheVariable runs the real process.
func TestMisconfigurationExitsNamingTheVariable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, value string }{
		{"DATABASE_URL", "nonsense"},
		{"REDIS_URL", "redis://[::1"},
		{"TOLLGATE_ADDR", "nowhere"},
		{"TOLLGATE_RECONCILE_INTERVAL", "soon"},
	} {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "TOLLGATE_TEST_RUN_MAIN=1", tc.name+"="+tc.value)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != 1 {
			t.Errorf("%s=%q: exit code %d (err %v), want 1", tc.name, tc.value, code, err)
		}
		out := stderr.String()
		if !strings.Contains(out, tc.name) {
			t.Errorf("%s=%q: stderr %q does not name the variable", tc.name, tc.value, out)
		}
		if strings.Contains(out, "goroutine ") || strings.Contains(out, "panic") {
			t.Errorf("%s=%q: stderr has a stack trace: %q", tc.name, tc.value, out)
		}
	}
}

func TestRunFailsWhenPostgresIsAway(t *testing.T) {
	t.Parallel()
	err := app.RunAPI(context.Background(), func(k string) string {
		return map[string]string{
			"REDIS_URL":    testenv.RedisURL(t),
			"DATABASE_URL": "postgres://postgres@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=2",
		}[k]
	}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "postgres") {
		t.Fatalf("run with Postgres away = %v, want an error about postgres", err)
	}
}
