package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/quota"
)

// The policies table: for each algorithm, one policy (API.md "Policies
// (v2)") on a tier of its own, created through the admin API, and the
// metered route driven for a tenant of that tier.
const (
	policyPrefix   = "loadgen-pol-"  // of the policies' names and of their tiers' slugs
	policyRankBase = 999_000         // the tiers' ranks: policyRankBase + the algorithm's index
	policyApplied  = 5 * time.Second // how long the api has to apply a policy (API.md: within 1 s)
)

// benchPolicy is the policy of alg for the policies table: matched by the
// tier alone, scope tenant (adaptive: node), cost requests, on_refuse
// reject, and limits that the load of one machine cannot reach, so that
// every request is admitted at steady state (policyCapacity says how much
// each admits; the table shows the refusals, if any).
func benchPolicy(alg quota.Algorithm, name, tier string) quota.Policy {
	p := quota.Policy{Name: name, Algorithm: alg, Match: quota.PolicyMatch{Tiers: []string{tier}},
		Scope: quota.ScopeTenant, Cost: quota.CostRequests, OnRefuse: quota.RefuseReject}
	switch alg {
	case quota.AlgFixedWindow:
		p.Limit, p.WindowSeconds = quota.Ptr(int64(1e9)), quota.Ptr(int64(1))
	case quota.AlgSlidingLog:
		// The most a sliding log admits: its limit is at most 100000 and its
		// window at least 1 s (a longer window admits fewer a second).
		p.Limit, p.WindowSeconds = quota.Ptr(int64(quota.MaxSlidingLogLimit)), quota.Ptr(int64(1))
	case quota.AlgSlidingWindow:
		p.Limit, p.WindowSeconds, p.Buckets = quota.Ptr(int64(1e9)), quota.Ptr(int64(1)), quota.Ptr(int64(10))
	case quota.AlgTokenBucket:
		p.Capacity, p.RefillPerSec = quota.Ptr(int64(1e6)), quota.Ptr(1e6)
	case quota.AlgGCRA, quota.AlgLeakyBucket:
		p.Rate, p.Burst = quota.Ptr(1e6), quota.Ptr(int64(1e6))
	case quota.AlgConcurrency:
		p.Limit, p.LeaseSeconds = quota.Ptr(int64(quota.MaxConcurrencyLimit)), quota.Ptr(int64(60))
	case quota.AlgWarmUp:
		p.Rate, p.WarmupSeconds, p.ColdFactor = quota.Ptr(1e6), quota.Ptr(int64(1)), quota.Ptr(int64(3))
	case quota.AlgAdaptive:
		p.Scope = quota.ScopeNode
		p.MaxConcurrency, p.TargetLatencyMS = quota.Ptr(int64(quota.MaxConcurrencyLimit)), quota.Ptr(int64(1000))
	}
	return p
}

// policyCapacity is what p admits at most at steady state: requests a
// second (0: no such bound) and requests in flight at once (0: no such
// bound). warm_up counts at its cold rate, the slowest it admits.
func policyCapacity(p quota.Policy) (perSec float64, inFlight int64) {
	switch p.Algorithm {
	case quota.AlgFixedWindow, quota.AlgSlidingLog, quota.AlgSlidingWindow:
		return float64(*p.Limit) / float64(*p.WindowSeconds), 0
	case quota.AlgTokenBucket:
		return *p.RefillPerSec, 0
	case quota.AlgGCRA, quota.AlgLeakyBucket:
		return *p.Rate, 0
	case quota.AlgWarmUp:
		return *p.Rate / float64(*p.ColdFactor), 0
	case quota.AlgConcurrency:
		return 0, *p.Limit
	case quota.AlgAdaptive:
		return 0, *p.MaxConcurrency
	}
	return 0, 0
}

// slugOf turns an algorithm's name into slug form (fixed-window).
func slugOf(alg quota.Algorithm) string { return strings.ReplaceAll(string(alg), "_", "-") }

// policyName names alg's policy of run: unique per run, so that a run
// never reads state a previous one left in Redis.
func policyName(alg quota.Algorithm, run string) string {
	return policyPrefix + slugOf(alg) + "-" + run
}

// policyKeyPattern is the SCAN pattern of the Redis keys of the named
// tenant-scoped policy of the tenant: <prefix>:pol:{t:<tenant>}:<name>.<digest>:<value>
// (ratelimit.Runner.PolicyKey).
func policyKeyPattern(prefix, tenantID, name string) string {
	return prefix + ":pol:{t:" + tenantID + "}:" + name + ".*"
}

// policyItemNames returns the names of the items of a RateLimit-Policy
// field (a structured-field list: `"burst";q=20;w=2, "daily";q=1000`),
// sf-strings unescaped.
func policyItemNames(field string) []string {
	var names []string
	s := field
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return names
		}
		if s[0] == '"' {
			var b strings.Builder
			i := 1
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				b.WriteByte(s[i])
			}
			names = append(names, b.String())
			s = s[min(i+1, len(s)):]
		} else {
			end := strings.IndexAny(s, ";,")
			if end < 0 {
				end = len(s)
			}
			names = append(names, strings.TrimSpace(s[:end]))
			s = s[end:]
		}
		var more bool
		if s, more = afterItem(s); !more {
			return names
		}
	}
}

// afterItem returns what follows the comma that ends the list member s is
// in (its parameters skipped, quoted strings included), and whether there
// is one.
func afterItem(s string) (string, bool) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == ',':
			return s[i+1:], true
		}
	}
	return "", false
}

// scriptCommands are the commands a Lua script runs as.
var scriptCommands = []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}

// scriptCost sums the calls and usec of the script commands of s.
func scriptCost(s cmdStats) cmdStat {
	var t cmdStat
	for _, name := range scriptCommands {
		t.calls += s[name].calls
		t.usec += s[name].usec
	}
	return t
}

// policyRow is one line of the policies table.
type policyRow struct {
	label           string
	rps             float64
	vsBare, vsPlain float64
	p99             time.Duration
	requests        int64
	script          cmdStat // the row's script commands
	inRedis         bool    // the policy keeps keys in Redis
	memBytes        int64
	memKeys         int
	refused, errors int64
	firstErr        string
	note            string // in place of the figures: why there are none
}

const policyHeader = "%-15s %9s %6s %7s %10s %12s %8s %10s %5s %9s %7s\n"

func printPolicyHeader(out io.Writer) {
	fmt.Fprintf(out, policyHeader, "algorithm", "req/s", "×bare", "×plain", "p99", "µs/decision", "evals/req", "bytes/key", "keys", "refused", "errors")
}

// String formats the row under printPolicyHeader's columns.
func (r policyRow) String() string {
	if r.note != "" {
		return fmt.Sprintf("%-15s %s", r.label, r.note)
	}
	micros, calls := "-", "-"
	if r.requests > 0 {
		micros = fmt.Sprintf("%.2f", float64(r.script.usec)/float64(r.requests))
		calls = fmt.Sprintf("%.2f", float64(r.script.calls)/float64(r.requests))
	}
	bytes, keys := "-", "-"
	if r.inRedis {
		keys = fmt.Sprint(r.memKeys)
		if r.memKeys > 0 {
			bytes = fmt.Sprint((r.memBytes + int64(r.memKeys)/2) / int64(r.memKeys))
		}
	}
	return fmt.Sprintf("%-15s %9.0f %6.2f %7.2f %10s %12s %8s %10s %5s %9d %7d",
		r.label, r.rps, r.vsBare, r.vsPlain, fmtDur(r.p99), micros, calls, bytes, keys, r.refused, r.errors)
}

func ratioOf(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// adminAPI calls the api's admin routes with the admin token.
type adminAPI struct {
	client *fasthttp.HostClient
	base   string
	token  string
}

// do sends one admin request, with body as JSON when not nil, and
// returns the status and body of the answer.
func (a adminAPI) do(method, path string, body any) (int, []byte, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI(a.base + path)
	req.Header.Set("Authorization", "Bearer "+a.token)
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(b)
	}
	if err := a.client.DoTimeout(req, resp, 10*time.Second); err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

// deletePolicy deletes the named policy; one already gone is no error.
func (a adminAPI) deletePolicy(name string) error {
	status, body, err := a.do("DELETE", "/admin/v1/policies/"+url.PathEscape(name), nil)
	if err != nil {
		return err
	}
	if status != 204 && status != 404 {
		return fmt.Errorf("DELETE /admin/v1/policies/%s: status %d: %.200s", name, status, body)
	}
	return nil
}

// stalePolicies lists the policies of earlier runs (named policyPrefix…),
// which a run that was killed could not delete.
func (a adminAPI) stalePolicies() ([]string, error) {
	var names []string
	cursor := ""
	for range 1000 {
		path := "/admin/v1/policies?limit=100"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		status, body, err := a.do("GET", path, nil)
		if err != nil {
			return nil, err
		}
		if status != 200 {
			return nil, fmt.Errorf("GET /admin/v1/policies: status %d: %.200s", status, body)
		}
		var page struct {
			Items []struct {
				Name string `json:"name"`
			} `json:"items"`
			NextCursor *string `json:"next_cursor"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return nil, fmt.Errorf("GET /admin/v1/policies: %w", err)
		}
		for _, it := range page.Items {
			if strings.HasPrefix(it.Name, policyPrefix) {
				names = append(names, it.Name)
			}
		}
		if page.NextCursor == nil || *page.NextCursor == "" {
			break
		}
		cursor = *page.NextCursor
	}
	return names, nil
}

// policyTenant is the tenant of one algorithm's row.
type policyTenant struct {
	alg      quota.Algorithm
	tier     string
	id, key  string
	inRedis  bool
	capacity float64 // policyCapacity's req/s
}

// newPolicyTenants makes, in Postgres as newTenants does, a tier per
// algorithm (kept from run to run) with limits the load cannot reach, and
// a new tenant of each with a key. A tier made after the api loaded its
// tiers is unknown to it until its catalog's next refresh: they are made
// before the first metered request.
func newPolicyTenants(ctx context.Context, dbURL string) ([]policyTenant, error) {
	db, err := pgdb.Open(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	store := catalogdb.NewStore(db)
	out := make([]policyTenant, 0, len(quota.Algorithms))
	for i, alg := range quota.Algorithms {
		tier := quota.Tier{Slug: policyPrefix + slugOf(alg), Name: "Load generator, " + string(alg) + " policy",
			Rank: policyRankBase + i, Overage: quota.OverageBlock, Limits: unreachableLimits()}
		id, key, err := tenantOn(ctx, store, tier)
		if err != nil {
			return nil, fmt.Errorf("the %s policy's tenant: %w", alg, err)
		}
		p := benchPolicy(alg, "x", tier.Slug)
		perSec, _ := policyCapacity(p)
		out = append(out, policyTenant{alg: alg, tier: tier.Slug, id: id, key: key, inRedis: p.InRedis(), capacity: perSec})
	}
	return out, nil
}

// measurePolicies prints the policies table: a row per algorithm, driven
// closed-loop by drv for half of -duration, beside bare's and the hot
// tenant's rows of the same run. It says whether requests failed.
func measurePolicies(ctx context.Context, o options, drv driver, rdb redis.UniversalClient, tens []policyTenant,
	rs rows, warm time.Duration, out io.Writer) (bool, error) {
	fmt.Fprintf(out, "\npolicies: ")
	if o.adminToken == "" {
		fmt.Fprintf(out, "skipped: TOLLGATE_ADMIN_TOKEN is not set\n")
		return false, nil
	}
	at, err := newTarget("admin", o.api, "GET", "/", 200, 2)
	if err != nil {
		return false, err
	}
	admin := adminAPI{client: at.client, base: at.base, token: o.adminToken}

	status, body, err := admin.do("GET", "/admin/v1/policies?limit=1", nil)
	if err != nil {
		return false, err
	}
	if status == 404 || status == 405 {
		fmt.Fprintf(out, "skipped: the api answers %d to GET /admin/v1/policies (a build without policies)\n", status)
		return false, nil
	}
	if status != 200 {
		return false, fmt.Errorf("GET /admin/v1/policies: status %d: %.200s", status, body)
	}
	// Policies a killed run left behind would match the tiers of the rows.
	stale, err := admin.stalePolicies()
	if err != nil {
		return false, err
	}
	for _, name := range stale {
		if err := admin.deletePolicy(name); err != nil {
			return false, err
		}
	}

	var rb [4]byte
	if _, err := rand.Read(rb[:]); err != nil {
		return false, err
	}
	run := hex.EncodeToString(rb[:])
	created := map[string]bool{}
	defer func() {
		// even when the run ends early; a run killed outright leaves them to
		// the next, which deletes them above
		for name := range created {
			_ = admin.deletePolicy(name)
		}
	}()

	rowDur := max(o.duration/2, 100*time.Millisecond)
	fmt.Fprintf(out, "one per row, on a tier of its own (match: tiers), scope tenant (adaptive: node), cost requests, on_refuse reject;\n"+
		"closed loop, %d connections, %s a row (after %s of warm-up), driven as the rows above; run %s\n", o.conns, rowDur, warm, run)
	printPolicyHeader(out)
	bareRPS, plain := rs.bare.res.RPS, rs.hot.res
	fmt.Fprintln(out, policyRow{label: "(no policy)", rps: plain.RPS, vsBare: ratioOf(plain.RPS, bareRPS), vsPlain: ratioOf(plain.RPS, plain.RPS),
		p99: plain.P99, requests: plain.Requests, script: scriptCost(rs.hot.cost),
		refused: plain.Refused, errors: plain.Errors})

	failed := false
	var short []string
	for _, pt := range tens {
		if err := ctx.Err(); err != nil {
			return failed, err
		}
		name := policyName(pt.alg, run)
		p := benchPolicy(pt.alg, name, pt.tier)
		status, body, err := admin.do("POST", "/admin/v1/policies", p)
		if err != nil {
			return failed, err
		}
		if status != 201 {
			return failed, fmt.Errorf("creating the %s policy: POST /admin/v1/policies: status %d: %.300s", pt.alg, status, body)
		}
		created[name] = true
		row, err := policyRun(ctx, o, drv, rdb, pt, name, warm, rowDur)
		if err != nil {
			return failed, err
		}
		if err := admin.deletePolicy(name); err != nil {
			return failed, err
		}
		delete(created, name)
		row.vsBare, row.vsPlain = ratioOf(row.rps, bareRPS), ratioOf(row.rps, plain.RPS)
		fmt.Fprintln(out, row)
		if row.note == "" && pt.capacity > 0 && pt.capacity < 1.2*max(row.rps, plain.RPS) {
			short = append(short, fmt.Sprintf("%s admits at most %.0f req/s", pt.alg, pt.capacity))
		}
		if row.errors > 0 {
			fmt.Fprintf(out, "  %s: %d of %d requests failed; first: %s\n", pt.alg, row.errors, row.requests, row.firstErr)
			failed = true
		}
	}
	fmt.Fprintf(out, "µs/decision: usec of the script commands (eval, evalsha, fcall and their _ro forms) during the row over\n"+
		"its requests, evals/req their calls per request (concurrency adds the lease's release after the answer); (no policy)\n"+
		"is the hot tenant's row above. bytes/key: MEMORY USAGE of the policy's keys (%s) halfway\n"+
		"through the row, per key; adaptive keeps no keys (node-local). refused: 429s (wrk: every answer of 400 or more),\n"+
		"counted apart from errors.\n",
		policyKeyPattern(o.rdbPrefix, "<tenant>", "<name>"))
	if len(short) > 0 {
		fmt.Fprintf(out, "note: near or below the rate driven: %s\n", strings.Join(short, "; "))
	}
	return failed, nil
}

// policyRun waits until the api applies the named policy to pt's tenant,
// then drives the metered route for that tenant: warm, then rowDur
// measured, with the Redis cost of the row and the policy's memory
// halfway through it.
func policyRun(ctx context.Context, o options, drv driver, rdb redis.UniversalClient, pt policyTenant, name string, warm, rowDur time.Duration) (policyRow, error) {
	row := policyRow{label: string(pt.alg), inRedis: pt.inRedis}
	t, err := newTarget(string(pt.alg), o.api, "GET", "/api/demo/echo", 200, o.conns)
	if err != nil {
		return row, err
	}
	t.auth, t.refuse = "Bearer "+pt.key, 429
	applied, last, err := waitPolicy(ctx, t, name, policyApplied)
	if err != nil {
		return row, err
	}
	if !applied {
		row.note = fmt.Sprintf("not measured: no answer named it in RateLimit-Policy within %s (last: %s)", policyApplied, last)
		return row, nil
	}
	closedLoop(t, warm, o.max, o.conns)
	before, err := commandStats(ctx, rdb)
	if err != nil {
		return row, err
	}
	type sample struct {
		bytes int64
		keys  int
		err   error
	}
	mem := make(chan sample, 1)
	go func() {
		if !pt.inRedis {
			mem <- sample{}
			return
		}
		select {
		case <-time.After(rowDur / 2):
		case <-ctx.Done():
			mem <- sample{err: ctx.Err()}
			return
		}
		b, k, err := keysMemory(ctx, rdb, policyKeyPattern(o.rdbPrefix, pt.id, name))
		mem <- sample{b, k, err}
	}()
	r, err := drv.closedLoop(ctx, t, rowDur, o.conns)
	if err != nil {
		return row, err
	}
	after, err := commandStats(ctx, rdb)
	if err != nil {
		return row, err
	}
	m := <-mem
	if m.err != nil {
		return row, m.err
	}
	row.rps, row.p99, row.requests = r.RPS, r.P99, r.Requests
	row.script = scriptCost(after.sub(before))
	row.memBytes, row.memKeys = m.bytes, m.keys
	row.refused, row.errors = r.Refused, r.Errors
	row.firstErr = r.FirstErr
	return row, nil
}

// waitPolicy sends t's request until an answer's RateLimit-Policy has an
// item named name, for at most limit; it returns whether one did, and
// the last answer's status and field.
func waitPolicy(ctx context.Context, t *target, name string, limit time.Duration) (bool, string, error) {
	req, resp, release := t.newRequest()
	defer release()
	deadline := time.Now().Add(limit)
	var last string // what the last answer was, set by every round
	for {
		if err := t.client.Do(req, resp); err != nil {
			last = err.Error()
		} else {
			items := policyItemNames(string(resp.Header.Peek("RateLimit-Policy")))
			if slices.Contains(items, name) {
				return true, "", nil
			}
			last = fmt.Sprintf("status %d, items %s", resp.StatusCode(), strings.Join(items, " "))
		}
		if time.Now().After(deadline) {
			return false, last, nil
		}
		select {
		case <-ctx.Done():
			return false, last, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
