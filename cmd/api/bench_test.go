package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/url"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/benchpeer"
	"github.com/tollgate/tollgate/internal/quota"
)

// BenchmarkMeteredRequest measures one admitted metered request (GET
// /api/demo/echo on a tier whose limits it never reaches, so every
// iteration does the full admission in Redis) over a real loopback
// connection to the api, which runs in this process (run on port 0), from
// one fasthttp client whose request and response are reused. The api logs
// at info level, every request's access-log line included, into a sink
// (startQuiet).
//
// server-allocs/op is the runtime's count of heap allocations (MemStats
// Mallocs) across the timed loop, per request, less the client's: the
// client-floor sub-benchmark drives a fasthttp server whose handler
// allocates nothing, so what it counts (client-allocs/op) is the client's,
// 0 in practice since fasthttp reuses its buffers. allocs/op (b.ReportAllocs) counts the same
// process-wide allocations, the client's included. bare-fiber is the
// reference: bare Fiber answering a small struct with c.JSON
// (internal/benchpeer, as `make bench-load` runs it). The api's background
// goroutines (a report a second, the catalog's subscription) are in the
// count too, a few allocations a second.
//
//	go test -run '^$' -bench BenchmarkMeteredRequest -benchtime 3s ./cmd/api
func BenchmarkMeteredRequest(b *testing.B) {
	s := mustStack(b)
	big := quota.Ptr(quota.MaxQuantity)
	tier := s.tier(999_999, quota.Limits{BurstRate: quota.Ptr(float64(quota.MaxRate)), Burst: quota.Ptr(int64(1 << 30)),
		BucketCapacity: quota.Ptr(int64(1 << 30)), BucketRefillPerSec: quota.Ptr(float64(quota.MaxRate)),
		DailyQuota: big, MonthlyQuota: big})
	_, key := s.tenant(tier.Slug)
	benchAgainstBare(b, s.startQuiet()+"/api/demo/echo", key, fiber.StatusOK)
}

// BenchmarkRefusedRequest measures one refused metered request answered by
// the deny cache: the tenant's tier allows one call a day and that call is
// spent, so every timed request is a 429 decided in process (no Redis),
// with its headers and problem body. It reports server-allocs/op as
// BenchmarkMeteredRequest does, next to the same bare-fiber reference: the
// goal is a refused-path throughput of at least 0.8x bare Fiber's.
//
//	go test -run '^$' -bench BenchmarkRefusedRequest -benchtime 3s ./cmd/api
func BenchmarkRefusedRequest(b *testing.B) {
	s := mustStack(b)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1))})
	_, key := s.tenant(tier.Slug)
	api := s.startQuiet()
	if r := do(b, "GET", api+"/api/demo/echo", key, ""); r.status != fiber.StatusOK {
		b.Fatalf("first call: status %d, want 200: %s", r.status, r.body)
	}
	benchAgainstBare(b, api+"/api/demo/echo", key, fiber.StatusTooManyRequests)
}

// benchAgainstBare runs the client-floor, bare-fiber and api sub-benchmarks:
// GET target with key as bearer token must answer want.
func benchAgainstBare(b *testing.B, target, key string, want int) {
	floor := serveLoopback(b, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"method":"GET","path":"/echo","allowed":true,"remaining":0}`)
	})
	bare := benchpeer.Bare()
	bareAddr := serveLoopback(b, bare.Handler())

	var client float64
	b.Run("client-floor", func(b *testing.B) {
		client = benchGET(b, "http://"+floor+benchpeer.Path, "", fiber.StatusOK)
		b.ReportMetric(client, "client-allocs/op")
	})
	name := "metered"
	if want != fiber.StatusOK {
		name = "refused"
	}
	for _, bc := range []struct {
		name, target, key string
		want              int
	}{
		{"bare-fiber", "http://" + bareAddr + benchpeer.Path, "", fiber.StatusOK},
		{name, target, key, want},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportMetric(max(benchGET(b, bc.target, bc.key, bc.want)-client, 0), "server-allocs/op")
		})
	}
}

// startQuiet runs one API instance of the stack as start does, logging at
// info level as start does (every request's access-log line is built and
// encoded), but into logSink rather than the pipe of startAPI, whose reader
// parses every line as JSON: its allocations and goroutine switches would
// count as the server's.
func (s *stack) startQuiet() string {
	s.tb.Helper()
	env := map[string]string{
		"REDIS_URL": s.redis, "DATABASE_URL": s.dbURL, "TOLLGATE_REDIS_PREFIX": s.prefix, "TOLLGATE_ADDR": "127.0.0.1:0",
		"TOLLGATE_SERVICE_TOKEN": serviceToken, "TOLLGATE_ADMIN_TOKEN": adminToken, "TOLLGATE_ROUTES": s.routes,
		"TOLLGATE_SHUTDOWN_TIMEOUT": "2s", "TOLLGATE_BODY_LIMIT": "2048", "TOLLGATE_LOG_LEVEL": "info",
	}
	ctx, cancel := context.WithCancel(context.Background())
	sink := &logSink{addr: make(chan string, 1)}
	done := make(chan error, 1)
	go func() { done <- run(ctx, func(k string) string { return env[k] }, sink) }()
	s.tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				s.tb.Errorf("run returned %v after shutdown, want nil", err)
			}
		case <-time.After(15 * time.Second):
			s.tb.Error("run did not return within 15s of shutdown")
		}
	})
	select {
	case a := <-sink.addr:
		return "http://" + a
	case err := <-done:
		s.tb.Fatalf("run ended before listening: %v", err)
	case <-time.After(30 * time.Second):
		s.tb.Fatal("api did not listen within 30s")
	}
	return ""
}

// logSink takes the api's log lines (one Write each, from slog) and keeps
// only the address of the "listening" line.
type logSink struct {
	addr  chan string
	found atomic.Bool
}

func (w *logSink) Write(p []byte) (int, error) {
	if !w.found.Load() && bytes.Contains(p, []byte(`"msg":"listening"`)) {
		var line struct{ Addr string }
		if json.Unmarshal(p, &line) == nil && line.Addr != "" {
			w.found.Store(true)
			w.addr <- line.Addr
		}
	}
	return len(p), nil
}

// serveLoopback serves h on a loopback port until the benchmark ends and
// returns its address.
func serveLoopback(tb testing.TB, h fasthttp.RequestHandler) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

// benchGET sends GET target (with key as bearer token, if any) b.N times
// over one kept-alive connection, wants status want each time, and returns
// the process's heap allocations per request.
func benchGET(b *testing.B, target, key string, want int) float64 {
	u, err := url.Parse(target)
	if err != nil {
		b.Fatal(err)
	}
	client := &fasthttp.HostClient{Addr: u.Host, MaxConns: 1, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(target)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	get := func() {
		if err := client.Do(req, resp); err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode() != want {
			b.Fatalf("GET %s: status %d, want %d: %s", target, resp.StatusCode(), want, resp.Body())
		}
	}
	for range 100 { // the connection, the tenant's cache entry, the script
		get()
	}
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n := 0
	for b.Loop() {
		get()
		n++
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(n)
}
