package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestSoakRunsEveryFaultAndAuditsEveryPromise runs the whole soak for 60 s
// (its own Redis and Postgres, the api and worker binaries built from this
// tree) and holds it to its machinery: every fault injected and recovered
// from, every kind of request answered, the promises that do not depend on
// timing held, one line per promise, and nothing left running.
func TestSoakRunsEveryFaultAndAuditsEveryPromise(t *testing.T) {
	testenv.Integration(t, "redis-server, Postgres (initdb) and a build of the api and worker")
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin, "./cmd/api", "./cmd/worker")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	// The postgres user (when the test runs as root) must reach the cluster's directory.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{"SOAK_DURATION": "60s", "SOAK_RATE": "80", "SOAK_CLIENTS": "8", "SOAK_TENANTS": "8",
		"SOAK_DIR": filepath.Join(dir, "soak"), "SOAK_BIN": bin}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	_, err := run(ctx, func(k string) string { return env[k] }, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	report := out.String()
	for _, name := range []string{"traffic-covered", "faults-injected", "billed-as-answered", "idempotent-once", "quota-not-passed",
		"spend-cap-not-passed", "credit-not-passed", "no-5xx-outside-faults", "answers-as-documented"} {
		if !regexp.MustCompile(`(?m)^promise ` + name + `: +held `).MatchString(report) {
			t.Errorf("promise %s: not held in the report", name)
		}
	}
	// These depend on the machine's timing (readings on a loaded machine, in
	// a run too short to judge a trend): their lines must be there, held or
	// not.
	for _, name := range []string{"api-rss-flat", "api-goroutines-flat"} {
		if !regexp.MustCompile(`(?m)^promise ` + name + `: +(held|BROKEN) `).MatchString(report) {
			t.Errorf("promise %s: no line in the report", name)
		}
	}
	for _, fault := range []string{"SIGKILL of api node 2", "SIGKILL of worker 1", "restart of Redis", "pause of Redis",
		"restart of Postgres", "tier change", "month grant", "credit grant"} {
		if !strings.Contains(report, fault) {
			t.Errorf("no %q in the report", fault)
		}
	}
	// Everything the soak started has stopped: its listeners are gone.
	addrs := regexp.MustCompile(`127\.0\.0\.1:\d+`).FindAllString(report, -1)
	if len(addrs) < 4 {
		t.Fatalf("got %d addresses in the report, want Redis, Postgres, 2 api nodes", len(addrs))
	}
	for _, a := range addrs {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after the soak", a)
		}
	}
}
