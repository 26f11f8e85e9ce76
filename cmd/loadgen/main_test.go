package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/httpapi/benchpeer"
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
	for _, name := range []string{"time", "hset", "get", "set"} {
		if !got[name] {
			t.Errorf("scriptedCommands() has no %q: %v", name, got)
		}
	}
	for _, name := range []string{"evalsha", "publish", "sadd"} {
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
