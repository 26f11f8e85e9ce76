package api

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/app"
)

// freeLoopbackAddr returns a loopback address whose port was free a moment ago.
func freeLoopbackAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// plainGet GETs url and returns its answer, the body read.
func plainGet(tb testing.TB, url string) reply {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

// readyzAnswer is the JSON of a 200 /readyz.
type readyzAnswer struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
}

func mustBeReady(tb testing.TB, what string, r reply) readyzAnswer {
	tb.Helper()
	var v readyzAnswer
	if r.status != 200 || json.Unmarshal(r.body, &v) != nil || v.Status != "ready" {
		tb.Fatalf("%s: %d %s, want 200 and status ready", what, r.status, r.body)
	}
	return v
}

// TestOpsListenerServesMetricsAndReadiness: with TOLLGATE_OPS_ADDR set,
// /metrics and /readyz with its checks are served there only; the public
// listener answers /metrics 404 and /readyz with its status alone (a load
// balancer's probe still works, naming no dependency); /healthz is on both.
// Unset, both stay on the public listener, as they always were.
func TestOpsListenerServesMetricsAndReadiness(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	opsAddr := freeLoopbackAddr(t)
	base := s.startWith(map[string]string{"TOLLGATE_OPS_ADDR": opsAddr})
	ops := "http://" + opsAddr

	m := plainGet(t, ops+"/metrics")
	if m.status != 200 || !strings.HasPrefix(m.header.Get("Content-Type"), "text/plain") || !strings.Contains(string(m.body), "tollgate_") {
		t.Errorf("ops GET /metrics: %d %q, want 200 and the metrics", m.status, m.header.Get("Content-Type"))
	}
	rz := mustBeReady(t, "ops GET /readyz", plainGet(t, ops+"/readyz"))
	if rz.Checks["redis"] != "ok" || rz.Checks["postgres"] != "ok" || rz.Checks["schema"] != "ok" {
		t.Errorf("ops GET /readyz: checks %v, want redis, postgres and schema ok", rz.Checks)
	}
	if h := plainGet(t, ops+"/healthz"); h.status != 200 {
		t.Errorf("ops GET /healthz: %d, want 200", h.status)
	}
	for _, p := range []string{"/api/demo/echo", "/console/login", "/admin/v1/tiers", "/openapi.json"} {
		if r := plainGet(t, ops+p); r.status != 404 {
			t.Errorf("ops GET %s: %d, want 404 (the ops listener serves operations only)", p, r.status)
		}
	}

	if r := plainGet(t, base+"/metrics"); r.status != 404 || r.header.Get("Content-Type") != "application/problem+json" || strings.Contains(string(r.body), "tollgate_") {
		t.Errorf("public GET /metrics: %d %q %.100s, want a 404 problem", r.status, r.header.Get("Content-Type"), r.body)
	}
	pub := plainGet(t, base+"/readyz")
	if mustBeReady(t, "public GET /readyz", pub); strings.Contains(string(pub.body), "checks") {
		t.Errorf("public GET /readyz: %s, want the status without the checks", pub.body)
	}
	if h := plainGet(t, base+"/healthz"); h.status != 200 {
		t.Errorf("public GET /healthz: %d, want 200", h.status)
	}

	// Unset: on the public listener, the checks included.
	plain := s.start()
	if r := plainGet(t, plain+"/metrics"); r.status != 200 || !strings.Contains(string(r.body), "tollgate_") {
		t.Errorf("GET /metrics without TOLLGATE_OPS_ADDR: %d, want 200 and the metrics", r.status)
	}
	if rz := mustBeReady(t, "GET /readyz without TOLLGATE_OPS_ADDR", plainGet(t, plain+"/readyz")); rz.Checks["redis"] != "ok" {
		t.Errorf("GET /readyz without TOLLGATE_OPS_ADDR: checks %v, want them", rz.Checks)
	}
}

// TestOpsAddrThatCannotListenStopsTheAPI: an operations address in use
// stops the api at start with an error naming TOLLGATE_OPS_ADDR.
func TestOpsAddrThatCannotListenStopsTheAPI(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	env := s.env(map[string]string{"TOLLGATE_ADDR": "127.0.0.1:0", "TOLLGATE_OPS_ADDR": taken.Addr().String()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a server that ignored it would serve on
	defer cancel()
	err = app.RunAPI(ctx, func(k string) string { return env[k] }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "TOLLGATE_OPS_ADDR") {
		t.Fatalf("run with TOLLGATE_OPS_ADDR in use: %v, want an error naming it", err)
	}
}
