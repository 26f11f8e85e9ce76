package httpapi

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the API node's Prometheus series.
type Metrics struct {
	Registry     *prometheus.Registry
	Requests     *prometheus.CounterVec // metered requests by route, outcome, tier
	Admission    prometheus.Histogram   // seconds one admission took
	RedisErrors  prometheus.Counter
	CacheLookups *prometheus.CounterVec // key cache lookups by result
	DenyHits     prometheus.Counter
	AuthFailures prometheus.Counter
	Policies     *prometheus.CounterVec // policy decisions by policy, algorithm, outcome
	QueueFull    *prometheus.CounterVec // queued refusals answered at once: a queue bound was full, by bound
	ConnsRefused *prometheus.CounterVec // client connections refused by the listener's caps, by reason
	Envoy        *prometheus.CounterVec // decisions of the gRPC services for Envoy, by service and outcome

	// requests caches the children of Requests (see request).
	requestsMu sync.Mutex
	requests   atomic.Pointer[map[requestLabels]prometheus.Counter]
}

// requestLabels are the labels of one tollgate_requests_total series.
type requestLabels struct{ route, outcome, tier string }

// maxRequestSeries bounds the cache of request counters; past it (tiers
// without end), request falls back to WithLabelValues.
const maxRequestSeries = 4096

// NewMetrics registers the series on a registry of their own.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_requests_total", Help: "Metered requests by route, outcome and tier.",
		}, []string{"route", "outcome", "tier"}),
		Admission: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tollgate_admission_seconds", Help: "Time to decide on one metered request.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}),
		RedisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_redis_errors_total", Help: "Admissions that failed to reach Redis.",
		}),
		CacheLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_key_cache_lookups_total", Help: "API key cache lookups by result (hit, miss).",
		}, []string{"result"}),
		DenyHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_deny_cache_hits_total", Help: "Refusals answered in-process by the deny cache.",
		}),
		AuthFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_auth_failures_total", Help: "Requests with a missing, unknown, revoked or expired key.",
		}),
		Policies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_policy_decisions_total",
			Help: "Policy decisions by policy, algorithm and outcome (admitted, refused, shadow_refused, degraded).",
		}, []string{"policy", "algorithm", "outcome"}),
		QueueFull: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_policy_queue_full_total",
			Help: "Refusals of queue policies answered at once because a bound of the node's queue was full (node, tenant, policy).",
		}, []string{"bound"}),
		ConnsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_connections_refused_total",
			Help: "Client connections refused by the listener: past TOLLGATE_MAX_CONNS (max) or TOLLGATE_MAX_CONNS_PER_IP (per_ip).",
		}, []string{"reason"}),
		Envoy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_envoy_calls_total",
			Help: "Calls of the gRPC services for Envoy by service (ratelimit, ext_authz) and outcome (ok, refused, or the refusal's error code: invalid, unauthorized, forbidden, unavailable; error: not decided).",
		}, []string{"service", "outcome"}),
	}
	reg.MustRegister(m.Requests, m.Admission, m.RedisErrors, m.CacheLookups, m.DenyHits, m.AuthFailures, m.Policies, m.QueueFull, m.ConnsRefused, m.Envoy,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// request returns the tollgate_requests_total counter of a metered request
// (route's meter, outcome, tier). Every metered request counts one, so the
// counters are cached in a map that is replaced, never written, on a new
// combination: the hot path is an atomic load and a map lookup, without the
// label checks, hashing and lock of WithLabelValues. The label values must
// not point into Fiber's buffers (meters and tier slugs never do).
func (m *Metrics) request(route, outcome, tier string) prometheus.Counter {
	k := requestLabels{route, outcome, tier}
	if cached := m.requests.Load(); cached != nil {
		if c, ok := (*cached)[k]; ok {
			return c
		}
	}
	m.requestsMu.Lock()
	defer m.requestsMu.Unlock()
	old := m.requests.Load()
	if old != nil {
		if c, ok := (*old)[k]; ok {
			return c
		}
		if len(*old) >= maxRequestSeries {
			return m.Requests.WithLabelValues(route, outcome, tier)
		}
	}
	c := m.Requests.WithLabelValues(route, outcome, tier)
	next := map[requestLabels]prometheus.Counter{k: c}
	if old != nil {
		maps.Copy(next, *old)
	}
	m.requests.Store(&next)
	return c
}

// watchWaiters adds the gauge of the requests waiting in policy queues
// (on_refuse "queue") on this node, read from waiters when scraped.
func (m *Metrics) watchWaiters(waiters func() int64) {
	_ = m.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tollgate_policy_queue_waiters", Help: "Requests of this node waiting in policy queues.",
	}, func() float64 { return float64(waiters()) }))
}

// WatchConns adds the gauge of the client connections open, read from open
// when scraped.
func (m *Metrics) WatchConns(open func() int) {
	_ = m.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tollgate_connections_open", Help: "Client connections the api holds open.",
	}, func() float64 { return float64(open()) }))
}

// outageGate is what the fail-open usage series read of the gate
// (*admission.Gate).
type outageGate interface {
	OutagePending() (rows, units int64)
	OutageRecorded() (redis, ledger int64)
	OutageRefused() int64
}

// watchOutage adds the series of the usage fail-open admissions leave on
// this node until Redis or the ledger records it, read from g when
// scraped.
func (m *Metrics) watchOutage(g outageGate) {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tollgate_failopen_pending_rows",
			Help: "Rows (tenant, meter, hour) of fail-open usage this node holds, not yet recorded by Redis or the ledger.",
		}, func() float64 { rows, _ := g.OutagePending(); return float64(rows) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tollgate_failopen_pending_units",
			Help: "Units of fail-open usage this node holds, not yet recorded by Redis or the ledger.",
		}, func() float64 { _, units := g.OutagePending(); return float64(units) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tollgate_failopen_recorded_units_total", Help: "Fail-open units recorded through Redis (store=redis) or the ledger directly (store=ledger).",
			ConstLabels: prometheus.Labels{"store": "redis"},
		}, func() float64 { n, _ := g.OutageRecorded(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tollgate_failopen_recorded_units_total", Help: "Fail-open units recorded through Redis (store=redis) or the ledger directly (store=ledger).",
			ConstLabels: prometheus.Labels{"store": "ledger"},
		}, func() float64 { _, n := g.OutageRecorded(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tollgate_failopen_refused_total",
			Help: "Fail-open requests refused because this node held all the fail-open usage it may.",
		}, func() float64 { return float64(g.OutageRefused()) }),
	} {
		_ = m.Registry.Register(c)
	}
}
