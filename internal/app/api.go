package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/tollgate/tollgate/internal/admission"
	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/httpapi"
	"github.com/tollgate/tollgate/internal/httpapi/connlimit"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/routes"
	"github.com/tollgate/tollgate/internal/usage"
)

// RunAPI is the api binary (cmd/api): Tollgate's HTTP server, with the
// metered routes, the service check, admin REST and the dashboard, and the
// gRPC and operations listeners when configured. It serves until ctx ends,
// then shuts down gracefully. It logs the address it listens on
// (TOLLGATE_ADDR may have port 0) in a "listening" line.
func RunAPI(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	return run(ctx, "tollgate-api", getenv, stdout, serveAPI)
}

// serveAPI wires the api on what run opened and serves until ctx ends.
func serveAPI(ctx context.Context, b *base) error {
	cfg, log, traces, db, rdb := b.cfg, b.log, b.traces, b.db, b.rdb

	table, err := routes.Load(cfg.RoutesFile)
	if err != nil {
		return err
	}
	metrics := httpapi.NewMetrics()
	store := catalogdb.NewStore(db)
	cat := catalog.New(store, rdb, cfg.RedisPrefix, log, time.Now).WithBalances(billing.NewLedger(db))
	cat.Hits = metrics.CacheLookups.WithLabelValues("hit").Inc
	cat.Misses = metrics.CacheLookups.WithLabelValues("miss").Inc
	runner := quotaredis.New(rdb, cfg.RedisPrefix).WithAnswerLimits(cfg.IdempotencyLimits)
	if err := runner.LoadFunctions(ctx, log); err != nil {
		return err
	}
	gate := admission.New(runner, time.Now)
	gate.OnRedisError = func(err error) {
		metrics.RedisErrors.Inc()
		log.Warn("redis admission failed", "err", err)
	}
	gate.OnDenyHit = metrics.DenyHits.Inc
	gate.SetQueueLimits(admission.QueueLimits{Node: cfg.QueueWaiters, PerTenant: cfg.QueueWaitersPerTenant, PerPolicy: cfg.QueueWaitersPerPolicy})
	gate.OnQueueFull = func(bound string) { metrics.QueueFull.WithLabelValues(bound).Inc() }
	gate.OnRoom = func(ctx context.Context, tenantID string) {
		if err := cat.Invalidate(ctx, catalog.KindRoom, tenantID); err != nil {
			log.Warn("publishing a refund to the other nodes failed", "tenant_id", tenantID, "err", err)
		}
	}
	cat.OnTenantChange(gate.Forget)
	// Fail-open usage that Redis does not take in time goes to the
	// ledger directly (internal/admission, outage.go).
	ledger := billing.NewLedger(db)
	gate.Ledger = ledger

	// The catalog listens for invalidations until shutdown.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	subscribed := make(chan struct{})
	go cat.Run(bg, 30*time.Second, subscribed)
	select {
	case <-subscribed:
	case <-time.After(5 * time.Second):
		log.Warn("cache invalidation channel not subscribed yet; continuing")
	}
	// Releases of concurrency leases wake this node's queued requests.
	listening := make(chan struct{})
	go runner.ListenReleases(bg, gate.Released, gate.ReleasesLost, listening)
	select {
	case <-listening:
	case <-time.After(5 * time.Second):
		log.Warn("concurrency release channel not subscribed yet; continuing")
	}

	// Tell the worker which tenants counted usage, and count the refusals
	// the deny cache answered, once a second, off the request path; once
	// more when bg ends, after the last request, before Redis closes.
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		gate.RunReports(bg, time.Second, log)
	}()
	defer func() { stopBG(); <-reported }()

	maxConns := cfg.MaxConns
	if maxConns == 0 {
		maxConns = connlimit.DefaultMax()
	}
	srv, err := httpapi.New(httpapi.Deps{
		Log: log, Store: store, Sessions: redisdb.NewSessions(rdb, cfg.RedisPrefix), Catalog: cat, Gate: gate, Routes: table, Metrics: metrics, Now: time.Now,
		Admin:  catalog.NewAdmin(store, cat),
		Grants: catalog.NewGrants(store, runner, cat, time.Now, log), Plans: catalog.NewPlans(store, runner, cat, time.Now, log),
		Ledger: ledger, Usage: usage.NewReader(runner, ledger, time.Now).WithPrepaid(cat.Prepaid), Ready: readyChecks(rdb, db),
		Alerts: billing.NewDeliverer(db, nil, time.Now), Policies: cat, Tracer: traces.Tracer(),
	}, httpapi.Options{
		BodyLimit:    cfg.BodyLimit,
		AdminToken:   cfg.AdminToken,
		ServiceToken: cfg.ServiceToken,
		SessionTTL:   cfg.SessionTTL,

		TrustedProxies:         cfg.TrustedProxies,
		WebhookAllowPrivate:    cfg.WebhookAllowPrivate,
		MaxResponseBytes:       cfg.ProxyMaxResponseBytes,
		MaxResponseHeaderBytes: cfg.ProxyMaxResponseHeaderBytes,
		MaxConns:               maxConns,
		ReadTimeout:            cfg.ReadTimeout,
		IdleTimeout:            cfg.IdleTimeout,
		Ops:                    cfg.OpsAddr != "",
	})
	if err != nil {
		return err
	}
	tcp, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("TOLLGATE_ADDR: listen %s: %w", cfg.Addr, err)
	}
	// The listener caps connections and outlives a shortage of file
	// descriptors (connlimit); the server tells it which ones it closed.
	ln := connlimit.New(tcp, connlimit.Config{Max: maxConns, PerIP: cfg.MaxConnsPerIP, Exempt: cfg.TrustedProxies,
		Log: log, Refused: func(reason string) { metrics.ConnsRefused.WithLabelValues(reason).Inc() }})
	srv.App().Server().ConnState = ln.ConnState
	metrics.WatchConns(ln.Open)
	ops, err := serveOps(cfg.OpsAddr, srv, log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	grpcSrv, err := serveGRPC(cfg.GRPCAddr, srv, gate, metrics, log, traces.Tracer())
	if err != nil {
		_ = ln.Close()
		_ = ops.shutdown(cfg.ShutdownTimeout, log)
		return err
	}
	// "listening" is logged once every listener is bound: whoever waits for
	// it (a supervisor, a test) may then call either.
	listenAttrs := []any{"addr", ln.Addr().String(), "max_conns", maxConns, "max_conns_per_ip", cfg.MaxConnsPerIP}
	if grpcSrv.addr != "" {
		listenAttrs = append(listenAttrs, "grpc_addr", grpcSrv.addr)
	}
	log.Info("listening", listenAttrs...)

	errc := make(chan error, 1)
	go func() { errc <- srv.App().Listener(ln) }()
	select {
	case err := <-errc:
		_ = ops.shutdown(cfg.ShutdownTimeout, log)
		_ = grpcSrv.shutdown(cfg.ShutdownTimeout, log)
		return fmt.Errorf("api: serve: %w", err)
	case err := <-ops.failed():
		_ = srv.App().ShutdownWithTimeout(cfg.ShutdownTimeout)
		_ = grpcSrv.shutdown(cfg.ShutdownTimeout, log)
		return fmt.Errorf("api: operations listener: %w", err)
	case err := <-grpcSrv.failed():
		_ = srv.App().ShutdownWithTimeout(cfg.ShutdownTimeout)
		_ = ops.shutdown(cfg.ShutdownTimeout, log)
		return fmt.Errorf("api: grpc listener: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	// The gRPC services stop beside the HTTP server, within the same
	// timeout: health answers NOT_SERVING, the calls in flight finish.
	grpcDone := make(chan error, 1)
	go func() { grpcDone <- grpcSrv.shutdown(cfg.ShutdownTimeout, log) }()
	// In-flight requests get ShutdownTimeout to finish. Connections still
	// open then (a client's keep-alive connection that never sent a request
	// stays "new" to fasthttp until its read timeout) are dropped with the
	// process: that is the end of a graceful shutdown, not a failure.
	if err := srv.App().ShutdownWithTimeout(cfg.ShutdownTimeout); err != nil {
		log.Warn("shutdown timed out; dropping the connections still open", "err", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("api: serve: %w", err)
	}
	if err := ops.shutdown(cfg.ShutdownTimeout, log); err != nil {
		return err
	}
	if err := <-grpcDone; err != nil {
		return err
	}
	srv.WaitAudits() // the last settlements' audit entries, before Postgres closes
	stopBG()
	<-reported
	log.Info("stopped")
	return nil
}

// readyChecks are what /readyz checks: Redis and Postgres answer, and the
// schema is the one this binary expects.
func readyChecks(rdb redis.UniversalClient, db *pgxpool.Pool) []httpapi.ReadyCheck {
	return []httpapi.ReadyCheck{
		{Name: "redis", Check: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }},
		{Name: "postgres", Check: db.Ping},
		{Name: "schema", Check: func(ctx context.Context) error { return pgdb.SchemaCurrent(ctx, db) }},
	}
}
