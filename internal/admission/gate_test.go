package admission

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/ratelimit"
	"github.com/tollgate/tollgate/internal/testenv"
)

// counting wraps a real admitter and counts the calls that reach it.
type counting struct {
	quota.Admitter
	calls atomic.Int64
}

func (c *counting) Admit(ctx context.Context, r quota.Request) (quota.Decision, error) {
	c.calls.Add(1)
	return c.Admitter.Admit(ctx, r)
}

// clock is a settable clock for the gate.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func mustLiveGate(tb testing.TB) (*Gate, *counting, *clock) {
	tb.Helper()
	rdb := testenv.Redis(tb)
	inner := &counting{Admitter: ratelimit.New(rdb, testenv.Prefix(tb, rdb))}
	clk := &clock{t: time.Now()}
	return New(inner, clk.now), inner, clk
}

func mustDeadGate(tb testing.TB) (*Gate, *counting, *clock) {
	tb.Helper()
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	tb.Cleanup(func() { dead.Close() })
	inner := &counting{Admitter: ratelimit.New(dead, "dead")}
	clk := &clock{t: time.Now()}
	return New(inner, clk.now), inner, clk
}

func dailyOf(n int64) quota.Request {
	return quota.Request{TenantID: "tn-" + testenv.RandomHex(6), Meter: "demo", Cost: 1,
		Limits: quota.Limits{DailyQuota: quota.Ptr(n)}, Overage: quota.OverageBlock}
}

func TestDenyCacheAnswersWithoutRedisUntilT(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, inner, clk := mustLiveGate(t)
	req := dailyOf(2)
	for i := range 3 {
		d, err := g.Admit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 2; d.Allowed != want {
			t.Fatalf("request %d: allowed %t, want %t", i, d.Allowed, want)
		}
	}
	if got := inner.calls.Load(); got != 3 {
		t.Fatalf("%d Redis calls for 3 requests, want 3", got)
	}
	for range 10 {
		d, err := g.Admit(ctx, req)
		if err != nil || d.Allowed || d.RetryAfter <= 0 || d.Violated[0] != quota.LimitDaily {
			t.Fatalf("cached refusal = %+v, %v; want refused by daily with a retry time", d, err)
		}
	}
	if got := inner.calls.Load(); got != 3 {
		t.Fatalf("refusals after the first made %d more Redis calls, want 0", got-3)
	}
	g.Forget(req.TenantID)
	if _, err := g.Admit(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := inner.calls.Load(); got != 4 {
		t.Fatalf("after Forget: %d Redis calls, want 4 (the entry must be gone)", got)
	}
	clk.add(48 * time.Hour) // past T: the entry expires and Redis decides again
	if _, err := g.Admit(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := inner.calls.Load(); got != 5 {
		t.Fatalf("after T: %d Redis calls, want 5", got)
	}
}

func TestFailOpenAdmitsAtTheTiersLimitsNeverUnlimited(t *testing.T) {
	t.Parallel()
	g, _, _ := mustDeadGate(t)
	req := quota.Request{TenantID: "tn-open", Meter: "demo", Cost: 1, FailOpen: true, Overage: quota.OverageBlock,
		Limits: quota.Limits{BurstRate: quota.Ptr(1.0), Burst: quota.Ptr(int64(3))}}
	allowed := 0
	for range 10 {
		d, err := g.Admit(context.Background(), req)
		if err != nil {
			t.Fatalf("fail-open tier: %v, want a decision", err)
		}
		if !d.Degraded {
			t.Fatal("decision not marked Degraded")
		}
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 3 {
		t.Fatalf("fail-open admitted %d of 10 at once, want the burst of 3", allowed)
	}
}

func TestFailClosedIsUnavailableAndBreakerSparesRedis(t *testing.T) {
	t.Parallel()
	g, inner, clk := mustDeadGate(t)
	req := dailyOf(100)
	for range 5 {
		_, err := g.Admit(context.Background(), req)
		if got := quota.ErrorCode(err); got != quota.CodeUnavailable {
			t.Fatalf("fail-closed tier: code %q (%v), want %q", got, err, quota.CodeUnavailable)
		}
	}
	if got := inner.calls.Load(); got != 1 {
		t.Fatalf("%d Redis calls during the breaker pause, want 1", got)
	}
	clk.add(breakerPause)
	_, _ = g.Admit(context.Background(), req)
	if got := inner.calls.Load(); got != 2 {
		t.Fatalf("after the pause: %d Redis calls, want 2 (the gate must try again)", got)
	}
}

func TestInvalidRequestIsNotAnOutage(t *testing.T) {
	t.Parallel()
	g, _, _ := mustLiveGate(t)
	req := dailyOf(10)
	req.Cost = 0
	req.FailOpen = true
	if _, err := g.Admit(context.Background(), req); quota.ErrorCode(err) != quota.CodeInvalid {
		t.Fatalf("cost 0: %v, want a CodeInvalid error and no fallback", err)
	}
}
