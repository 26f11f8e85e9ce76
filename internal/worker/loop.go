// Package worker runs the worker's steps on a ticker: each cycle runs every
// step in order under its own timeout; a failed step is logged and retried on
// the next cycle, so every step must be idempotent.
//
// It knows no step's work: the steps are the services', handed to it by
// internal/app.
package worker

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/internal/telemetry"
)

// Step is one idempotent unit of the worker's cycle.
type Step struct {
	Name string
	Run  func(ctx context.Context) error
}

// Loop runs Steps every Interval until its context ends.
type Loop struct {
	Interval time.Duration
	// Timeout bounds one step; zero means Interval.
	Timeout time.Duration
	Steps   []Step
	Log     *slog.Logger
	// OnCycle, when set, is called after every cycle with its duration and
	// the number of failed steps (metrics, tests).
	OnCycle func(d time.Duration, failed int)
	// Tracer, when set, traces each cycle: a span "worker.cycle" with a
	// child span per step ("worker.step <name>"), marked failed with its
	// error. Nil: no spans.
	Tracer trace.Tracer
}

// Run runs a first cycle at once, then one per tick, until ctx ends. A cycle
// in progress when ctx ends is cut short through the steps' contexts.
func (l *Loop) Run(ctx context.Context) error {
	t := time.NewTicker(l.Interval)
	defer t.Stop()
	for {
		l.cycle(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (l *Loop) cycle(ctx context.Context) {
	start := time.Now()
	failed := 0
	timeout := l.Timeout
	if timeout == 0 {
		timeout = l.Interval
	}
	var cycle trace.Span
	if l.Tracer != nil {
		ctx, cycle = l.Tracer.Start(ctx, "worker.cycle", trace.WithSpanKind(trace.SpanKindInternal))
		defer cycle.End()
	}
	for _, s := range l.Steps {
		if ctx.Err() != nil {
			return
		}
		if err := l.step(ctx, s, timeout); err != nil {
			failed++
			l.Log.Error("worker step failed", "step", s.Name, "err", err)
		}
	}
	if cycle != nil {
		cycle.SetAttributes(telemetry.FailedSteps.Int(failed))
		if failed > 0 {
			cycle.SetStatus(codes.Error, "a step failed")
		}
	}
	d := time.Since(start)
	l.Log.Debug("worker cycle", "duration_ms", d.Milliseconds(), "failed_steps", failed)
	if l.OnCycle != nil {
		l.OnCycle(d, failed)
	}
}

// step runs s under its own timeout, in a span of its own when tracing.
func (l *Loop) step(ctx context.Context, s Step, timeout time.Duration) error {
	var span trace.Span
	if l.Tracer != nil {
		ctx, span = l.Tracer.Start(ctx, "worker.step "+s.Name, trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(telemetry.Step.String(s.Name)))
		defer span.End()
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	err := s.Run(sctx)
	cancel()
	if err != nil && span != nil {
		span.SetStatus(codes.Error, "step failed")
		span.RecordError(err)
	}
	return err
}
