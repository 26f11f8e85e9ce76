package admission

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// mustRunReports starts g.RunReports every interval and returns its stop:
// cancel, wait for the final report, and the log it wrote.
func mustRunReports(tb testing.TB, g *Gate, every time.Duration) (stop func() string) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var buf bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.RunReports(ctx, every, slog.New(slog.NewTextHandler(&buf, nil)))
	}()
	stopped := false
	stop = func() string {
		tb.Helper()
		if !stopped {
			stopped = true
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				tb.Fatal("RunReports did not return after its context ended")
			}
		}
		return buf.String()
	}
	tb.Cleanup(func() { stop() })
	return stop
}

// TestRunReportsReportsEveryInterval: a tenant that counted usage reaches
// the worker's active set on the next tick, without any other call.
func TestRunReportsReportsEveryInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, inner, _ := mustLiveGate(t)
	stop := mustRunReports(t, g, 20*time.Millisecond)
	req := dailyOf(5)
	if d, err := g.Admit(ctx, req); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v; want admitted", d, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ids, err := inner.ActiveTenants(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(ids, req.TenantID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("active tenants %v after 5 s, want %s among them", ids, req.TenantID)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if log := stop(); log != "" {
		t.Errorf("got log %q, want none", log)
	}
}

// TestRunReportsReportsOnceMoreAtTheEnd: the report after the context ends
// writes the deny cache's refusals and reports the tenant, though no tick
// came.
func TestRunReportsReportsOnceMoreAtTheEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, inner, _ := mustLiveGate(t)
	stop := mustRunReports(t, g, time.Hour)
	req := dailyOf(1)
	for i := range 5 {
		if d, err := g.Admit(ctx, req); err != nil || d.Allowed != (i == 0) {
			t.Fatalf("request %d: %+v, %v; want only the first admitted", i, d, err)
		}
	}
	if got := inner.calls.Load(); got != 2 {
		t.Fatalf("%d Redis calls, want 2 (3 refusals from the deny cache)", got)
	}
	if log := stop(); log != "" {
		t.Errorf("got log %q, want none", log)
	}
	ids, err := inner.ActiveTenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ids, req.TenantID) {
		t.Errorf("active tenants %v, want %s among them", ids, req.TenantID)
	}
	if refused := pendingRefused(t, inner, req.TenantID); refused != 4 {
		t.Errorf("pending refusals: got %d, want 4", refused)
	}
}

// TestRunReportsLogsFailures: with Redis down, a report fails, is logged,
// and RunReports keeps going until its context ends.
func TestRunReportsLogsFailures(t *testing.T) {
	t.Parallel()
	g, _, _ := mustDeadGate(t)
	g.refused[refusalKey{tenant: "tn", meter: "demo", hour: 3600}] = 2
	stop := mustRunReports(t, g, 20*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	log := stop()
	if !bytes.Contains([]byte(log), []byte("reporting usage to the worker failed")) {
		t.Fatalf("got log %q, want the failure logged", log)
	}
	if got := g.refused[refusalKey{tenant: "tn", meter: "demo", hour: 3600}]; got != 2 {
		t.Errorf("refusals held after failed reports: got %d, want 2 (kept for the next one)", got)
	}
}

// pendingRefused sums the refusals in the tenant's pending usage.
func pendingRefused(tb testing.TB, s interface {
	Pending(context.Context, string) ([]quota.PendingRow, error)
}, tenantID string) int64 {
	tb.Helper()
	rows, err := s.Pending(context.Background(), tenantID)
	if err != nil {
		tb.Fatal(err)
	}
	var refused int64
	for _, r := range rows {
		refused += r.Rejected
	}
	return refused
}
