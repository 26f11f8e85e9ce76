package worker

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/tollgate/tollgate/internal/app"
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
		"TOLLGATE_RECONCILE_INTERVAL":  interval,
		"TOLLGATE_WORKER_METRICS_ADDR": "127.0.0.1:0",
		"TOLLGATE_REDIS_PREFIX":        testenv.Prefix(t, testenv.Redis(t)),
		"OTEL_EXPORTER_OTLP_ENDPOINT":  rec.URL,
		"OTEL_SERVICE_NAME":            "worker-under-test",
		// An hour: what the receiver has when run returns, the shutdown
		// flushed.
		"OTEL_BSP_SCHEDULE_DELAY": "3600000",
	}
	// Stop the worker once it has logged two cycles, however long it takes
	// to start on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	env["TOLLGATE_LOG_LEVEL"] = "debug"
	logs := &cycleCounter{after: 2, then: cancel}
	done := make(chan error, 1)
	go func() { done <- app.RunWorker(ctx, func(k string) string { return env[k] }, logs) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v, want nil after its context ends", err)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("run did not return within 90 s")
	}
	if logs.seen.Load() < 2 {
		t.Fatalf("%d cycles logged within 60 s, want 2", logs.seen.Load())
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
	want := []string{"shares", "grants", "plans", "partitions", "repair", "flush", "invoices", "alerts"}
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

// cycleCounter takes the worker's log lines (one Write each) and calls then
// once it has seen after cycles logged.
type cycleCounter struct {
	after int64
	then  func()
	seen  atomic.Int64
}

func (w *cycleCounter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"msg":"worker cycle"`)) && w.seen.Add(1) == w.after {
		w.then()
	}
	return len(p), nil
}
