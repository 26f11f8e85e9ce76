package admission

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// counting wraps a real runner and counts the admissions that reach it.
type counting struct {
	*quotaredis.Store
	calls atomic.Int64
}

func (c *counting) Admit(ctx context.Context, r quota.Request) (quota.Decision, error) {
	c.calls.Add(1)
	return c.Runner.Admit(ctx, r)
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
	inner := &counting{Store: quotaredis.New(rdb, testenv.Prefix(tb, rdb))}
	clk := &clock{t: time.Now()}
	return New(inner, clk.now), inner, clk
}

// mustDeadGate is a gate on a Redis that refuses every connection. Each
// call to it is sent again for about 2 s before it fails (a connection
// never made may be a failover), so its tests take seconds: go test -short
// (make test-unit) leaves them to make test.
func mustDeadGate(tb testing.TB) (*Gate, *counting, *clock) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("slow: a Redis that refuses connections costs seconds a call; make test runs it")
	}
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	tb.Cleanup(func() { dead.Close() })
	inner := &counting{Store: quotaredis.New(dead, "dead")}
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

// TestPrepaidFailsClosedOnAFailOpenTier: a prepaid tenant's credit is
// drawn in Redis only, so an outage refuses its requests (503) even on a
// fail-open tier, where a postpaid tenant of the tier is admitted.
func TestPrepaidFailsClosedOnAFailOpenTier(t *testing.T) {
	t.Parallel()
	g, _, _ := mustDeadGate(t)
	req := quota.Request{TenantID: "tn-prepaid", Meter: "demo", Cost: 1, FailOpen: true, Overage: quota.OverageBill,
		OveragePriceCentsPer1K: 1000, Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(0))}}
	if d, err := g.Admit(context.Background(), req); err != nil || !d.Allowed || !d.Degraded {
		t.Fatalf("postpaid on a fail-open tier: %+v, %v; want admitted, degraded", d, err)
	}
	req.TenantID, req.Prepaid = "tn-prepaid-2", &quota.Prepaid{BalanceMillicents: 1_000_000, PeriodID: 203105}
	_, err := g.Admit(context.Background(), req)
	if got := quota.ErrorCode(err); got != quota.CodeUnavailable {
		t.Fatalf("prepaid on a fail-open tier: code %q (%v), want %q", got, err, quota.CodeUnavailable)
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
	if got := inner.calls.Load(); got != breakerErrors {
		t.Fatalf("%d Redis calls for 5 requests, want %d (the breaker opens after %d errors)", got, breakerErrors, breakerErrors)
	}
	clk.add(breakerPause)
	_, _ = g.Admit(context.Background(), req)
	if got := inner.calls.Load(); got != breakerErrors+1 {
		t.Fatalf("after the pause: %d Redis calls, want %d (the gate must try again)", got, breakerErrors+1)
	}
	// Half-open: one more error reopens it at once.
	_, _ = g.Admit(context.Background(), req)
	if got := inner.calls.Load(); got != breakerErrors+1 {
		t.Fatalf("after a failed retry: %d Redis calls, want %d (open again)", got, breakerErrors+1)
	}
}

// twoShards routes tenants to one of two real runners, as a Redis Cluster
// routes slots to masters: tenants named "a-…" live on a dead server.
type twoShards struct {
	dead, live *counting
}

func (s *twoShards) of(tenant string) *counting {
	if tenant[0] == 'a' {
		return s.dead
	}
	return s.live
}

func (s *twoShards) Admit(ctx context.Context, r quota.Request) (quota.Decision, error) {
	return s.of(r.TenantID).Admit(ctx, r)
}
func (s *twoShards) RefundRequest(ctx context.Context, req quota.Request, d quota.Decision) error {
	return s.of(req.TenantID).RefundRequest(ctx, req, d)
}
func (s *twoShards) StoreAnswer(ctx context.Context, req quota.Request, a quota.StoredAnswer) (bool, error) {
	return s.of(req.TenantID).StoreAnswer(ctx, req, a)
}
func (s *twoShards) ReleaseKey(ctx context.Context, req quota.Request) error {
	return s.of(req.TenantID).ReleaseKey(ctx, req)
}
func (s *twoShards) ClaimAnswer(ctx context.Context, req quota.Request, force bool) (quota.AnswerClaim, error) {
	return s.of(req.TenantID).ClaimAnswer(ctx, req, force)
}
func (s *twoShards) UnclaimAnswer(ctx context.Context, req quota.Request) error {
	return s.of(req.TenantID).UnclaimAnswer(ctx, req)
}
func (s *twoShards) Answer(ctx context.Context, tenant, key string) (quota.StoredAnswer, error) {
	return s.of(tenant).Answer(ctx, tenant, key)
}
func (s *twoShards) CountRefused(ctx context.Context, counts []quota.RefusalCount) error {
	return s.live.CountRefused(ctx, counts)
}
func (s *twoShards) ReleasePolicies(ctx context.Context, req quota.Request) error {
	return s.of(req.TenantID).ReleasePolicies(ctx, req)
}
func (s *twoShards) ReportActive(ctx context.Context) error {
	return errors.Join(s.live.ReportActive(ctx), s.dead.ReportActive(ctx))
}
func (s *twoShards) Shard(tenant string) string { return tenant[:1] }
func (s *twoShards) RecoverOutage(ctx context.Context, b *quota.OutageBatch) error {
	return s.of(b.Request.TenantID).RecoverOutage(ctx, b)
}
func (s *twoShards) EpochLost(ctx context.Context) (bool, error) { return s.live.EpochLost(ctx) }

func mustTwoShardGate(tb testing.TB) (*Gate, *twoShards, *clock) {
	tb.Helper()
	live, _, _ := mustLiveGate(tb)
	dead, _, _ := mustDeadGate(tb)
	s := &twoShards{dead: dead.store.(*counting), live: live.store.(*counting)}
	clk := &clock{t: time.Now()}
	return New(s, clk.now), s, clk
}

// TestBreakerIsPerShard: errors on one shard pause that shard only.
func TestBreakerIsPerShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, s, _ := mustTwoShardGate(t)
	onDead := quota.Request{TenantID: "a-" + testenv.RandomHex(4), Meter: "demo", Cost: 1,
		Limits: quota.Limits{DailyQuota: quota.Ptr(int64(100))}, Overage: quota.OverageBlock}
	for range 2 * breakerErrors {
		if _, err := g.Admit(ctx, onDead); quota.ErrorCode(err) != quota.CodeUnavailable {
			t.Fatalf("tenant on the dead shard: %v, want unavailable", err)
		}
	}
	if got := s.dead.calls.Load(); got != breakerErrors {
		t.Fatalf("dead shard: %d calls, want %d (then the breaker is open)", got, breakerErrors)
	}
	for i := range 3 {
		req := dailyOf(100)
		req.TenantID = "b-" + testenv.RandomHex(4)
		d, err := g.Admit(ctx, req)
		if err != nil || !d.Allowed || d.Degraded {
			t.Fatalf("tenant %d on the live shard: %+v, %v; want admitted by Redis", i, d, err)
		}
	}
	if got := s.live.calls.Load(); got != 3 {
		t.Fatalf("live shard: %d calls, want 3 (its breaker is closed)", got)
	}
}

// TestOneErrorDoesNotOpenTheBreaker: a single error is noise.
func TestOneErrorDoesNotOpenTheBreaker(t *testing.T) {
	t.Parallel()
	g, inner, _ := mustDeadGate(t)
	req := dailyOf(100)
	_, _ = g.Admit(context.Background(), req)
	_, _ = g.Admit(context.Background(), req)
	if got := inner.calls.Load(); got != 2 {
		t.Fatalf("%d Redis calls for 2 requests, want 2: one error must not open the breaker", got)
	}
}

// TestLocalLimiterLastsUntilItsOwnShardAnswers: a tenant's fail-open
// limiter survives another shard's successes.
func TestLocalLimiterLastsUntilItsOwnShardAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, _, _ := mustTwoShardGate(t)
	onDead := quota.Request{TenantID: "a-" + testenv.RandomHex(4), Meter: "demo", Cost: 1, FailOpen: true,
		Overage: quota.OverageBlock, Limits: quota.Limits{BurstRate: quota.Ptr(0.001), Burst: quota.Ptr(int64(2))}}
	for i := range 2 {
		if d, err := g.Admit(ctx, onDead); err != nil || !d.Allowed || !d.Degraded {
			t.Fatalf("fail-open request %d: %+v, %v; want admitted in-process", i, d, err)
		}
	}
	live := dailyOf(100)
	live.TenantID = "b-" + testenv.RandomHex(4)
	if d, err := g.Admit(ctx, live); err != nil || !d.Allowed {
		t.Fatalf("live shard: %+v, %v", d, err)
	}
	if d, err := g.Admit(ctx, onDead); err != nil || d.Allowed {
		t.Fatalf("after another shard answered: %+v, %v; want refused (burst of 2 spent in-process)", d, err)
	}
}

// TestDenyCacheRefusalsAreCounted: every refusal reaches the pending usage,
// the ones answered in-process through FlushRefusals.
func TestDenyCacheRefusalsAreCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, inner, _ := mustLiveGate(t)
	req := dailyOf(1)
	if d, _ := g.Admit(ctx, req); !d.Allowed {
		t.Fatal("first request refused")
	}
	for range 7 {
		if d, err := g.Admit(ctx, req); err != nil || d.Allowed {
			t.Fatalf("%+v, %v; want refused", d, err)
		}
	}
	if got := inner.calls.Load(); got != 2 {
		t.Fatalf("%d Redis calls, want 2 (6 refusals from the deny cache)", got)
	}
	if err := g.FlushRefusals(ctx); err != nil {
		t.Fatal(err)
	}
	if refused := pendingRefused(t, inner, req.TenantID); refused != 7 {
		t.Fatalf("pending refusals: got %d, want 7", refused)
	}
	if err := g.FlushRefusals(ctx); err != nil {
		t.Fatal(err)
	}
	if refused := pendingRefused(t, inner, req.TenantID); refused != 7 {
		t.Fatalf("a second flush counted again: got %d, want 7", refused)
	}
}

// TestForgetAllClearsEveryDenyEntry: a tier change clears every tenant.
func TestForgetAllClearsEveryDenyEntry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, inner, _ := mustLiveGate(t)
	reqs := []quota.Request{dailyOf(1), dailyOf(1)}
	for _, r := range reqs {
		if _, err := g.Admit(ctx, r); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Admit(ctx, r); err != nil { // refused: remembered
			t.Fatal(err)
		}
	}
	before := inner.calls.Load()
	g.Forget("")
	for _, r := range reqs {
		if _, err := g.Admit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if got := inner.calls.Load() - before; got != 2 {
		t.Fatalf("after Forget(\"\"): %d Redis calls for 2 tenants, want 2", got)
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
