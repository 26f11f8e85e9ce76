// Command soak is `make soak`: it runs Tollgate as in production (2 api
// nodes, 2 workers, its own append-only Redis and its own Postgres, all on
// loopback), drives load from many tenants for SOAK_DURATION while it kills,
// restarts and pauses the parts on a schedule, then audits what the ledger
// billed against what its own client was answered. It prints one line per
// promise, held or BROKEN, and exits 1 when one is broken (2 when it could
// not run). Everything it starts stops when it ends. See docs/soak.md.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, os.Getenv, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// settings are the soak's, from the environment.
type settings struct {
	duration              time.Duration // SOAK_DURATION, default 10m
	rate, clients, tenant int           // SOAK_RATE ops/s, SOAK_CLIENTS, SOAK_TENANTS
	dir, bin              string        // SOAK_DIR (.data/soak), SOAK_BIN (bin)
}

func load(getenv func(string) string) (settings, error) {
	s := settings{duration: 10 * time.Minute, rate: 150, clients: 32, tenant: 24, dir: ".data/soak", bin: "bin"}
	if v := getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 30*time.Second || d > 24*time.Hour {
			return s, fmt.Errorf("SOAK_DURATION=%q: want a Go duration from 30s to 24h", v)
		}
		s.duration = d
	}
	for _, n := range []struct {
		name     string
		dst      *int
		min, max int
	}{{"SOAK_RATE", &s.rate, 1, 5000}, {"SOAK_CLIENTS", &s.clients, 1, 512}, {"SOAK_TENANTS", &s.tenant, 4, 1000}} {
		if v := getenv(n.name); v != "" {
			i, err := strconv.Atoi(v)
			if err != nil || i < n.min || i > n.max {
				return s, fmt.Errorf("%s=%q: want an integer from %d to %d", n.name, v, n.min, n.max)
			}
			*n.dst = i
		}
	}
	if v := getenv("SOAK_DIR"); v != "" {
		s.dir = v
	}
	if v := getenv("SOAK_BIN"); v != "" {
		s.bin = v
	}
	return s, nil
}

// soak is one run: its processes, its load and what it saw.
type soak struct {
	set      settings
	out      io.Writer
	start    time.Time
	redis    *proc
	pg       *proc
	apis     []*proc
	workers  []*proc
	nodes    []*node
	redisURL string
	upstream *upstream
	dbURL    string

	mu      sync.Mutex
	windows []window
	events  []string
	failed  []string
	samples []sample
	started map[int]time.Time // api pid → start
}

func (s *soak) say(format string, args ...any) {
	fmt.Fprintf(s.out, "soak: +%-7s %s\n", time.Since(s.start).Round(100*time.Millisecond), fmt.Sprintf(format, args...))
}

// event records a scheduled fault and its outcome.
func (s *soak) event(what string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.failed = append(s.failed, what+": "+err.Error())
		s.say("%s: FAILED: %v", what, err)
		return
	}
	s.events = append(s.events, what)
	s.say("%s", what)
}

func run(ctx context.Context, getenv func(string) string, out io.Writer) (bool, error) {
	set, err := load(getenv)
	if err != nil {
		return false, err
	}
	s := &soak{set: set, out: out, start: time.Now(), started: map[int]time.Time{}}
	defer s.stopAll()
	if err := s.up(ctx); err != nil {
		return false, err
	}
	return s.drive(ctx)
}

// stopAll stops everything the soak started, api nodes first.
func (s *soak) stopAll() {
	var wg sync.WaitGroup
	for _, p := range append(append([]*proc{}, s.apis...), s.workers...) {
		wg.Go(func() { p.stop(syscall.SIGTERM, 15*time.Second) })
	}
	wg.Wait()
	if s.pg != nil {
		s.pg.stop(syscall.SIGINT, 20*time.Second)
	}
	if s.redis != nil {
		s.redis.stop(syscall.SIGTERM, 10*time.Second)
	}
	if s.upstream != nil {
		_ = s.upstream.srv.Close()
	}
}

const (
	adminToken   = "soak-admin-token-0123456789abcdef"
	serviceToken = "soak-service-token-0123456789abcdef"
)

// up starts Redis, Postgres, the upstream, 2 api nodes and 2 workers.
func (s *soak) up(ctx context.Context) error {
	dir, err := filepath.Abs(s.set.dir)
	if err != nil {
		return err
	}
	s.set.dir = dir
	for _, b := range []string{"api", "worker"} {
		if _, err := os.Stat(filepath.Join(s.set.bin, b)); err != nil {
			return fmt.Errorf("no %s binary in %s: run make build (make soak does)", b, s.set.bin)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for _, d := range []string{dir, filepath.Join(dir, "redis"), filepath.Join(dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return errors.New("no redis-server on PATH: install redis-server (apt-get install redis-server), Redis 7 or later")
	}
	rport, err := freePort()
	if err != nil {
		return err
	}
	s.redis = newRedis(filepath.Join(dir, "redis"), rport)
	if err := s.redis.start(); err != nil {
		return err
	}
	raddr := fmt.Sprintf("127.0.0.1:%d", rport)
	if err := waitFor(ctx, s.redis, 20*time.Second, redisPing(raddr)); err != nil {
		return err
	}
	s.redisURL = "redis://" + raddr + "/0"
	pport, err := freePort()
	if err != nil {
		return err
	}
	if s.pg, err = newPostgres(ctx, filepath.Join(dir, "postgres"), pport); err != nil {
		return err
	}
	if err := s.pg.start(); err != nil {
		return err
	}
	admin := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", pport)
	if err := waitFor(ctx, s.pg, 60*time.Second, func() error { return pgExec(ctx, admin, "SELECT 1") }); err != nil {
		return err
	}
	if err := pgExec(ctx, admin, "CREATE DATABASE tollgate"); err != nil {
		return err
	}
	s.dbURL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/tollgate?sslmode=disable", pport)
	s.say("redis-server on %s (appendonly yes), Postgres on 127.0.0.1:%d, data and logs in %s", raddr, pport, dir)

	up, err := startUpstream()
	if err != nil {
		return err
	}
	routes := filepath.Join(dir, "routes.json")
	if err := os.WriteFile(routes, routeTable(up.base), 0o644); err != nil {
		return err
	}
	s.upstream = up
	env := append(os.Environ(), "REDIS_URL="+s.redisURL, "DATABASE_URL="+s.dbURL,
		"TOLLGATE_ADMIN_TOKEN="+adminToken, "TOLLGATE_SERVICE_TOKEN="+serviceToken,
		"TOLLGATE_ROUTES="+routes, "TOLLGATE_LOG_LEVEL=warn", "TOLLGATE_MAX_CONNS_PER_IP=0",
		"TOLLGATE_RECONCILE_INTERVAL=1s", "TOLLGATE_INVOICE_GRACE=1m", "TOLLGATE_WORKER_METRICS_ADDR=127.0.0.1:0",
		"TOLLGATE_SHUTDOWN_TIMEOUT=5s", "OTEL_SDK_DISABLED=true")
	for i := range 2 {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p := &proc{name: fmt.Sprintf("api %d", i+1), argv: []string{filepath.Join(s.set.bin, "api")},
			env: append(env, "TOLLGATE_ADDR="+addr), log: filepath.Join(dir, "logs", fmt.Sprintf("api%d.log", i+1))}
		s.apis = append(s.apis, p)
		s.nodes = append(s.nodes, &node{base: "http://" + addr})
		if err := s.startAPI(ctx, i); err != nil {
			return err
		}
	}
	for i := range 2 {
		p := &proc{name: fmt.Sprintf("worker %d", i+1), argv: []string{filepath.Join(s.set.bin, "worker")},
			env: env, log: filepath.Join(dir, "logs", fmt.Sprintf("worker%d.log", i+1))}
		s.workers = append(s.workers, p)
		if err := p.start(); err != nil {
			return err
		}
	}
	s.say("2 api nodes (%s, %s) and 2 workers (reconcile every 1s), upstream %s", s.nodes[0].base, s.nodes[1].base, up.base)
	return nil
}

// startAPI starts api node i and waits for its /readyz.
func (s *soak) startAPI(ctx context.Context, i int) error {
	p := s.apis[i]
	if err := p.start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.started[p.pid()] = time.Now()
	s.mu.Unlock()
	if err := waitFor(ctx, p, 60*time.Second, httpOK(s.nodes[i].base+"/readyz")); err != nil {
		return err
	}
	s.nodes[i].down.Store(false)
	return nil
}

// pgExec runs one statement on a fresh connection.
func pgExec(ctx context.Context, url, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, sql)
	return err
}

// drive runs the load, the schedule and the sampler for the duration, then
// the final flush and the audit.
func (s *soak) drive(ctx context.Context) (bool, error) {
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		MaxIdleConns: 256, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}}
	ad := admin{base: s.nodes[0].base, token: adminToken, client: client}
	p := newPlan(s.set.duration)
	if err := ad.tiers(ctx, p); err != nil {
		return false, err
	}
	tenants, err := ad.tenants(ctx, s.set.tenant, p)
	if err != nil {
		return false, err
	}
	tal := &tally{counts: map[string]int64{}}
	d := &driver{nodes: s.nodes, tenants: tenants, serviceToken: serviceToken, client: client, tally: tal, up: s.upstream}
	s.say("%d tenants (postpaid quota %d, spend cap %d units over %d, prepaid credit %d cents, fail-open); load %d ops/s from %d clients for %s",
		len(tenants), p.postQuota, p.capCents, p.billQuota, p.credit, s.set.rate, s.set.clients, s.set.duration)

	loadStart := time.Now()
	lctx, cancel := context.WithTimeout(ctx, s.set.duration)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { d.run(lctx, s.set.rate, s.set.clients) })
	wg.Go(func() { s.schedule(lctx, ad, tenants, p) })
	wg.Go(func() { s.sample(lctx) })
	wg.Wait()
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	s.say("load stopped after %s; letting the nodes report, then stopping them gracefully", time.Since(loadStart).Round(time.Second))
	time.Sleep(3 * time.Second)
	var sw sync.WaitGroup
	for _, a := range s.apis {
		sw.Go(func() { a.stop(syscall.SIGTERM, 15*time.Second) })
	}
	sw.Wait()
	ledger, err := s.finalFlush(ctx, tenants)
	if err != nil {
		return false, err
	}
	return s.report(tenants, tal, ledger), nil
}

// finalFlush waits until the workers have flushed everything: the ledger's
// totals unchanged for 5 consecutive seconds (5 worker cycles), at most 2
// minutes.
func (s *soak) finalFlush(ctx context.Context, tenants []*tenant) (map[string]billed, error) {
	deadline := time.Now().Add(2 * time.Minute)
	var last map[string]billed
	stable := 0
	for {
		cur, err := ledger(ctx, s.dbURL)
		if err != nil && time.Now().After(deadline) {
			return nil, err
		}
		if err == nil {
			if last != nil && equal(cur, last) {
				stable++
			} else {
				stable = 0
			}
			last = cur
			if stable >= 5 {
				s.say("final flush: the ledger unchanged for 5 worker cycles")
				return cur, nil
			}
			if time.Now().After(deadline) {
				s.say("final flush: the ledger still changing after 2 minutes; auditing what it holds")
				return cur, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func equal(a, b map[string]billed) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// ledger is each tenant's billed units and overage units in Postgres,
// in total and per meter (key "<tenant id>/<meter>", overage 0).
func ledger(ctx context.Context, url string) (map[string]billed, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT tenant_id::text, meter, sum(units)::bigint, sum(overage_units)::bigint FROM usage GROUP BY tenant_id, meter`)
	if err != nil {
		return nil, err
	}
	out := map[string]billed{}
	for rows.Next() {
		var id, meter string
		var b billed
		if err := rows.Scan(&id, &meter, &b.units, &b.overage); err != nil {
			return nil, err
		}
		t := out[id]
		t.units += b.units
		t.overage += b.overage
		out[id] = t
		out[id+"/"+meter] = billed{units: b.units}
	}
	return out, rows.Err()
}

// sample reads every api node's RSS and goroutines every few seconds.
func (s *soak) sample(ctx context.Context) {
	every := min(max(s.set.duration/60, 2*time.Second), 10*time.Second)
	tick := time.NewTicker(every)
	defer tick.Stop()
	c := &http.Client{Timeout: 3 * time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for i, p := range s.apis {
			pid := p.pid()
			if pid == 0 || s.nodes[i].down.Load() {
				continue
			}
			rss, err1 := rssOf(pid)
			gor, err2 := goroutines(c, s.nodes[i].base+"/metrics")
			if err1 != nil || err2 != nil {
				continue
			}
			s.mu.Lock()
			s.samples = append(s.samples, sample{node: i + 1, pid: pid, at: time.Now(), rss: rss, goroutines: gor})
			s.mu.Unlock()
		}
	}
}

// rssOf reads VmRSS of /proc/<pid>/status, in bytes.
func rssOf(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// goroutines reads go_goroutines from a /metrics page.
func goroutines(c *http.Client, url string) (int64, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return int64(f), err
		}
	}
	return 0, errors.New("no go_goroutines in " + url)
}

// report audits and prints one line per promise; true when all held.
// Times in it count from the soak's start, as the timeline does.
func (s *soak) report(tenants []*tenant, tal *tally, ledger map[string]billed) bool {
	var recs []tenantRecord
	for _, t := range tenants {
		t.mu.Lock()
		meters := map[string][4]int64{}
		for m, b := range t.byMeter {
			meters[m] = [4]int64{b[0], ledger[t.id+"/"+m].units, b[1], t.degraded[m]}
		}
		recs = append(recs, tenantRecord{id: t.id, kind: t.kind, low: t.low, high: t.high, quota: t.quota,
			capUnits: t.capUnits, billed: ledger[t.id], meters: meters})
		t.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tal.mu.Lock()
	counts := map[string]int64{}
	for k, v := range tal.counts {
		counts[k] = v
	}
	fiveXX, odd := tal.fiveXX, tal.odd
	tal.mu.Unlock()
	ops, twice := s.upstream.twice()
	warmup := max(15*time.Second, s.set.duration/5)
	vs := []verdict{
		auditCoverage(counts),
		{name: "faults-injected", held: len(s.failed) == 0 && len(s.events) > 0,
			detail: fmt.Sprintf("%d done: %s", len(s.events), strings.Join(s.events, ", "))},
		auditBilling(recs),
		auditLimit("quota-not-passed", "billed units <= monthly quota + grants (+ spend cap's units)", recs,
			func(t tenantRecord) int64 { return t.quota }, func(t tenantRecord) int64 { return t.billed.units }),
		auditLimit("spend-cap-not-passed", "overage units <= the spend cap's units", filter(recs, kindBill),
			func(t tenantRecord) int64 { return t.capUnits }, func(t tenantRecord) int64 { return t.billed.overage }),
		auditLimit("credit-not-passed", "overage units (1 cent each) <= prepaid credit in cents", filter(recs, kindPrepaid),
			func(t tenantRecord) int64 { return t.capUnits }, func(t tenantRecord) int64 { return t.billed.overage }),
		{name: "idempotent-once", held: twice == 0 && ops > 0,
			detail: fmt.Sprintf("%d admitted Idempotency-Key requests, %d run by the upstream more than once", ops, twice)},
		audit5xx(s.start, fiveXX, s.windows),
		auditOdd(s.start, odd, s.windows),
		flatness("api-rss-flat", " MiB", s.samples, s.started, warmup, s.windows,
			func(x sample) int64 { return x.rss }, 16<<20, 1<<20),
		flatness("api-goroutines-flat", "", s.samples, s.started, warmup, s.windows,
			func(x sample) int64 { return x.goroutines }, 25, 1),
	}
	if len(s.failed) > 0 {
		vs[1].detail += "; failed: " + strings.Join(s.failed, "; ")
	}
	ok := true
	for _, v := range vs {
		fmt.Fprintln(s.out, v)
		ok = ok && v.held
	}
	if ok {
		fmt.Fprintln(s.out, "soak: every promise held")
	} else {
		fmt.Fprintf(s.out, "soak: a promise is broken; the processes' logs are in %s\n", filepath.Join(s.set.dir, "logs"))
	}
	return ok
}

func filter(ts []tenantRecord, kind string) []tenantRecord {
	var out []tenantRecord
	for _, t := range ts {
		if t.kind == kind {
			out = append(out, t)
		}
	}
	return out
}
