package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/config"
	"github.com/tollgate/tollgate/internal/httpapi/benchpeer"
	"github.com/tollgate/tollgate/internal/redisdb"
)

// row is one line of the closed-loop table, and what was measured
// around it.
type row struct {
	t     *target
	peer  *row // the redis_rate row its req/s is compared with, if any
	redis bool // its Redis cost is measured (INFO commandstats)
	cpu   bool // it has a line in the CPU table
	// server reads the CPU seconds its server has used so far; nil: unknown.
	server func(context.Context) (float64, error)
	// denied reads the refusals the api's deny cache has answered so far;
	// nil: the row's answers are not the deny cache's.
	denied func(context.Context) (float64, error)

	// grpc, when set, is what the row drives instead of t (which then
	// only names the row).
	grpc *grpcTarget

	res  Result
	cost cmdStats // INFO commandstats over the measured run, when redis
	use  cpuRow
}

// rows are the closed-loop table's rows, in the order they run.
type rows struct {
	bare, redisRate, redisRateKeys, healthz, hot, many, refused, check *row
	grpc                                                               *row // nil without -grpc
}

func (rs rows) all() []*row {
	all := []*row{rs.bare, rs.redisRate, rs.redisRateKeys, rs.healthz, rs.hot, rs.many, rs.refused, rs.check}
	if rs.grpc != nil {
		all = append(all, rs.grpc)
	}
	return all
}

// measure runs every row against running servers and prints the tables.
func measure(ctx context.Context, o options, cfg config.Config, drv driver, out io.Writer) error {
	var badURL error
	add := func(label, base, method, path string, want int) *row {
		t, err := newTarget(label, base, method, path, want, o.conns)
		badURL = cmp.Or(badURL, err)
		return &row{t: t}
	}
	rs := rows{
		bare:          add("bare Fiber", o.bare, "GET", benchpeer.Path, 200),
		redisRate:     add("redis_rate, 1 key", o.redisRate, "GET", benchpeer.Path, 200),
		redisRateKeys: add(fmt.Sprintf("redis_rate, %d keys", o.tenants), o.redisRate, "GET", benchpeer.KeyedPath, 200),
		healthz:       add("api /healthz", o.api, "GET", "/healthz", 200),
		hot:           add("admitted, 1 tenant", o.api, "GET", "/api/demo/echo", 200),
		many:          add(fmt.Sprintf("admitted, %d tenants", o.tenants), o.api, "GET", "/api/demo/echo", 200),
		refused:       add("refused (deny cache)", o.api, "GET", "/api/demo/echo", 429),
		check:         add("POST /v1/check", o.api, "POST", "/v1/check", 200),
	}
	if badURL != nil {
		return badURL
	}
	// (the refused row's reference is bare Fiber: it calls no Redis)
	rs.hot.peer, rs.check.peer, rs.many.peer = rs.redisRate, rs.redisRate, rs.redisRateKeys
	for _, r := range []*row{rs.redisRate, rs.redisRateKeys, rs.hot, rs.many, rs.refused, rs.check} {
		r.redis = true
	}
	for _, r := range []*row{rs.bare, rs.redisRate, rs.redisRateKeys, rs.hot, rs.many, rs.refused} {
		r.cpu = true
	}
	rs.bare.server, rs.redisRate.server, rs.redisRateKeys.server = procCPUOf(o.barePID), procCPUOf(o.redisRatePID), procCPUOf(o.redisRatePID)
	for _, r := range []*row{rs.healthz, rs.hot, rs.many, rs.refused, rs.check} {
		r.server = apiCPUOf(o.api)
	}
	rs.refused.denied = func(ctx context.Context) (float64, error) {
		return apiMetric(ctx, o.api, "tollgate_deny_cache_hits_total")
	}

	for _, r := range []*row{rs.bare, rs.redisRate} {
		if err := waitReady(ctx, r.t, benchpeer.Path); err != nil {
			return err
		}
	}
	if err := waitReady(ctx, rs.healthz.t, "/readyz"); err != nil {
		return err
	}

	// Every tier is made now, before the api's first metered request
	// loads the tiers.
	ten, err := newTenants(ctx, cfg.DatabaseURL, o.tenants)
	if err != nil {
		return err
	}
	defer func() {
		// a fresh context: the run's may have ended
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := deleteTenants(cctx, cfg.DatabaseURL, ten.manyIDs); err != nil {
			fmt.Fprintf(out, "deleting the %d tenants of this run: %v\n", len(ten.manyIDs), err)
		}
	}()
	polTenants, err := newPolicyTenants(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	rs.hot.t.auth = "Bearer " + ten.admittedKey
	rs.refused.t.auth = "Bearer " + ten.refusedKey
	rs.check.t.auth = "Bearer " + o.serviceToken
	rs.check.t.body, _ = json.Marshal(map[string]any{"tenant_id": ten.decideID, "meter": "demo", "cost": 1})
	for _, k := range ten.manyKeys {
		// the api's key, and the peer's key of the same client
		rs.many.t.keys = append(rs.many.t.keys, "Bearer "+k)
	}
	rs.redisRateKeys.t.keys = rs.many.t.keys
	if o.grpc != "" {
		const label = "gRPC ShouldRateLimit"
		g, err := newGRPCTarget(label, o.grpc, ten.decideKey, "demo", o.threads)
		if err != nil {
			return fmt.Errorf("-grpc: %w", err)
		}
		defer g.close()
		rs.grpc = &row{t: &target{row: label}, grpc: g, peer: rs.redisRate, redis: true, server: apiCPUOf(o.api)}
	}
	// The refused tenant's one request of the day, so that the next is
	// refused by Redis and every later one by the api's deny cache.
	if err := primeRefused(rs.refused.t); err != nil {
		return err
	}

	rdb, err := redisdb.Open(ctx, cfg.Redis)
	if err != nil {
		return err
	}
	defer rdb.Close()

	warm := min(o.duration/10, 500*time.Millisecond)
	fmt.Fprintf(out, "api %s, bare %s, redis_rate %s; %d CPUs shared by them, Redis and the load generator%s\n\n",
		o.api, o.bare, o.redisRate, runtime.NumCPU(), loadAverage())
	fmt.Fprintf(out, "closed loop: %d connections, %s a row (after %s of warm-up by loadgen's own driver), driven by %s\n",
		o.conns, o.duration, warm, drv)
	fmt.Fprintf(out, "%-22s %10s %6s %11s %10s %10s %10s %8s\n", "row", "req/s", "×bare", "×redis_rate", "p50", "p99", "requests", "errors")
	failed := false
	for _, r := range rs.all() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := runRow(ctx, r, drv, rdb, warm, o); err != nil {
			return err
		}
		fmt.Fprintln(out, r.line(rs.bare))
		failed = reportErrors(out, r.res) || failed
	}
	hotBytes, hotKeys, err := tenantMemory(ctx, rdb, o.rdbPrefix, ten.admittedID)
	if err != nil {
		return err
	}
	manyBytes, manyKeys, err := tenantsMemory(ctx, rdb, o.rdbPrefix, ten.manyIDs)
	if err != nil {
		return err
	}
	decideBytes, decideKeys, err := tenantMemory(ctx, rdb, o.rdbPrefix, ten.decideID)
	if err != nil {
		return err
	}

	manyMean := int64(-1)
	if manyKeys > 0 {
		manyMean = manyBytes / int64(len(ten.manyIDs))
	}
	f := figures{
		hotVsRedisRate:  ratioOf(rs.hot.res.RPS, rs.redisRate.res.RPS),
		manyVsRedisRate: ratioOf(rs.many.res.RPS, rs.redisRateKeys.res.RPS),
		refusedVsBare:   ratioOf(rs.refused.res.RPS, rs.bare.res.RPS),
		hotMicros:       redisMicros(rs.hot),
		manyMicros:      redisMicros(rs.many),
		tenantBytes:     manyMean,
		tenants:         o.tenants,
	}
	if hotKeys > 0 {
		f.tenantBytes = max(f.tenantBytes, hotBytes)
	}
	rate := rs.hot.res.RPS / 2
	if rate >= 1 {
		fmt.Fprintf(out, "\nopen loop (loadgen's own driver): %.0f req/s (half of %s's saturating rate), %s a row, latency from each request's due time\n",
			rate, rs.hot.t.row, o.duration)
		fmt.Fprintf(out, "%-22s %10s %10s %10s %8s\n", "row", "p50", "p99", "requests", "errors")
		var fixed [2]Result
		for i, t := range []*target{rs.bare.t, rs.hot.t} {
			fixed[i] = openLoop(t, rate, o.duration, o.max, o.conns)
			fmt.Fprintf(out, "%-22s %10s %10s %10d %8d\n", fixed[i].Row, fmtDur(fixed[i].P50), fmtDur(fixed[i].P99), fixed[i].Requests, fixed[i].Errors)
			failed = reportErrors(out, fixed[i]) || failed
		}
		f.p99Overhead, f.openLoop = fixed[1].P99-fixed[0].P99, true
		fmt.Fprintf(out, "p99 overhead (%s − bare Fiber): %s\n", rs.hot.t.row, fmtDur(f.p99Overhead))
	}

	if err := printRedis(out, rs.all()); err != nil {
		return err
	}
	fmt.Fprintf(out, "bytes per tenant: %d for %s (MEMORY USAGE of its %d keys %s:*{t:<id>}*), %d on average for the %d tenants (%d keys)\n",
		hotBytes, rs.hot.t.row, hotKeys, o.rdbPrefix, max(manyMean, 0), len(ten.manyIDs), manyKeys)
	if decideKeys > 1 {
		fmt.Fprintf(out, "decision API rows' tenant: %d keys, %d bytes: about %d bytes a counted decision, its settle reservation kept 10 minutes\n",
			decideKeys, decideBytes, decideBytes/int64(decideKeys))
	}
	printCPU(out, rs, goalHotVsRedisRate*rs.redisRate.res.RPS)

	fmt.Fprintf(out, "\ngoals (ratios of this run):\n")
	printGoals(out, evaluate(f))

	polFailed, err := measurePolicies(ctx, o, drv, rdb, polTenants, rs, warm, out)
	if err != nil {
		return err
	}
	failed = polFailed || failed
	if failed {
		return errors.New("some requests failed; the figures above are not to be trusted")
	}
	return nil
}

// loadAverage says how busy the machine was before the run (other work
// on it slows every row), from /proc/loadavg; "" where there is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return fmt.Sprintf(" (load average before the run: %s %s %s)", f[0], f[1], f[2])
	}
	return ""
}

// runRow warms r's server up, then drives r with drv, measuring Redis
// and CPU around it.
func runRow(ctx context.Context, r *row, drv driver, rdb redis.UniversalClient, warm time.Duration, o options) error {
	if r.grpc != nil {
		r.grpc.closedLoop(ctx, warm, o.max, o.conns)
	} else {
		closedLoop(r.t, warm, o.max, o.conns)
	}
	var before cmdStats
	var err error
	if r.redis {
		if before, err = commandStats(ctx, rdb); err != nil {
			return err
		}
	}
	var deniedBefore float64
	if r.denied != nil {
		if deniedBefore, err = r.denied(ctx); err != nil {
			return err
		}
	}
	cpuBefore, err := sampleCPU(ctx, rdb, r.server)
	if err != nil {
		return err
	}
	if r.grpc != nil {
		r.res = r.grpc.closedLoop(ctx, o.duration, o.max, o.conns)
	} else if r.res, err = drv.closedLoop(ctx, r.t, o.duration, o.conns); err != nil {
		return err
	}
	cpuAfter, err := sampleCPU(ctx, rdb, r.server)
	if err != nil {
		return err
	}
	r.use = cpuPerRequest(r.t.row, r.res, cpuBefore, cpuAfter)
	if r.denied != nil {
		deniedAfter, err := r.denied(ctx)
		if err != nil {
			return err
		}
		r.res = fromDenyCache(r.res, int64(deniedAfter-deniedBefore))
	}
	if r.redis {
		after, err := commandStats(ctx, rdb)
		if err != nil {
			return err
		}
		r.cost = after.sub(before)
	}
	return nil
}

// fromDenyCache counts as errors the wanted answers of r beyond the
// refusals the deny cache answered during the row (denied): wrk knows
// an answer was 400 or more, not that it was the deny cache's 429. The
// api counts the answers to requests still in flight when the row ended
// too, so denied may exceed r's answers.
func fromDenyCache(r Result, denied int64) Result {
	if extra := r.OK - denied; extra > 0 {
		r.OK, r.Errors = denied, r.Errors+extra
		if r.FirstErr == "" {
			r.FirstErr = fmt.Sprintf("%d of the answers were not refusals of the deny cache (its tollgate_deny_cache_hits_total grew by %d)", extra, denied)
		}
	}
	return r
}

// line formats r under the closed-loop table's header.
func (r *row) line(bare *row) string {
	vsPeer := "-"
	if r.peer != nil {
		vsPeer = fmt.Sprintf("%.2f", ratioOf(r.res.RPS, r.peer.res.RPS))
	}
	return fmt.Sprintf("%-22s %10.0f %6.2f %11s %10s %10s %10d %8d", r.t.row, r.res.RPS, ratioOf(r.res.RPS, bare.res.RPS), vsPeer,
		fmtDur(r.res.P50), fmtDur(r.res.P99), r.res.Requests, r.res.Errors)
}

// primeRefused spends the refused tenant's one request of the day, then
// sees the next refused.
func primeRefused(t *target) error {
	want := t.want
	defer func() { t.want = want }()
	t.want = 200
	if err := once(t); err != nil {
		return fmt.Errorf("using the refused tenant's daily quota: %w", err)
	}
	t.want = 429
	if err := once(t); err != nil {
		return fmt.Errorf("the refused tenant's second request: %w", err)
	}
	return nil
}

// redisMicros is Redis's µs per admission of r: the usec of the commands
// clients sent during the row (scripts with the commands they run, and
// any other) over its admissions; NaN when nothing was admitted.
func redisMicros(r *row) float64 {
	scripted, err := scriptedCommands()
	if err != nil || r.res.OK == 0 {
		return math.NaN()
	}
	return float64(r.cost.total(scripted).usec) / float64(r.res.OK)
}

// printRedis prints what Redis spent per answer of each row that calls it.
func printRedis(out io.Writer, rows []*row) error {
	scripted, err := scriptedCommands()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nRedis, from INFO commandstats of every master before and after each row:\n")
	fmt.Fprintf(out, "%-22s %10s %12s %11s %13s %13s  %s\n", "row", "answers", "scripts/ans", "µs/script", "µs/answer", "all cmds µs", "scripts run")
	for _, r := range rows {
		n := r.res.OK
		if !r.redis || n == 0 {
			continue
		}
		top, all, scripts := r.cost.total(scripted), r.cost.total(nil), scriptCost(r.cost)
		perScript, ran := "-", []string{}
		if scripts.calls > 0 {
			perScript = fmt.Sprintf("%.2f", float64(scripts.usec)/float64(scripts.calls))
		}
		for _, name := range scriptCommands {
			if c := r.cost[name]; c.calls > 0 {
				ran = append(ran, fmt.Sprintf("%s %d", name, c.calls))
			}
		}
		fmt.Fprintf(out, "%-22s %10d %12.2f %11s %13.2f %13.2f  %s\n", r.t.row, n, float64(scripts.calls)/float64(n), perScript,
			float64(top.usec)/float64(n), float64(all.usec)/float64(n), cmp.Or(strings.Join(ran, ", "), "none"))
	}
	fmt.Fprintf(out, "answers: the row's wanted answers (admissions; the refused row's 429s). scripts: eval, evalsha, fcall and their _ro\n"+
		"forms. µs/answer: usec of the commands clients sent (scripts with the commands they run, and any other), per\n"+
		"answer: Redis's time per admission. all cmds µs adds the commands scripts run once more (Redis counts them\n"+
		"on their own too). Every client of the server counts: the bench's own Redis has no others.\n")
	return nil
}

// reportErrors prints a row's first error, and says whether it had any.
func reportErrors(out io.Writer, r Result) bool {
	if r.Errors == 0 {
		return false
	}
	fmt.Fprintf(out, "  %s: %d of %d requests failed; first: %s\n", r.Row, r.Errors, r.Requests, r.FirstErr)
	return true
}

// fmtDur prints a latency in ms with µs precision.
func fmtDur(d time.Duration) string {
	return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond))
}

// once sends t's request once.
func once(t *target) error {
	req, resp, release := t.newRequest()
	defer release()
	return t.send(req, resp)
}

// waitReady waits up to 30s for GET path of t's server to answer 200.
func waitReady(ctx context.Context, t *target, path string) error {
	probe := target{row: t.row, client: t.client, method: "GET", uri: t.base + path, want: 200}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := once(&probe)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer 200 within 30s: %w", probe.uri, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
