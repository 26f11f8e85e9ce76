package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/stripeexport"
	"github.com/tollgate/tollgate/internal/worker"
)

// RunWorker is the worker binary (cmd/worker): it reconciles usage counted
// in Redis into Postgres and bills it, in a loop of steps, and serves its
// metrics, until ctx ends.
func RunWorker(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	return run(ctx, "tollgate-worker", getenv, stdout, serveWorker)
}

// serveWorker wires the worker on what run opened and runs its loop until
// ctx ends.
func serveWorker(ctx context.Context, b *base) error {
	cfg, log, traces, db, rdb := b.cfg, b.log, b.traces, b.db, b.rdb

	runner := quotaredis.New(rdb, cfg.RedisPrefix)
	if err := runner.LoadFunctions(ctx, log); err != nil {
		return err
	}
	rec := billing.NewReconciler(db, runner, time.Now, log)
	// Workers running at once split the tenants (worker.Shares): each
	// flushes its shards' tenants; the leader alone runs the steps that
	// are not split by tenant.
	shares := worker.NewShares(db, log)
	defer shares.Close()
	rec.Share = shares
	rec.Parallel = flushParallel
	alerts := billing.NewDeliverer(db, nil, time.Now)
	alerts.AllowPrivate = cfg.WebhookAllowPrivate
	invoices := billing.NewInvoicer(db, time.Now, cfg.InvoiceGrace)
	invoices.FullSweepEvery = 15 * time.Minute // in between, Cycle.Invoices refreshes the tenants just flushed
	invoices.Owns = shares.Owns                // each worker closes and sweeps its shards' tenants' invoices
	invoices.Gained = shares.Gained
	cycle := billing.NewCycle(rec, invoices)
	partitions := billing.NewPartitions(db, time.Now, cfg.UsageRetentionMonths)
	reg, cycleSeconds := workerMetrics(rec, alerts, cycle.LastFlush)
	sharesMetrics(reg, shares)

	store := catalogdb.NewStore(db)
	// The catalog's cache is never read here: it publishes the room grants make.
	cat := catalog.New(store, rdb, cfg.RedisPrefix, log, time.Now)
	grants := catalog.NewGrants(store, runner, cat, time.Now, log)
	plans := catalog.NewPlans(store, runner, cat, time.Now, log)
	loop := &worker.Loop{
		Interval: cfg.ReconcileInterval,
		Log:      log,
		Steps: []worker.Step{
			// Membership first: the shards this worker flushes this cycle,
			// and whether it leads.
			{Name: "shares", Run: shares.Sync},
			// Grants Redis missed when they were made (it was down): each
			// applied once by its id (the repair restores only applied ones).
			{Name: "grants", Run: lead(shares, func(ctx context.Context) error {
				_, err := grants.ApplyMissed(ctx)
				return err
			})},
			// Tier changes planned for the next billing period, applied at
			// their effective time (tier history, audit, invalidation), then
			// the quota resets Redis missed.
			{Name: "plans", Run: lead(shares, func(ctx context.Context) error {
				_, err := plans.ApplyDue(ctx)
				return err
			})},
			// The usage ledger's monthly partitions, made ahead of the
			// flush that writes into them; with TOLLGATE_USAGE_RETENTION,
			// old months' detail rolled up and dropped (once an hour, by
			// the leader).
			{Name: "partitions", Run: lead(shares, partitions.Run)},
			// Repair first: counters lost with Redis are restored before the
			// flush moves what is still pending.
			{Name: "repair", Run: lead(shares, rec.Repair)},
			// Every worker: its shards' tenants; the leader also sweeps.
			{Name: "flush", Run: cycle.Flush},
			// Every worker refreshes the drafts of the tenants it flushed,
			// and closes months and sweeps drafts for its shards' tenants
			// (Cycle.Invoices).
			{Name: "invoices", Run: cycle.Invoices},
			{Name: "alerts", Run: lead(shares, alerts.Run)},
		},
		OnCycle: func(d time.Duration, _ int) { cycleSeconds.Observe(d.Seconds()) },
		Tracer:  traces.Tracer(),
	}
	if cfg.StripeKey != "" {
		// Last, and bounded to half a cycle: exporting never holds the
		// other steps back for long.
		exp := stripeexport.New(db, cfg.StripeKey, cfg.StripeURL, nil, time.Now, log)
		exp.Budget = cfg.ReconcileInterval / 2
		loop.Steps = append(loop.Steps, worker.Step{Name: "stripe", Run: lead(shares, exp.Run)})
		stripeMetrics(reg, exp)
		log.Info("stripe export on", "url", cfg.StripeURL)
	}

	// Postgres ends the lock session of a worker silent for longer than
	// its longest cycle (each step is bounded by an interval), so that a
	// vanished host's shards move on.
	shares.IdleTimeout = max(time.Duration(len(loop.Steps)+1)*cfg.ReconcileInterval, 30*time.Second)

	ln, err := net.Listen("tcp", cfg.WorkerMetricsAddr)
	if err != nil {
		return fmt.Errorf("TOLLGATE_WORKER_METRICS_ADDR: listen %s: %w", cfg.WorkerMetricsAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server failed", "err", err)
		}
	}()
	log.Info("worker started", "interval", cfg.ReconcileInterval.String(), "metrics_addr", ln.Addr().String())

	err = loop.Run(ctx)
	// The batches this worker recorded last, dropped from Redis now rather
	// than by their tenants' next claims (see billing.Reconciler): a
	// pipeline of 500 a round trip, within 5 s.
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	if cerr := rec.Close(cctx); cerr != nil {
		log.Warn("recorded batches left in flight: the next flush drops them", "err", cerr)
	}
	ccancel()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	log.Info("worker stopped")
	return err
}

// flushParallel is how many chunks of 500 tenants a worker's flush moves at
// once (billing.Reconciler.Parallel).
const flushParallel = 4

// lead returns run as a step only the leader runs: on the other workers it
// does nothing.
func lead(sh *worker.Shares, run func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if !sh.Leads() {
			return nil
		}
		return run(ctx)
	}
}

// workerMetrics registers the worker's series: cycle duration, tenants and
// units flushed, late usage of final invoices (credits given back, raises
// not billed), batches stuck in flight, lag since the last successful
// flush, webhook outcomes.
func workerMetrics(rec *billing.Reconciler, alerts *billing.Deliverer, lastFlush func() time.Time) (*prometheus.Registry, prometheus.Histogram) {
	reg := prometheus.NewRegistry()
	cycle := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tollgate_worker_cycle_seconds", Help: "Duration of one worker cycle.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	})
	counter := func(name, help string, v func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v()) })
	}
	reg.MustRegister(cycle,
		counter("tollgate_worker_tenants_flushed_total", "Tenant batches flushed into the ledger.", rec.TenantsFlushed.Load),
		counter("tollgate_worker_units_flushed_total", "Units flushed into the ledger.", rec.UnitsFlushed.Load),
		counter("tollgate_worker_late_credits_total",
			"Credits given back for usage recorded after its period's invoice was final.", rec.LateCredits.Load),
		counter("tollgate_worker_late_credit_cents_total", "Cents those credits gave back.", rec.LateCreditCents.Load),
		counter("tollgate_worker_late_raises_total",
			"Usage recorded after its period's invoice was final that raised the period's charge (not billed).", rec.LateRaises.Load),
		counter("tollgate_worker_rescued_batches_total",
			"Usage batches recorded although their sequence was below their tenant's last (Redis' clock went back).",
			rec.RescuedBatches.Load),
		counter("tollgate_worker_older_data_batches_total",
			"Usage batches not recorded because Redis claimed them from older data it went back to (their usage was recorded already).",
			rec.OlderDataBatches.Load),
		counter("tollgate_webhook_delivered_total", "Alerts delivered to their webhook.", alerts.Delivered.Load),
		counter("tollgate_webhook_failures_total", "Failed webhook attempts that will be retried.", alerts.Retried.Load),
		counter("tollgate_webhook_given_up_total", "Alerts given up after the last attempt.", alerts.Failed.Load),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tollgate_worker_stuck_batches",
			Help: "Usage batches Postgres rejected, left in flight and retried each cycle (the log names them).",
		}, func() float64 { return float64(rec.StuckBatches()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tollgate_worker_lag_seconds", Help: "Seconds since the last successful flush.",
		}, func() float64 {
			if t := lastFlush(); !t.IsZero() {
				return time.Since(t).Seconds()
			}
			return 0
		}),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg, cycle
}

// sharesMetrics registers the worker's share of the tenants: the shards it
// holds, whether it leads, and the workers alive at its last sync.
func sharesMetrics(reg *prometheus.Registry, sh *worker.Shares) {
	gauge := func(name, help string, v func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, v)
	}
	reg.MustRegister(
		gauge("tollgate_worker_shards", "Shards of tenants this worker flushes (of 64).",
			func() float64 { return float64(len(sh.Owned())) }),
		gauge("tollgate_worker_leader", "1 if this worker leads (sweeps, closes invoices, delivers alerts), else 0.",
			func() float64 {
				if sh.Leads() {
					return 1
				}
				return 0
			}),
		gauge("tollgate_worker_members", "Workers alive at this worker's last sync, itself included.",
			func() float64 { return float64(sh.Alive()) }),
	)
}

// stripeMetrics registers the Stripe export's series: export outcomes
// (an invoice exported; an attempt failed, to be retried) and the invoices
// whose last attempt failed.
func stripeMetrics(reg *prometheus.Registry, exp *stripeexport.Exporter) {
	outcome := func(name string, v func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tollgate_stripe_exports_total", Help: "Invoice exports to Stripe: invoices exported, and failed attempts (retried).",
			ConstLabels: prometheus.Labels{"outcome": name},
		}, func() float64 { return float64(v()) })
	}
	reg.MustRegister(
		outcome("exported", exp.Exported.Load),
		outcome("failed", exp.Failed.Load),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tollgate_stripe_exports_failing",
			Help: "Final invoices whose last export attempt to Stripe failed (the console shows why; retried with backoff).",
		}, func() float64 { return float64(exp.Failing()) }),
	)
}
