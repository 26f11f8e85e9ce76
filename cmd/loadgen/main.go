// Command loadgen is `make bench`'s side-by-side measurement. In one run it
// drives, with the same load, an api and two reference servers it also
// serves itself (package internal/httpapi/benchpeer), and prints:
//
//  1. closed loop, -conns connections for -duration a row, driven by wrk
//     (-wrk, Debian's package; without it, by loadgen's own goroutines):
//     req/s, ratios to bare Fiber and to the matching redis_rate row, p50,
//     p99 and errors of bare Fiber; Fiber + go-redis/redis_rate on one key,
//     and on -tenants keys in turn; the api's /healthz; a metered route
//     admitted for one hot tenant, and for -tenants tenants in turn (each
//     of wrk's threads walks their API keys in order, wrk.lua); refused
//     (from the api's deny cache); POST /v1/check; and, with -grpc, the
//     rate limit service's ShouldRateLimit for the hot tenant, driven by
//     loadgen's own gRPC client (-conns calls in flight on -threads
//     HTTP/2 connections);
//  2. open loop, by loadgen's own driver (wrk keeps no constant rate), at
//     half the hot tenant's saturating rate: p50/p99 of bare Fiber and of
//     the hot tenant's row, and the p99 overhead;
//  3. per row, what Redis spent per answer (INFO commandstats: scripts,
//     eval or fcall, and any other command clients sent) and the bytes a
//     tenant keeps in Redis (MEMORY USAGE);
//  4. per row, the CPU per request of the load generator, the server and
//     Redis;
//  5. a PASS/FAIL line per goal (goals.go), each with its figure;
//  6. the policies table (policies.go): per algorithm of API.md "Policies
//     (v2)", one policy created through the admin API for a tier of its own,
//     and that tier's tenant driven closed-loop for half of -duration:
//     req/s, ratios to bare and to the hot tenant's row, p99, Redis µs
//     per decision, bytes per policy key and refusals. Each policy is
//     deleted after its row (and those a killed run left, before the first).
//
// It creates its own tiers and tenants in Postgres (REDIS_URL, DATABASE_URL
// and TOLLGATE_* are read as the api reads them); the -tenants tenants are
// deleted after the run. It exits 1 only when requests failed: the goals
// are informational.
//
// Serving a peer instead: `loadgen -peer bare -addr 127.0.0.1:18081`, or
// `-peer redis_rate` (Redis from REDIS_URL), until SIGINT or SIGTERM.
//
// It only listens on and targets loopback addresses, and every row stops
// after -duration (wrk: rounded to whole seconds), or -max requests with
// loadgen's own driver.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/internal/config"
	"github.com/tollgate/tollgate/internal/httpapi/benchpeer"
	"github.com/tollgate/tollgate/internal/redisdb"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

// options are loadgen's flags.
type options struct {
	peer, addr              string // serving a peer
	api, bare, redisRate    string // base URLs measured
	grpc                    string // the api's gRPC address; "": no gRPC row
	duration                time.Duration
	max                     int64
	conns                   int
	wrk                     string // the wrk binary; "": loadgen's own driver
	threads                 int    // wrk's
	tenants                 int    // of the many-tenant rows
	barePID, redisRatePID   int    // the peers' processes, for their CPU time (0: unknown)
	serviceToken, rdbPrefix string // from the environment, as the api reads them
	adminToken              string // the policies table's admin calls; "" skips it
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.peer, "peer", "", `serve a reference server instead of measuring: "bare" or "redis_rate"`)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:18081", "with -peer: the loopback address to listen on")
	fs.StringVar(&o.api, "url", "http://127.0.0.1:18080", "the api's base URL (loopback only)")
	fs.StringVar(&o.bare, "bare", "http://127.0.0.1:18081", "base URL of a `loadgen -peer bare` (loopback only)")
	fs.StringVar(&o.redisRate, "redis-rate", "http://127.0.0.1:18082", "base URL of a `loadgen -peer redis_rate` (loopback only)")
	fs.StringVar(&o.grpc, "grpc", "", "the api's gRPC address (TOLLGATE_GRPC_ADDR, loopback only) for the ShouldRateLimit row; empty: no such row")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "how long each row is driven (100ms to 10m)")
	fs.Int64Var(&o.max, "max", 10_000_000, "most requests per row")
	fs.IntVar(&o.conns, "conns", 64, "connections a row (1 to 1024)")
	fs.StringVar(&o.wrk, "wrk", "", "the wrk binary that drives the closed-loop rows (empty: loadgen's own goroutines, one a connection)")
	fs.IntVar(&o.threads, "threads", 2, "wrk's threads (1 to 64, at most -conns)")
	fs.IntVar(&o.tenants, "tenants", 400, "tenants (and redis_rate keys) of the rows that take them in turn (1 to 10000)")
	fs.IntVar(&o.barePID, "bare-pid", 0, "the process id of the bare peer, to read its CPU time (0: unknown)")
	fs.IntVar(&o.redisRatePID, "redis-rate-pid", 0, "the process id of the redis_rate peer, to read its CPU time (0: unknown)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case o.duration < 100*time.Millisecond || o.duration > 10*time.Minute:
		return fmt.Errorf("-duration %s: must be between 100ms and 10m", o.duration)
	case o.max < 1:
		return fmt.Errorf("-max %d: must be at least 1", o.max)
	case o.conns < 1 || o.conns > 1024:
		return fmt.Errorf("-conns %d: must be between 1 and 1024", o.conns)
	case o.threads < 1 || o.threads > 64:
		return fmt.Errorf("-threads %d: must be between 1 and 64", o.threads)
	case o.tenants < 1 || o.tenants > 10_000:
		return fmt.Errorf("-tenants %d: must be between 1 and 10000", o.tenants)
	case o.barePID < 0 || o.redisRatePID < 0:
		return fmt.Errorf("-bare-pid %d, -redis-rate-pid %d: must be process ids, or 0", o.barePID, o.redisRatePID)
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	if o.peer != "" {
		return servePeer(ctx, o.peer, o.addr, cfg)
	}
	for _, u := range []struct{ flag, raw string }{{"-url", o.api}, {"-bare", o.bare}, {"-redis-rate", o.redisRate}} {
		if err := loopbackURL(u.raw); err != nil {
			return fmt.Errorf("%s: %w", u.flag, err)
		}
	}
	if o.grpc != "" {
		if err := loopbackHost(hostOf(o.grpc)); err != nil {
			return fmt.Errorf("-grpc: %w", err)
		}
	}
	o.serviceToken, o.rdbPrefix, o.adminToken = cfg.ServiceToken, cfg.RedisPrefix, cfg.AdminToken
	if o.serviceToken == "" {
		return errors.New("TOLLGATE_SERVICE_TOKEN is not set: the /v1/check row needs the api's service token")
	}
	var drv driver = ownDriver{max: o.max}
	if o.wrk != "" {
		path, err := exec.LookPath(o.wrk)
		if err != nil {
			return fmt.Errorf("-wrk: %w", err)
		}
		w, err := newWrkDriver(path, o.threads)
		if err != nil {
			return err
		}
		defer func() { _ = w.close() }()
		drv = w
	}
	return measure(ctx, o, cfg, drv, stdout)
}

// servePeer serves one benchpeer app on addr until ctx ends.
func servePeer(ctx context.Context, peer, addr string, cfg config.Config) error {
	if err := loopbackHost(hostOf(addr)); err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	if peer != "bare" && peer != "redis_rate" {
		return fmt.Errorf(`-peer %q: must be "bare" or "redis_rate"`, peer)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	if peer == "bare" {
		err = benchpeer.Serve(ctx, benchpeer.Bare(), ln)
	} else {
		err = serveRedisRate(ctx, ln, cfg)
	}
	if err != nil {
		return fmt.Errorf("-peer %s: %w", peer, err)
	}
	return nil
}

// serveRedisRate serves benchpeer.RedisRate on ln, with Redis from cfg.
func serveRedisRate(ctx context.Context, ln net.Listener, cfg config.Config) error {
	rdb, err := redisdb.Open(ctx, cfg.Redis)
	if err != nil {
		ln.Close()
		return err
	}
	defer rdb.Close()
	return benchpeer.Serve(ctx, benchpeer.RedisRate(rdb, cfg.RedisPrefix+":peer"), ln)
}

// loopbackURL accepts http URLs of loopback hosts only.
func loopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "http" {
		return fmt.Errorf("%s: only http:// is supported", raw)
	}
	return loopbackHost(u.Hostname())
}

func loopbackHost(host string) error {
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q is not a loopback address; loadgen only targets this machine", host)
}

func hostOf(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}
