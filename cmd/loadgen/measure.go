package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/tollgate/tollgate/internal/config"
	"github.com/tollgate/tollgate/internal/httpapi/benchpeer"
	"github.com/tollgate/tollgate/internal/postgres"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisdb"
)

// The goals of issue 12.
const (
	goalAdmittedVsRedisRate = 1.5 // metered admitted req/s ≥ this × redis_rate's
	goalRefusedVsBare       = 0.8 // metered refused req/s ≥ this × bare's
	goalRedisMicros         = 12  // Redis µs per admission ≤ this
	goalTenantBytes         = 256 // bytes a tenant keeps in Redis ≤ this
	goalP99Overhead         = time.Millisecond
)

// measure runs every row against running servers and prints the table.
func measure(ctx context.Context, o options, cfg config.Config, out io.Writer) error {
	var badURL error
	add := func(row, base, method, path string, want int) *target {
		t, err := newTarget(row, base, method, path, want, o.conns)
		badURL = cmp.Or(badURL, err)
		return t
	}
	bare := add("bare", o.bare, "GET", benchpeer.Path, 200)
	redisRate := add("redis_rate", o.redisRate, "GET", benchpeer.Path, 200)
	healthz := add("healthz", o.api, "GET", "/healthz", 200)
	admitted := add("metered admitted", o.api, "GET", "/api/demo/echo", 200)
	refused := add("metered refused", o.api, "GET", "/api/demo/echo", 429)
	check := add("/v1/check", o.api, "POST", "/v1/check", 200)
	if badURL != nil {
		return badURL
	}
	for _, t := range []*target{bare, redisRate} {
		if err := waitReady(ctx, t, benchpeer.Path); err != nil {
			return err
		}
	}
	if err := waitReady(ctx, healthz, "/readyz"); err != nil {
		return err
	}

	ten, err := newTenants(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	// (made now, before the api's first metered request loads the tiers)
	polTenants, err := newPolicyTenants(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	admitted.auth = "Bearer " + ten.admittedKey
	refused.auth = "Bearer " + ten.refusedKey
	check.auth = "Bearer " + o.serviceToken
	check.body, _ = json.Marshal(map[string]any{"tenant_id": ten.admittedID, "meter": "demo", "cost": 1})
	// The refused tenant's one request of the day, so that the next is
	// refused by Redis and every later one by the api's deny cache.
	refused.want = 200
	if err := once(refused); err != nil {
		return fmt.Errorf("using the refused tenant's daily quota: %w", err)
	}
	refused.want = 429
	if err := once(refused); err != nil {
		return fmt.Errorf("the refused tenant's second request: %w", err)
	}

	rdb, err := redisdb.Open(ctx, cfg.Redis)
	if err != nil {
		return err
	}
	defer rdb.Close()

	warm := min(o.duration/10, 500*time.Millisecond)
	fmt.Fprintf(out, "api %s, bare %s, redis_rate %s; %d CPUs shared by them, Redis and loadgen\n\n",
		o.api, o.bare, o.redisRate, runtime.NumCPU())
	fmt.Fprintf(out, "closed loop: %d connections, %s per row (after %s of warm-up)\n", o.conns, o.duration, warm)
	fmt.Fprintf(out, "%-17s %10s %7s %10s %10s %10s %8s\n", "row", "req/s", "×bare", "p50", "p99", "requests", "errors")
	res := map[string]Result{}
	redisCost := map[string]cmdStats{} // of the phases that call Redis on every request
	var cpu []cpuRow                   // where the rows' CPU went
	failed := false
	for _, t := range []*target{bare, redisRate, healthz, admitted, refused, check} {
		if err := ctx.Err(); err != nil {
			return err
		}
		closedLoop(t, warm, o.max, o.conns)
		counted := t == redisRate || t == admitted
		var before cmdStats
		if counted {
			if before, err = commandStats(ctx, rdb); err != nil {
				return err
			}
		}
		cpuBefore, err := sampleCPU(ctx, t, rdb, t.base == o.api)
		if err != nil {
			return err
		}
		r := closedLoop(t, o.duration, o.max, o.conns)
		cpuAfter, err := sampleCPU(ctx, t, rdb, t.base == o.api)
		if err != nil {
			return err
		}
		if t == bare || t == redisRate || t == admitted || t == refused {
			cpu = append(cpu, cpuPerRequest(t.row, r, cpuBefore, cpuAfter))
		}
		if counted {
			after, err := commandStats(ctx, rdb)
			if err != nil {
				return err
			}
			redisCost[t.row] = after.sub(before)
		}
		res[t.row] = r
		ratio := 0.0
		if b := res["bare"].RPS; b > 0 {
			ratio = r.RPS / b
		}
		fmt.Fprintf(out, "%-17s %10.0f %7.2f %10s %10s %10d %8d\n", r.Row, r.RPS, ratio, fmtDur(r.P50), fmtDur(r.P99), r.Requests, r.Errors)
		failed = reportErrors(out, r) || failed
	}
	memBytes, memKeys, err := tenantMemory(ctx, rdb, o.rdbPrefix, ten.admittedID)
	if err != nil {
		return err
	}

	rate := res["metered admitted"].RPS / 2
	var overhead time.Duration
	if rate >= 1 {
		fmt.Fprintf(out, "\nopen loop: %.0f req/s (half of metered admitted's saturating rate), %s per row, latency from each request's due time\n", rate, o.duration)
		fmt.Fprintf(out, "%-17s %10s %10s %10s %8s\n", "row", "p50", "p99", "requests", "errors")
		var fixed [2]Result
		for i, t := range []*target{bare, admitted} {
			fixed[i] = openLoop(t, rate, o.duration, o.max, o.conns)
			fmt.Fprintf(out, "%-17s %10s %10s %10d %8d\n", fixed[i].Row, fmtDur(fixed[i].P50), fmtDur(fixed[i].P99), fixed[i].Requests, fixed[i].Errors)
			failed = reportErrors(out, fixed[i]) || failed
		}
		overhead = fixed[1].P99 - fixed[0].P99
		fmt.Fprintf(out, "p99 overhead (metered admitted − bare): %s (goal ≤ %s)\n", fmtDur(overhead), fmtDur(goalP99Overhead))
	}

	micros, err := printRedis(out, res, redisCost)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "bytes per tenant: %d (MEMORY USAGE of %d keys %s:*{t:%s}*)\n", memBytes, memKeys, o.rdbPrefix, ten.admittedID)
	printCPU(out, cpu, goalAdmittedVsRedisRate*res["redis_rate"].RPS)

	ratio := func(a, b string) float64 {
		if res[b].RPS == 0 {
			return 0
		}
		return res[a].RPS / res[b].RPS
	}
	admittedVsRedisRate, refusedVsBare := ratio("metered admitted", "redis_rate"), ratio("metered refused", "bare")
	fmt.Fprintf(out, "\ngoals of issue 12:\n")
	for _, g := range []struct {
		pass      bool
		goal, got string
	}{
		{admittedVsRedisRate >= goalAdmittedVsRedisRate,
			fmt.Sprintf("metered admitted ≥ %.1f× redis_rate", goalAdmittedVsRedisRate), fmt.Sprintf("%.2f×", admittedVsRedisRate)},
		{refusedVsBare >= goalRefusedVsBare,
			fmt.Sprintf("metered refused ≥ %.1f× bare", goalRefusedVsBare), fmt.Sprintf("%.2f×", refusedVsBare)},
		{res["metered admitted"].OK > 0 && micros <= goalRedisMicros,
			fmt.Sprintf("Redis µs per admission ≤ %d", goalRedisMicros), fmt.Sprintf("%.2f", micros)},
		{memKeys > 0 && memBytes <= goalTenantBytes,
			fmt.Sprintf("bytes per tenant ≤ %d", goalTenantBytes), fmt.Sprintf("%d", memBytes)},
		{rate >= 1 && overhead <= goalP99Overhead,
			fmt.Sprintf("p99 overhead ≤ %s", fmtDur(goalP99Overhead)), fmtDur(overhead)},
	} {
		verdict := "FAIL"
		if g.pass {
			verdict = "PASS"
		}
		fmt.Fprintf(out, "  %s  %-38s got %s\n", verdict, g.goal, g.got)
	}

	polFailed, err := measurePolicies(ctx, o, rdb, polTenants, res, redisCost, warm, out)
	if err != nil {
		return err
	}
	failed = polFailed || failed
	if failed {
		return errors.New("some requests failed; the figures above are not to be trusted")
	}
	return nil
}

// printRedis prints what Redis spent per request during the redis_rate
// and metered admitted rows, and returns the µs per admission.
func printRedis(out io.Writer, res map[string]Result, cost map[string]cmdStats) (float64, error) {
	scripted, err := scriptedCommands()
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(out, "\nRedis, from INFO commandstats of every master before and after the row (other clients of the server count too):\n")
	fmt.Fprintf(out, "%-17s %12s %14s %12s %18s\n", "row", "µs/request", "commands/req", "evalsha µs", "µs/req, all cmds")
	micros := 0.0
	for _, row := range []string{"redis_rate", "metered admitted"} {
		n, c := res[row].OK, cost[row]
		if n == 0 {
			continue
		}
		top, all := c.total(scripted), c.total(nil)
		perReq := float64(top.usec) / float64(n)
		if row == "metered admitted" {
			micros = perReq
		}
		perCall := "-"
		if e := c["evalsha"]; e.calls > 0 {
			perCall = fmt.Sprintf("%.2f", float64(e.usec)/float64(e.calls))
		}
		fmt.Fprintf(out, "%-17s %12.2f %14.2f %12s %18.2f\n", row, perReq, float64(top.calls)/float64(n), perCall, float64(all.usec)/float64(n))
		for _, name := range []string{"evalsha_ro", "fcall", "fcall_ro"} {
			if e := c[name]; e.calls > 0 {
				fmt.Fprintf(out, "  %s: cmdstat_%s %d calls, %.2f µs per call\n", row, name, e.calls, float64(e.usec)/float64(e.calls))
			}
		}
	}
	fmt.Fprintf(out, "µs/request sums the usec of the commands clients sent: a script's includes the commands it runs, which Redis\n"+
		"also counts on their own; the last column adds those too, counting them twice.\n")
	return micros, nil
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

// tenants are loadgen's own, made afresh on every run.
type tenants struct {
	admittedID, admittedKey string // on a tier whose limits the load cannot reach
	refusedKey              string // on a tier of one request a day
}

func newTenants(ctx context.Context, dbURL string) (tenants, error) {
	db, err := postgres.Open(ctx, dbURL)
	if err != nil {
		return tenants{}, err
	}
	defer db.Close()
	store := postgres.NewStore(db)
	var ten tenants
	for _, tc := range []struct {
		tier    quota.Tier
		id, key *string
	}{
		{quota.Tier{Slug: "loadgen", Name: "Load generator", Rank: 1_000_000, Overage: quota.OverageBlock,
			Limits: unreachableLimits()}, &ten.admittedID, &ten.admittedKey},
		{quota.Tier{Slug: "loadgen-refused", Name: "Load generator, one request a day", Rank: 999_999, Overage: quota.OverageBlock,
			Limits: quota.Limits{DailyQuota: quota.Ptr(int64(1))}}, nil, &ten.refusedKey},
	} {
		id, key, err := tenantOn(ctx, store, tc.tier)
		if err != nil {
			return tenants{}, err
		}
		if tc.id != nil {
			*tc.id = id
		}
		*tc.key = key
	}
	return ten, nil
}

// unreachableLimits are the limits of a tier the load cannot reach.
func unreachableLimits() quota.Limits {
	big := quota.Ptr(quota.MaxQuantity)
	return quota.Limits{BurstRate: quota.Ptr(1e6), Burst: quota.Ptr(int64(1e9)), BucketCapacity: quota.Ptr(int64(1e9)),
		BucketRefillPerSec: quota.Ptr(1e6), DailyQuota: big, MonthlyQuota: big}
}

// tenantOn creates the tier (unless it exists), a new tenant on it and
// a key of that tenant.
func tenantOn(ctx context.Context, store *postgres.Store, tier quota.Tier) (id, key string, err error) {
	if _, err := store.CreateTier(ctx, "loadgen", tier); err != nil && quota.ErrorCode(err) != quota.CodeConflict {
		return "", "", err
	}
	t, err := store.CreateTenant(ctx, "loadgen", "loadgen", tier.Slug)
	if err != nil {
		return "", "", err
	}
	k, err := store.IssueKey(ctx, "loadgen", t.ID, "loadgen")
	if err != nil {
		return "", "", err
	}
	return t.ID, k.Secret, nil
}
