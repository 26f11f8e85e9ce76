package main

import (
	"context"
	"io"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWorkerStepsAreTraced runs the worker with OTEL_EXPORTER_OTLP_ENDPOINT
// naming a loopback OTLP/HTTP receiver: each cycle is a root span with a
// child span per step, in order, and the spans still buffered when the
// worker stops are exported before run returns.
func TestWorkerStepsAreTraced(t *testing.T) {
	t.Parallel()
	rec := testenv.OTLP(t)
	env := map[string]string{
		"REDIS_URL":                    testenv.RedisURL(t),
		"DATABASE_URL":                 testenv.NewDatabase(t),
		"TOLLGATE_RECONCILE_INTERVAL":  "100ms",
		"TOLLGATE_WORKER_METRICS_ADDR": "127.0.0.1:0",
		"TOLLGATE_REDIS_PREFIX":        testenv.Prefix(t, testenv.Redis(t)),
		"OTEL_EXPORTER_OTLP_ENDPOINT":  rec.URL,
		"OTEL_SERVICE_NAME":            "worker-under-test",
		// An hour: what the receiver has when run returns, the shutdown
		// flushed.
		"OTEL_BSP_SCHEDULE_DELAY": "3600000",
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, func(k string) string { return env[k] }, io.Discard) }()
	time.Sleep(time.Second) // a few cycles
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v, want nil after its context ends", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30 s of its context's end")
	}

	spans := rec.Spans()
	var cycles []testenv.Span
	children := map[string][]testenv.Span{}
	for _, sp := range spans {
		if sp.Resource["service.name"] != "worker-under-test" {
			t.Errorf("span %s: service.name %q, want OTEL_SERVICE_NAME's", sp.Name, sp.Resource["service.name"])
		}
		if sp.Name == "worker.cycle" {
			if sp.ParentID != "" || sp.Kind != tracepb.Span_SPAN_KIND_INTERNAL {
				t.Errorf("worker.cycle: parent %q kind %v, want a root internal span", sp.ParentID, sp.Kind)
			}
			cycles = append(cycles, sp)
			continue
		}
		children[sp.ParentID] = append(children[sp.ParentID], sp)
	}
	if len(cycles) == 0 {
		t.Fatalf("no worker.cycle span exported by the time run returned; took %d spans (refused: %q)", len(spans), rec.Refused())
	}
	want := []string{"grants", "plans", "repair", "flush", "invoices", "alerts"}
	complete := 0
	for _, c := range cycles {
		steps := children[c.SpanID]
		if len(steps) != len(want) {
			continue // the last cycle, cut short by the shutdown
		}
		complete++
		for i, sp := range steps {
			if sp.Name != "worker.step "+want[i] || sp.Attrs["tollgate.step"] != want[i] || sp.TraceID != c.TraceID {
				t.Errorf("step %d of a cycle: %s (tollgate.step %q, trace %s), want worker.step %s in trace %s",
					i, sp.Name, sp.Attrs["tollgate.step"], sp.TraceID, want[i], c.TraceID)
			}
			if sp.Status == tracepb.Status_STATUS_CODE_ERROR {
				t.Errorf("step %s marked failed on a healthy database", want[i])
			}
		}
		if c.Attrs["tollgate.failed_steps"] != "0" {
			t.Errorf("worker.cycle: tollgate.failed_steps %q, want 0", c.Attrs["tollgate.failed_steps"])
		}
	}
	if complete == 0 {
		t.Fatalf("no cycle span with its %d steps among %d cycles", len(want), len(cycles))
	}
}
