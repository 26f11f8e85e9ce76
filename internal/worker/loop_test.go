package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

func TestLoopRunsStepsEachCycleAndStops(t *testing.T) {
	t.Parallel()
	var good, bad atomic.Int64
	cycles := make(chan int, 100)
	ctx, cancel := context.WithCancel(context.Background())
	l := &Loop{
		Interval: 10 * time.Millisecond,
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Steps: []Step{
			{Name: "fails", Run: func(context.Context) error { bad.Add(1); return errors.New("boom") }},
			{Name: "works", Run: func(ctx context.Context) error {
				if _, ok := ctx.Deadline(); !ok {
					t.Error("step context has no deadline")
				}
				good.Add(1)
				return nil
			}},
		},
		OnCycle: func(_ time.Duration, failed int) { cycles <- failed },
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	for i := range 3 {
		select {
		case failed := <-cycles:
			if failed != 1 {
				t.Fatalf("cycle %d: %d failed steps, want 1", i, failed)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no cycle within 5s")
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop")
	}
	if good.Load() < 3 || bad.Load() < 3 {
		t.Fatalf("steps ran good=%d bad=%d times, want ≥3 each: a failing step must not stop the next", good.Load(), bad.Load())
	}
}
