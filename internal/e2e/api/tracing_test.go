package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/tollgate/tollgate/internal/app"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// traceUpstream answers 200 and keeps the traceparent of each request.
type traceUpstream struct {
	mu      sync.Mutex
	parents []string
}

func (u *traceUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.parents = append(u.parents, r.Header.Get("Traceparent"))
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"ok": true}`)
}

func (u *traceUpstream) traceparents() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.parents...)
}

// TestTracesExportedOverOTLP runs the api with OTEL_EXPORTER_OTLP_ENDPOINT
// naming a loopback OTLP/HTTP receiver, and reads back the spans of metered
// requests (proxied, built in, refused, replayed, unauthenticated) and of
// the decision API: their kinds, parents across the client's traceparent,
// the upstream's and the admission, their attributes, and that no value
// anywhere holds an API key or the service token.
func TestTracesExportedOverOTLP(t *testing.T) {
	t.Parallel()
	rec := testenv.OTLP(t)
	up := &traceUpstream{}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	s := mustStack(t)
	s.routes = filepath.Join(t.TempDir(), "routes.json")
	table := fmt.Sprintf(`{"routes": [
		{"method": "*", "path": "/api/up/", "meter": "up", "cost": 3, "upstream": %q, "timeout": "5s"},
		{"method": "GET", "path": "/api/echo", "meter": "echo", "cost": 2, "handler": "echo"}
	]}`, upSrv.URL+"/v1/")
	if err := os.WriteFile(s.routes, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	base := s.startWith(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": rec.URL,
		"OTEL_BSP_SCHEDULE_DELAY":     "50",
	})
	tenant, key := s.tenant(s.tier(21, quota.Limits{DailyQuota: quota.Ptr(int64(1000))}).Slug)
	small, smallKey := s.tenant(s.tier(22, quota.Limits{DailyQuota: quota.Ptr(int64(2))}).Slug)
	const badKey = "tg_live_this-key-was-never-issued-0123456789"

	// A proxied request that continues the client's trace.
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	if r := do(t, "GET", base+"/api/up/items?page=2", key, "", "Traceparent", "00-"+clientTrace+"-"+clientSpan+"-01"); r.status != 200 {
		t.Fatalf("proxied request: status %d, want 200: %s", r.status, r.body)
	}
	// A built-in route, then a refusal (the tier allows 2 units a day).
	if r := do(t, "GET", base+"/api/echo", smallKey, ""); r.status != 200 {
		t.Fatalf("echo: status %d, want 200: %s", r.status, r.body)
	}
	if r := do(t, "GET", base+"/api/echo", smallKey, ""); r.status != 429 {
		t.Fatalf("echo past the quota: status %d, want 429: %s", r.status, r.body)
	}
	// An idempotent repeat, replayed.
	for i, want := range []int{200, 200} {
		if r := do(t, "POST", base+"/api/up/orders", key, `{"n":1}`, "Idempotency-Key", "order-7"); r.status != want {
			t.Fatalf("idempotent POST %d: status %d, want %d: %s", i, r.status, want, r.body)
		}
	}
	// A key that does not exist.
	if r := do(t, "GET", base+"/api/echo", badKey, ""); r.status != 401 {
		t.Fatalf("unknown key: status %d, want 401: %s", r.status, r.body)
	}
	// The decision API: a check by API key, its refund, a release of nothing.
	chk := do(t, "POST", base+"/v1/check", serviceToken, fmt.Sprintf(`{"api_key": %q, "meter": "search", "cost": 4}`, key))
	if chk.status != 200 {
		t.Fatalf("check: status %d, want 200: %s", chk.status, chk.body)
	}
	var checked struct {
		Allowed   bool    `json:"allowed"`
		RequestID *string `json:"request_id"`
	}
	if err := json.Unmarshal(chk.body, &checked); err != nil || !checked.Allowed || checked.RequestID == nil {
		t.Fatalf("check answered %s (%v), want allowed with a request_id", chk.body, err)
	}
	ref := fmt.Sprintf(`{"tenant_id": %q, "request_id": %q}`, tenant.ID, *checked.RequestID)
	if r := do(t, "POST", base+"/v1/refund", serviceToken, ref); r.status != 200 {
		t.Fatalf("refund: status %d, want 200: %s", r.status, r.body)
	}
	if r := do(t, "POST", base+"/v1/release", serviceToken, ref); r.status != 404 {
		t.Fatalf("release of a check that held nothing: status %d, want 404: %s", r.status, r.body)
	}

	wait := 20 * time.Second
	server := rec.WaitFor(t, wait, "GET /api/up/ of the client's trace", func(sp testenv.Span) bool {
		return sp.Name == "GET /api/up/" && sp.TraceID == clientTrace
	})
	t.Run("the proxied request continues the client's trace", func(t *testing.T) {
		if server.ParentID != clientSpan || server.Kind != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("server span: parent %s kind %v, want parent %s (the client's traceparent), kind server", server.ParentID, server.Kind, clientSpan)
		}
		wantAttrs(t, server, map[string]string{
			"tollgate.tenant_id": tenant.ID, "tollgate.meter": "up", "tollgate.cost": "3", "tollgate.decision": "allowed",
			"http.request.method": "GET", "http.route": "/api/up/", "url.path": "/api/up/items", "http.response.status_code": "200",
		})
		if _, ok := server.Attrs["url.query"]; ok {
			t.Error("the server span records the query string")
		}
		if got := server.Resource["service.name"]; got != "tollgate-api" {
			t.Errorf("service.name %q, want tollgate-api", got)
		}
		admit := rec.WaitFor(t, wait, "tollgate.admit under it", func(sp testenv.Span) bool {
			return sp.Name == "tollgate.admit" && sp.ParentID == server.SpanID
		})
		if admit.TraceID != clientTrace || admit.Kind != tracepb.Span_SPAN_KIND_INTERNAL {
			t.Errorf("admission span: trace %s kind %v, want %s, internal", admit.TraceID, admit.Kind, clientTrace)
		}
		wantAttrs(t, admit, map[string]string{"tollgate.tenant_id": tenant.ID, "tollgate.meter": "up", "tollgate.cost": "3", "tollgate.decision": "allowed"})
		client := rec.WaitFor(t, wait, "the upstream's client span under it", func(sp testenv.Span) bool {
			return sp.Kind == tracepb.Span_SPAN_KIND_CLIENT && sp.ParentID == server.SpanID
		})
		wantAttrs(t, client, map[string]string{"http.request.method": "GET", "http.response.status_code": "200", "server.address": "127.0.0.1"})
		// The upstream got the client span's context, not the client's.
		want := "00-" + clientTrace + "-" + client.SpanID + "-01"
		if got := up.traceparents(); len(got) == 0 || got[0] != want {
			t.Errorf("upstream's traceparents %q, want the first %q", got, want)
		}
	})
	t.Run("built in, refused, replayed, unauthenticated", func(t *testing.T) {
		for _, tc := range []struct {
			what  string
			name  string
			attrs map[string]string
		}{
			{"allowed echo", "GET /api/echo", map[string]string{"tollgate.tenant_id": small.ID, "tollgate.meter": "echo", "tollgate.cost": "2", "tollgate.decision": "allowed", "http.response.status_code": "200"}},
			{"refused echo", "GET /api/echo", map[string]string{"tollgate.tenant_id": small.ID, "tollgate.decision": "refused", "http.response.status_code": "429"}},
			{"replayed POST", "POST /api/up/", map[string]string{"tollgate.tenant_id": tenant.ID, "tollgate.decision": "replayed", "http.response.status_code": "200"}},
			{"first POST", "POST /api/up/", map[string]string{"tollgate.tenant_id": tenant.ID, "tollgate.decision": "allowed", "http.response.status_code": "200"}},
			{"unknown key", "GET /api/*", map[string]string{"http.response.status_code": "401"}},
		} {
			sp := rec.WaitFor(t, wait, tc.what, func(sp testenv.Span) bool {
				return sp.Name == tc.name && has(sp, tc.attrs)
			})
			if sp.Kind != tracepb.Span_SPAN_KIND_SERVER || sp.ParentID != "" {
				t.Errorf("%s: kind %v parent %q, want a root server span", tc.what, sp.Kind, sp.ParentID)
			}
			if tc.what == "unknown key" {
				if _, ok := sp.Attrs["tollgate.tenant_id"]; ok {
					t.Errorf("%s: a tenant id on an unauthenticated request: %v", tc.what, sp.Attrs)
				}
			}
		}
	})
	t.Run("the decision API", func(t *testing.T) {
		check := rec.WaitFor(t, wait, "POST /v1/check", func(sp testenv.Span) bool { return sp.Name == "POST /v1/check" })
		wantAttrs(t, check, map[string]string{"tollgate.tenant_id": tenant.ID, "tollgate.meter": "search", "tollgate.cost": "4",
			"tollgate.decision": "allowed", "tollgate.request_id": *checked.RequestID, "http.response.status_code": "200"})
		if check.Kind != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("check span kind %v, want server", check.Kind)
		}
		rec.WaitFor(t, wait, "tollgate.admit under the check", func(sp testenv.Span) bool {
			return sp.Name == "tollgate.admit" && sp.ParentID == check.SpanID && sp.Attrs["tollgate.meter"] == "search"
		})
		refund := rec.WaitFor(t, wait, "POST /v1/refund", func(sp testenv.Span) bool { return sp.Name == "POST /v1/refund" })
		wantAttrs(t, refund, map[string]string{"tollgate.tenant_id": tenant.ID, "tollgate.request_id": *checked.RequestID, "http.response.status_code": "200"})
		release := rec.WaitFor(t, wait, "POST /v1/release", func(sp testenv.Span) bool { return sp.Name == "POST /v1/release" })
		wantAttrs(t, release, map[string]string{"tollgate.tenant_id": tenant.ID, "http.response.status_code": "404"})
	})
	t.Run("no secret in any span", func(t *testing.T) {
		spans := rec.Spans()
		for _, sp := range spans {
			for _, secret := range []string{key, smallKey, badKey, serviceToken, `"n":1`} {
				if strings.Contains(sp.Name, secret) {
					t.Errorf("span name %q holds a secret or body", sp.Name)
				}
				for k, v := range sp.Attrs {
					if strings.Contains(v, secret) || strings.Contains(k, secret) {
						t.Errorf("span %s: attribute %s=%q holds a secret or body", sp.Name, k, v)
					}
				}
				for k, v := range sp.Resource {
					if strings.Contains(v, secret) {
						t.Errorf("resource attribute %s=%q holds a secret", k, v)
					}
				}
			}
		}
		if len(spans) < 12 {
			t.Errorf("only %d spans checked, want at least 12", len(spans))
		}
		if bad := rec.Refused(); len(bad) > 0 {
			t.Errorf("the receiver refused exports: %q", bad)
		}
	})
}

// has reports whether sp has every attribute of want.
func has(sp testenv.Span, want map[string]string) bool {
	for k, v := range want {
		if sp.Attrs[k] != v {
			return false
		}
	}
	return true
}

func wantAttrs(tb testing.TB, sp testenv.Span, want map[string]string) {
	tb.Helper()
	for k, v := range want {
		if got, ok := sp.Attrs[k]; !ok || got != v {
			tb.Errorf("span %s: %s = %q (set: %v), want %q; all: %v", sp.Name, k, got, ok, v, sp.Attrs)
		}
	}
}

// TestTracesOffPassTheTraceThrough: with no OTEL_* variable the api makes
// no span, so the upstream gets the client's traceparent as it was sent.
func TestTracesOffPassTheTraceThrough(t *testing.T) {
	t.Parallel()
	up := &traceUpstream{}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	s := mustStack(t)
	s.routes = filepath.Join(t.TempDir(), "routes.json")
	table := fmt.Sprintf(`{"routes": [{"method": "GET", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": %q, "timeout": "5s"}]}`, upSrv.URL+"/")
	if err := os.WriteFile(s.routes, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	base := s.start()
	_, key := s.tenant(s.tier(23, quota.Limits{DailyQuota: quota.Ptr(int64(10))}).Slug)
	const sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if r := do(t, "GET", base+"/api/up/x", key, "", "Traceparent", sent); r.status != 200 {
		t.Fatalf("status %d, want 200: %s", r.status, r.body)
	}
	if got := up.traceparents(); len(got) != 1 || got[0] != sent {
		t.Errorf("upstream's traceparents %q, want the client's %q unchanged", got, sent)
	}
}

// TestBadTraceVariableStopsTheAPI: an OTEL_* variable Tollgate cannot
// follow stops run at start with an error naming it.
func TestBadTraceVariableStopsTheAPI(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, value string }{
		{"OTEL_TRACES_EXPORTER", "zipkin"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"},
	} {
		// (Postgres is never reached: the variables are read first)
		env := map[string]string{"REDIS_URL": testenv.RedisURL(t), "DATABASE_URL": "postgres://postgres@127.0.0.1:1/never?sslmode=disable",
			"OTEL_TRACES_EXPORTER": "otlp", tc.name: tc.value}
		err := app.RunAPI(t.Context(), func(k string) string { return env[k] }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s=%q: run = %v, want an error naming %s", tc.name, tc.value, err, tc.name)
		}
	}
}
