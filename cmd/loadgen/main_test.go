package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/httpapi/benchpeer"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

func TestLoopbackURL(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"http://127.0.0.1:8080", true},
		{"http://127.9.9.9:1", true},
		{"http://[::1]:8080", true},
		{"http://localhost:8080", true},
		{"https://127.0.0.1:8080", false},
		{"http://10.0.0.1:8080", false},
		{"http://192.168.1.2", false},
		{"http://example.com", false},
	} {
		if err := loopbackURL(tc.url); (err == nil) != tc.ok {
			t.Errorf("loopbackURL(%q) = %v, want ok=%t", tc.url, err, tc.ok)
		}
	}
}

func TestRunRefusesWhatItMustNotDo(t *testing.T) {
	env := map[string]string{"TOLLGATE_SERVICE_TOKEN": "service-token-for-tests-0123"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-url", "http://10.1.2.3:8080"}, "-url"},
		{[]string{"-bare", "http://example.com"}, "-bare"},
		{[]string{"-peer", "bare", "-addr", "0.0.0.0:0"}, "-addr"},
		{[]string{"-peer", "nginx", "-addr", "127.0.0.1:0"}, "-peer"},
		{[]string{"-duration", "1h"}, "-duration"},
		{[]string{"-max", "0"}, "-max"},
		{[]string{"-conns", "0"}, "-conns"},
		{[]string{"-threads", "0"}, "-threads"},
		{[]string{"-threads", "65"}, "-threads"},
		{[]string{"-tenants", "0"}, "-tenants"},
		{[]string{"-tenants", "10001"}, "-tenants"},
		{[]string{"-bare-pid", "-1"}, "-bare-pid"},
		{[]string{"-wrk", "/nonexistent/wrk"}, "-wrk"},
		{[]string{"-grpc", "10.1.2.3:9090"}, "-grpc"},
	} {
		err := run(t.Context(), tc.args, func(k string) string { return env[k] }, &strings.Builder{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 200; i++ {
		s = append(s, time.Duration(i))
	}
	for _, tc := range []struct {
		in   []time.Duration
		p    int
		want time.Duration
	}{
		{s, 50, 100},
		{s, 99, 198},
		{s, 100, 200},
		{s[:1], 99, 1},
		{s[:3], 50, 2},
	} {
		if got := percentile(tc.in, tc.p); got != tc.want {
			t.Errorf("percentile(1..%d, %d) = %d, want %d", len(tc.in), tc.p, got, tc.want)
		}
	}
}

func TestParseCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=10,usec=95,usec_per_call=9.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_client|setinfo:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=4,usec=400,usec_per_call=100.00\r\n"
	before, after := cmdStats{}, cmdStats{}
	if err := parseCommandStats(info, before); err != nil {
		t.Fatal(err)
	}
	// A second master adds to the same counters.
	for range 2 {
		if err := parseCommandStats(strings.ReplaceAll(info, "calls=10,usec=95", "calls=30,usec=300"), after); err != nil {
			t.Fatal(err)
		}
	}
	d := after.sub(before)
	if got, want := d["evalsha"], (cmdStat{50, 505}); got != want {
		t.Errorf("evalsha delta = %+v, want %+v", got, want)
	}
	if got, want := d.total(nil), (cmdStat{50 + 2, 505 + 3}); got != want {
		t.Errorf("total without info = %+v, want %+v", got, want)
	}
	if got, want := d.total(map[string]bool{"client|setinfo": true}), (cmdStat{50, 505}); got != want {
		t.Errorf("total without info and client|setinfo = %+v, want %+v", got, want)
	}
	if err := parseCommandStats("cmdstat_get:calls=x,usec=1\n", cmdStats{}); err == nil {
		t.Error("parseCommandStats accepted calls=x")
	}
}

// TestLoopsDriveAServer runs both loops briefly against a bare peer: every
// request answered, the open loop near its rate.
func TestLoopsDriveAServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- benchpeer.Serve(ctx, benchpeer.Bare(), ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serving the bare peer: %v", err)
		}
	})
	tg, err := newTarget("bare", "http://"+ln.Addr().String(), "GET", benchpeer.Path, 200, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitReady(t.Context(), tg, benchpeer.Path); err != nil {
		t.Fatal(err)
	}
	r := closedLoop(tg, 200*time.Millisecond, 1_000_000, 4)
	if r.Requests == 0 || r.Errors != 0 || r.P50 <= 0 || r.P99 < r.P50 {
		t.Errorf("closed loop: got %+v, want requests, no errors, 0 < p50 <= p99", r)
	}
	if r := closedLoop(tg, time.Minute, 50, 4); r.Requests != 50 {
		t.Errorf("closed loop with -max 50: got %d requests, want 50", r.Requests)
	}
	r = openLoop(tg, 1000, 300*time.Millisecond, 1_000_000, 4)
	if r.Requests != 300 || r.Errors != 0 {
		t.Errorf("open loop at 1000/s for 300ms: got %d requests, %d errors, want 300, 0", r.Requests, r.Errors)
	}
	tg.want = 201
	if r := closedLoop(tg, 50*time.Millisecond, 10, 1); r.Errors != r.Requests || !strings.Contains(r.FirstErr, "status 200") {
		t.Errorf("wanting 201: got %d errors of %d, first %q; want every request failed with status 200", r.Errors, r.Requests, r.FirstErr)
	}
	tg.refuse = 200
	if r := closedLoop(tg, time.Minute, 10, 1); r.Refused != 10 || r.Errors != 0 || r.OK != 0 {
		t.Errorf("200 as the refusal: got %d refused, %d errors, %d ok of %d; want 10, 0, 0", r.Refused, r.Errors, r.OK, r.Requests)
	}
}

func TestTenantMemorySumsTheTenantsKeys(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	ctx := context.Background()
	for _, k := range []string{":v1:{t:a}:gcra", ":v1:{t:a}:day", ":v1:{t:ab}:gcra", ":v1:{t:b}:gcra"} {
		if err := rdb.Set(ctx, prefix+k, "1", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	bytes, keys, err := tenantMemory(ctx, rdb, prefix, "a")
	if err != nil {
		t.Fatal(err)
	}
	if keys != 2 || bytes <= 0 {
		t.Errorf("got %d bytes in %d keys, want > 0 bytes in 2 keys (tenant a, not ab or b)", bytes, keys)
	}
}

func TestScriptedCommandsAreThoseOfTheScripts(t *testing.T) {
	got, err := scriptedCommands()
	if err != nil {
		t.Fatal(err)
	}
	// (publish: a release of a full queue policy's slot, policy_run.lua)
	for _, name := range []string{"time", "hset", "get", "set", "publish"} {
		if !got[name] {
			t.Errorf("scriptedCommands() has no %q: %v", name, got)
		}
	}
	for _, name := range []string{"evalsha", "sadd", "subscribe"} {
		if got[name] {
			t.Errorf("scriptedCommands() has %q, which no script runs", name)
		}
	}
}

func TestCommandStatsReadsTheServer(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, err := commandStats(context.Background(), rdb)
	if err != nil {
		t.Fatal(err)
	}
	if s["ping"].calls < 1 { // redisdb.Open pings
		t.Errorf("got ping %+v, want at least one call", s["ping"])
	}
}

// TestBenchPoliciesAreValidAndRoomy holds every policy of the policies
// table to what the admin API accepts, and to limits that one machine's
// load cannot reach.
func TestBenchPoliciesAreValidAndRoomy(t *testing.T) {
	if len(quota.Algorithms) != 9 {
		t.Errorf("quota.Algorithms has %d algorithms; the policies table was written for 9", len(quota.Algorithms))
	}
	for _, alg := range quota.Algorithms {
		name, tier := policyName(alg, "0123abcd"), policyPrefix+slugOf(alg)
		if !quota.ValidSlug(name) || !quota.ValidSlug(tier) {
			t.Errorf("%s: name %q or tier %q is not a slug", alg, name, tier)
		}
		p := benchPolicy(alg, name, tier)
		p.Defaults()
		if err := p.Validate(); err != nil {
			t.Errorf("%s: %v", alg, err)
			continue
		}
		if want := alg != quota.AlgAdaptive; p.InRedis() != want || p.InTenantSlot() != want {
			t.Errorf("%s: in Redis %t, in the tenant's slot %t; want both %t", alg, p.InRedis(), p.InTenantSlot(), want)
		}
		perSec, inFlight := policyCapacity(p)
		if perSec == 0 && inFlight == 0 {
			t.Errorf("%s: policyCapacity knows no bound", alg)
		}
		if perSec != 0 && perSec < 100_000 {
			t.Errorf("%s admits %.0f requests a second, want at least 100000", alg, perSec)
		}
		if inFlight != 0 && inFlight < 1024 {
			t.Errorf("%s admits %d requests in flight, want at least 1024 (-conns' most)", alg, inFlight)
		}
	}
}

func TestPolicyItemNames(t *testing.T) {
	for _, tc := range []struct {
		field string
		want  []string
	}{
		{"", nil},
		{`"burst";q=20;w=2, "daily";q=1000;w=86400`, []string{"burst", "daily"}},
		{`"burst";q=20;w=2,"loadgen-pol-gcra-0123abcd";q=1000000;w=2`, []string{"burst", "loadgen-pol-gcra-0123abcd"}},
		{`"a\"b";x="1,2", tok;q=1, "c\\d"`, []string{`a"b`, "tok", `c\d`}},
		{`"unterminated`, []string{"unterminated"}},
	} {
		got := policyItemNames(tc.field)
		if !slices.Equal(got, tc.want) {
			t.Errorf("policyItemNames(%q) = %q, want %q", tc.field, got, tc.want)
		}
	}
}

func TestPolicyKeyPattern(t *testing.T) {
	pat := policyKeyPattern("bench", "7f3c", "loadgen-pol-gcra-0123abcd")
	if want := "bench:pol:{t:7f3c}:loadgen-pol-gcra-0123abcd.*"; pat != want {
		t.Fatalf("policyKeyPattern = %q, want %q", pat, want)
	}
	for key, want := range map[string]bool{
		"bench:pol:{t:7f3c}:loadgen-pol-gcra-0123abcd.9e8d7c6b:t":  true,
		"bench:pol:{t:7f3c}:loadgen-pol-gcra-0123abcde.9e8d7c6b:t": false, // another name
		"bench:pol:{t:7f3d}:loadgen-pol-gcra-0123abcd.9e8d7c6b:t":  false, // another tenant
		"bench:v1:{t:7f3c}:gcra":                                   false,
	} {
		// (path.Match's * and Redis's agree on keys without '/')
		if got, _ := path.Match(pat, key); got != want {
			t.Errorf("%q matches %q: %t, want %t", pat, key, got, want)
		}
	}
}

func TestScriptCost(t *testing.T) {
	s := cmdStats{"evalsha": {10, 100}, "eval": {1, 7}, "evalsha_ro": {2, 4}, "fcall": {3, 9}, "get": {50, 50}, "info": {1, 500}}
	if got, want := scriptCost(s), (cmdStat{16, 120}); got != want {
		t.Errorf("scriptCost = %+v, want %+v", got, want)
	}
}

func TestPolicyRowString(t *testing.T) {
	r := policyRow{label: "gcra", rps: 30000.4, vsBare: 0.3, vsPlain: 0.9, p99: 1500 * time.Microsecond,
		requests: 1000, script: cmdStat{calls: 1000, usec: 12345}, inRedis: true, memBytes: 301, memKeys: 2, refused: 3}
	got := strings.Fields(r.String())
	want := []string{"gcra", "30000", "0.30", "0.90", "1.500ms", "12.35", "1.00", "151", "2", "3", "0"}
	if !slices.Equal(got, want) {
		t.Errorf("row = %q, want %q", got, want)
	}
	if n := len(strings.Fields(fmt.Sprintf(policyHeader, "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"))); n != len(want) {
		t.Errorf("the header has %d columns, a row %d", n, len(want))
	}
	r.inRedis = false
	if got := strings.Fields(r.String()); got[7] != "-" || got[8] != "-" {
		t.Errorf("a node-local policy's bytes and keys: %q, want - -", got[7:9])
	}
	r.inRedis, r.memKeys = true, 0
	if got := strings.Fields(r.String()); got[7] != "-" || got[8] != "0" {
		t.Errorf("no keys: %q, want - 0", got[7:9])
	}
	r.requests = 0
	if got := strings.Fields(r.String()); got[5] != "-" || got[6] != "-" {
		t.Errorf("no requests: %q, want - -", got[5:7])
	}
	r.note = "not measured: why"
	if got := r.String(); !strings.HasPrefix(got, "gcra") || !strings.HasSuffix(got, " not measured: why") {
		t.Errorf("a row with a note: %q", got)
	}
}

func TestKeysMemoryOfAPolicy(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	ctx := context.Background()
	for _, k := range []string{":pol:{t:a}:p-1.0a0b0c0d:t", ":pol:{t:a}:p-1.1a1b1c1d:t", ":pol:{t:a}:p-12.0a0b0c0d:t", ":pol:{t:b}:p-1.0a0b0c0d:t"} {
		if err := rdb.Set(ctx, prefix+k, "1", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	bytes, keys, err := keysMemory(ctx, rdb, policyKeyPattern(prefix, "a", "p-1"))
	if err != nil {
		t.Fatal(err)
	}
	if keys != 2 || bytes <= 0 {
		t.Errorf("got %d bytes in %d keys, want > 0 bytes in 2 keys (policy p-1 of tenant a)", bytes, keys)
	}
}

func TestParseCPU(t *testing.T) {
	got, err := parseRedisCPU("# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9\r\n")
	if err != nil || got != 3.75 {
		t.Fatalf("parseRedisCPU = %v, %v; want 3.75", got, err)
	}
	if _, err := parseRedisCPU("used_cpu_sys:1\n"); err == nil {
		t.Fatal("parseRedisCPU took INFO without used_cpu_user")
	}
	v, err := parseProcessCPU(strings.NewReader("# HELP x\nprocess_cpu_seconds_total_other 9\nprocess_cpu_seconds_total 12.5\n"))
	if err != nil || v != 12.5 {
		t.Fatalf("parseProcessCPU = %v, %v; want 12.5", v, err)
	}
	if _, err := parseProcessCPU(strings.NewReader("go_goroutines 3\n")); err == nil {
		t.Fatal("parseProcessCPU found a value in metrics without it")
	}
	c := cpuPerRequest("r", Result{Requests: 1000, RPS: 500}, cpuSample{loadgen: 1, server: 2, redis: 3}, cpuSample{loadgen: 1.01, server: 2.02, redis: 3.005})
	if c.loadgen < 9.99 || c.loadgen > 10.01 || c.server < 19.99 || c.server > 20.01 || c.redis < 4.99 || c.redis > 5.01 || c.wall != 2 {
		t.Fatalf("cpuPerRequest = %+v, want loadgen 10, api 20, Redis 5 µs per request over 2 s", c)
	}
}

func TestParseProcStat(t *testing.T) {
	// utime 250 and stime 50 ticks, after a command name holding ") ("
	stat := "4242 (loadgen) (x) S 1 4242 4242 0 -1 4194560 1500 0 0 0 250 50 0 0 20 0 9 0 123 456 789\n"
	if got, err := parseProcStat(stat); err != nil || got != 3 {
		t.Errorf("parseProcStat = %v, %v; want 3 s", got, err)
	}
	for _, bad := range []string{"", "4242 loadgen S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 4194560 1500 0 0 0 x 50 0"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q) took it", bad)
		}
	}
	if procCPUOf(0) != nil {
		t.Error("procCPUOf(0) reads something, want nil (unknown)")
	}
	if _, err := procCPUOf(os.Getpid())(t.Context()); err != nil {
		t.Errorf("this process's CPU time: %v", err)
	}
}

func TestTenantOf(t *testing.T) {
	for key, want := range map[string]string{
		"bench:v2:{t:7f3c}":           "7f3c",
		"bench:v1:{t:7f3c}:mq":        "7f3c",
		"bench:pol:{t:ab}:p.1:t":      "ab",
		"bench:v2:{t:7f3c":            "",
		"bench:deny:7f3c":             "",
		"rate:bench:peer:Bearer x{t:": "",
	} {
		if got := tenantOf(key); got != want {
			t.Errorf("tenantOf(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestTenantsMemorySumsTheirKeys(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	ctx := context.Background()
	for _, k := range []string{":v2:{t:a}", ":v1:{t:a}:mq", ":v2:{t:b}", ":v2:{t:c}", ":v2:{t:ab}"} {
		if err := rdb.Set(ctx, prefix+k, "1", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	one, _, err := tenantsMemory(ctx, rdb, prefix, []string{"c"})
	if err != nil {
		t.Fatal(err)
	}
	bytes, keys, err := tenantsMemory(ctx, rdb, prefix, []string{"a", "b", "z"})
	if err != nil {
		t.Fatal(err)
	}
	if keys != 3 || one <= 0 || bytes < 3*one {
		t.Errorf("got %d bytes in %d keys (one key: %d), want 3 keys (a's two, b's; not c, ab or the absent z)", bytes, keys, one)
	}
}

func TestInParallel(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]bool{}
	err := inParallel(t.Context(), 50, func(_ context.Context, i int) error {
		mu.Lock()
		defer mu.Unlock()
		seen[i] = true
		return nil
	})
	if err != nil || len(seen) != 50 {
		t.Fatalf("inParallel = %v after %d calls, want nil after 50", err, len(seen))
	}
	boom := errors.New("boom")
	var calls atomic.Int64
	err = inParallel(t.Context(), 10_000, func(ctx context.Context, i int) error {
		calls.Add(1)
		if i == 3 {
			return boom
		}
		<-ctx.Done() // the others wait for the failure
		return nil
	})
	if !errors.Is(err, boom) || calls.Load() >= 10_000 {
		t.Errorf("inParallel = %v after %d calls, want boom, the calls after it skipped", err, calls.Load())
	}
}

func TestRowLine(t *testing.T) {
	bare := &row{t: &target{row: "bare Fiber"}, res: Result{RPS: 100_000}}
	peer := &row{t: &target{row: "redis_rate, 1 key"}, res: Result{RPS: 40_000}}
	r := &row{t: &target{row: "admitted, 1 tenant"}, peer: peer,
		res: Result{RPS: 30_000, P50: 1500 * time.Microsecond, P99: 4 * time.Millisecond, Requests: 150_000, Errors: 2}}
	want := []string{"admitted,", "1", "tenant", "30000", "0.30", "0.75", "1.500ms", "4.000ms", "150000", "2"}
	if got := strings.Fields(r.line(bare)); !slices.Equal(got, want) {
		t.Errorf("line = %q, want %q", got, want)
	}
	if got := strings.Fields(bare.line(bare)); got[4] != "-" || got[3] != "1.00" {
		t.Errorf("bare's line = %q, want ×bare 1.00 and no ×redis_rate", got)
	}
}

func TestParseMetricAndFromDenyCache(t *testing.T) {
	text := "# HELP tollgate_deny_cache_hits_total x\ntollgate_deny_cache_hits_total_x 1\ntollgate_deny_cache_hits_total 2.5e+06\n"
	if v, err := parseMetric(strings.NewReader(text), "tollgate_deny_cache_hits_total"); err != nil || v != 2.5e6 {
		t.Fatalf("parseMetric = %v, %v; want 2500000", v, err)
	}
	r := Result{Row: "refused", Requests: 1000, OK: 990, Errors: 10, FirstErr: "no answer"}
	if got := fromDenyCache(r, 1050); got != r {
		t.Errorf("with more deny-cache refusals than answers (in flight at the end): %+v, want %+v unchanged", got, r)
	}
	got := fromDenyCache(r, 900)
	if got.OK != 900 || got.Errors != 100 || got.Requests != 1000 || got.FirstErr != "no answer" {
		t.Errorf("90 answers not the deny cache's: %+v, want 900 ok, 100 errors of 1000, the first error kept", got)
	}
	r.Errors, r.OK, r.FirstErr = 0, 1000, ""
	if got := fromDenyCache(r, 0); got.OK != 0 || got.Errors != 1000 || !strings.Contains(got.FirstErr, "deny cache") {
		t.Errorf("no deny-cache refusals: %+v, want every answer an error naming the deny cache", got)
	}
}
