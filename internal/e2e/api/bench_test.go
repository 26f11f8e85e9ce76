package api

import (
	"net"
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/httpapi/benchpeer"
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
//	go test -run '^$' -bench BenchmarkMeteredRequest -benchtime 3s ./internal/e2e/api
func BenchmarkMeteredRequest(b *testing.B) {
	s := mustStack(b)
	big := quota.Ptr(quota.MaxQuantity)
	tier := s.tier(999_999, quota.Limits{BurstRate: quota.Ptr(float64(quota.MaxRate)), Burst: quota.Ptr(int64(1 << 30)),
		BucketCapacity: quota.Ptr(int64(1 << 30)), BucketRefillPerSec: quota.Ptr(float64(quota.MaxRate)),
		DailyQuota: big, MonthlyQuota: big})
	_, key := s.tenant(tier.Slug)
	benchAgainstBare(b, s.start()+"/api/demo/echo", key, fiber.StatusOK)
}

// BenchmarkRefusedRequest measures one refused metered request answered by
// the deny cache: the tenant's tier allows one call a day and that call is
// spent, so every timed request is a 429 decided in process (no Redis),
// with its headers and problem body. It reports server-allocs/op as
// BenchmarkMeteredRequest does, next to the same bare-fiber reference: the
// goal is a refused-path throughput of at least 0.8x bare Fiber's.
//
//	go test -run '^$' -bench BenchmarkRefusedRequest -benchtime 3s ./internal/e2e/api
func BenchmarkRefusedRequest(b *testing.B) {
	s := mustStack(b)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1))})
	_, key := s.tenant(tier.Slug)
	api := s.start()
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
