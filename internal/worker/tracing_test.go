package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/tollgate/tollgate/internal/telemetry"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestLoopTracesAFailedStep: a failed step's span is marked failed, the
// cycle's counts it, and the steps' contexts carry their spans.
func TestLoopTracesAFailedStep(t *testing.T) {
	t.Parallel()
	rec := testenv.OTLP(t)
	tr, err := telemetry.Start(context.Background(), "worker-test", func(k string) string {
		return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rec.URL}[k]
	})
	if err != nil || tr == nil {
		t.Fatalf("telemetry.Start = %v, %v; want a pipeline", tr, err)
	}
	var inSpan bool
	ctx, cancel := context.WithCancel(context.Background())
	l := &Loop{
		Interval: time.Hour,
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Tracer:   tr.Tracer(),
		Steps: []Step{
			{Name: "fails", Run: func(context.Context) error { return errors.New("boom") }},
			{Name: "works", Run: func(ctx context.Context) error {
				inSpan = trace.SpanFromContext(ctx).SpanContext().IsValid()
				return nil
			}},
		},
		OnCycle: func(time.Duration, int) { cancel() }, // one cycle
	}
	if err := l.Run(ctx); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if !inSpan {
		t.Error("a step's context carries no span")
	}
	byName := map[string]testenv.Span{}
	for _, sp := range rec.Spans() {
		byName[sp.Name] = sp
	}
	cycle, fails, works := byName["worker.cycle"], byName["worker.step fails"], byName["worker.step works"]
	if cycle.SpanID == "" || fails.ParentID != cycle.SpanID || works.ParentID != cycle.SpanID {
		t.Fatalf("spans %v: want worker.cycle with the two steps as children", byName)
	}
	if fails.Status != tracepb.Status_STATUS_CODE_ERROR || works.Status == tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("step statuses fails=%v works=%v, want error and not error", fails.Status, works.Status)
	}
	if cycle.Status != tracepb.Status_STATUS_CODE_ERROR || cycle.Attrs["tollgate.failed_steps"] != "1" {
		t.Errorf("cycle status %v failed_steps %q, want error and 1", cycle.Status, cycle.Attrs["tollgate.failed_steps"])
	}
}
