// Package worker runs the worker's steps on a ticker: each cycle runs every
// step in order under its own timeout; a failed step is logged and retried on
// the next cycle, so every step must be idempotent.
package worker

import (
	"context"
	"log/slog"
	"time"
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
	for _, s := range l.Steps {
		if ctx.Err() != nil {
			return
		}
		sctx, cancel := context.WithTimeout(ctx, timeout)
		err := s.Run(sctx)
		cancel()
		if err != nil {
			failed++
			l.Log.Error("worker step failed", "step", s.Name, "err", err)
		}
	}
	d := time.Since(start)
	l.Log.Debug("worker cycle", "duration_ms", d.Milliseconds(), "failed_steps", failed)
	if l.OnCycle != nil {
		l.OnCycle(d, failed)
	}
}
