package httpapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPublicReadyzNamesNoDependencyWithAnOpsApp: with an operations app, a
// failing dependency is a 503 on both, but only the operations app says
// which and how (its error may name an internal address).
func TestPublicReadyzNamesNoDependencyWithAnOpsApp(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	failing := []ReadyCheck{{Name: "redis", Check: func(context.Context) error { return errors.New("dial tcp 10.9.8.7:6379: refused") }}}
	s, err := New(Deps{Log: log, Sessions: redisdb.NewSessions(testenv.Redis(t), "tg"), Ready: failing}, Options{BodyLimit: 1024, Ops: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.OpsApp() == nil {
		t.Fatal("OpsApp() is nil with Options.Ops")
	}
	p := mustProblem(t, s.App(), "GET", "/readyz", "", 503)
	if _, ok := p["checks"]; ok || strings.Contains(p["detail"].(string), "10.9.8.7") {
		t.Errorf("public /readyz: %v, want a 503 that names no dependency", p)
	}
	p = mustProblem(t, s.OpsApp(), "GET", "/readyz", "", 503)
	if checks, _ := p["checks"].(map[string]any); checks["redis"] != "dial tcp 10.9.8.7:6379: refused" {
		t.Errorf("ops /readyz: %v, want the failing check named with its error", p)
	}
	mustProblem(t, s.App(), "GET", "/metrics", "", 404)
	resp, err := s.OpsApp().Test(httptest.NewRequest("GET", "/metrics", nil), 10_000)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("ops /metrics: %v %v, want 200", resp, err)
	}
	resp.Body.Close()
	// Without Options.Ops there is no operations app.
	if mustServer(t, nil).OpsApp() != nil {
		t.Error("OpsApp() is not nil without Options.Ops")
	}
}
