package admission

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// pendingUsage sums a tenant's pending units and requests in Redis.
func pendingUsage(tb testing.TB, r *quotaredis.Store, tenant string) (units, requests int64) {
	tb.Helper()
	rows, err := r.Pending(context.Background(), tenant)
	if err != nil {
		tb.Fatal(err)
	}
	for _, row := range rows {
		units += row.Units
		requests += row.Requests
	}
	return units, requests
}

// mustIntact marks r's Redis as holding every counter the worker would
// restore (the worker's repair after a loss, or its first start).
func mustIntact(tb testing.TB, r *quotaredis.Store) {
	tb.Helper()
	ctx := context.Background()
	if err := r.MarkRestoring(ctx); err != nil {
		tb.Fatal(err)
	}
	if err := r.MarkRestored(ctx); err != nil {
		tb.Fatal(err)
	}
}

func failOpen() quota.Request {
	return quota.Request{TenantID: "tn-" + testenv.RandomHex(6), Meter: "demo", Cost: 2, FailOpen: true,
		Overage: quota.OverageBlock, Limits: quota.Limits{DailyQuota: quota.Ptr(int64(100))}}
}

// ownRedisGate is a Gate over a redis-server of the test's own, which the
// test may stop, start or pause, with calls that fail after readTimeout.
func ownRedisGate(t *testing.T, readTimeout time.Duration) (*testenv.RedisProcess, *redis.Client, *quotaredis.Store, *Gate) {
	t.Helper()
	proc := testenv.StartRedis(t)
	opts, err := redis.ParseURL(proc.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts.MaxRetries, opts.DialTimeout, opts.ReadTimeout = -1, 200*time.Millisecond, readTimeout
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	runner := quotaredis.New(rdb, "fo")
	return proc, rdb, runner, New(runner, time.Now)
}

// TestFailOpenUsageIsRecordedOnceRedisAnswers stops a Redis of the test's
// own: the requests the gate admits in process meanwhile reach the
// tenant's pending usage (and its daily quota) once Redis answers again
// and the worker restored what it lost, once however many reports follow.
func TestFailOpenUsageIsRecordedOnceRedisAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	proc, _, runner, g := ownRedisGate(t, 500*time.Millisecond)
	req := failOpen()
	if d, err := g.Admit(ctx, req); err != nil || !d.Allowed || d.Degraded {
		t.Fatalf("before the outage: %+v, %v", d, err)
	}
	proc.Stop()
	for i := range 3 {
		if d, err := g.Admit(ctx, req); err != nil || !d.Allowed || !d.Degraded {
			t.Fatalf("fail-open request %d: %+v, %v; want admitted in process", i, d, err)
		}
	}
	if err := g.Report(ctx); err == nil {
		t.Log("a report while Redis is away succeeded") // (nothing to send anywhere)
	}
	if rows, units := g.OutagePending(); rows != 1 || units != 6 {
		t.Fatalf("held during the outage: %d rows, %d units; want 1 row of 6 units", rows, units)
	}
	proc.Start() // empty: a restart loses what it held
	_ = g.Report(ctx)
	if u, _ := pendingUsage(t, runner, req.TenantID); u != 0 {
		t.Fatalf("recorded %d units before the worker restored the lost counters, want 0 (it waits)", u)
	}
	mustIntact(t, runner)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_ = g.Report(ctx)
		if u, r := pendingUsage(t, runner, req.TenantID); u == 6 && r == 3 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("pending after Redis came back: %d units, %d requests; want 6 and 3", u, r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for range 3 {
		if err := g.Report(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if u, r := pendingUsage(t, runner, req.TenantID); u != 6 || r != 3 {
		t.Fatalf("after more reports: %d units, %d requests; want 6 and 3 (once)", u, r)
	}
	if rows, units := g.OutagePending(); rows != 0 || units != 0 {
		t.Fatalf("still held: %d rows, %d units", rows, units)
	}
	if toRedis, _ := g.OutageRecorded(); toRedis != 6 {
		t.Fatalf("recorded by Redis: %d units, want 6", toRedis)
	}
	d, err := runner.Peek(ctx, req.TenantID, req.Limits, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if day, _ := d.Limit(quota.LimitDaily); day.Remaining != 94 {
		t.Fatalf("daily remaining %d, want 94: the outage's usage is not free quota", day.Remaining)
	}
}

// flaky is a store whose admissions fail (Redis is away for them) and
// whose first outage records fail after they landed (a timeout), or
// before they left (notSent).
type flaky struct {
	*quotaredis.Store
	notSent bool
	calls   atomic.Int64
}

func (f *flaky) Admit(context.Context, quota.Request) (quota.Decision, error) {
	return quota.Decision{}, errors.New("dial tcp: connection refused")
}

func (f *flaky) RecoverOutage(ctx context.Context, b *quota.OutageBatch) error {
	if f.calls.Add(1) > 1 {
		return f.Runner.RecoverOutage(ctx, b)
	}
	if f.notSent {
		return errors.Join(quota.ErrNotSent, errors.New("dial tcp: connection refused"))
	}
	if err := f.Runner.RecoverOutage(ctx, b); err != nil {
		return err
	}
	return errors.New("read tcp: i/o timeout")
}

// failingGate is a Gate whose admissions fail (Redis is away for them)
// on a Redis of the test's own that holds every counter, on the test's
// clock; its outage records reach that Redis.
func failingGate(t *testing.T) (*Gate, *quotaredis.Store, *clock) {
	t.Helper()
	rdb := testenv.Redis(t)
	runner := quotaredis.New(rdb, testenv.Prefix(t, rdb))
	mustIntact(t, runner)
	f := &flaky{Store: runner}
	f.calls.Store(1) // no failure
	clk := &clock{t: time.Now()}
	return New(f, clk.now), runner, clk
}

// TestFailOpenUsageRetriedIsCountedOnce: a record that landed but
// answered an error is sent again, under the same id, and counted once; a
// record that never left is sent again too, with the usage held since.
func TestFailOpenUsageRetriedIsCountedOnce(t *testing.T) {
	t.Parallel()
	for name, notSent := range map[string]bool{"landed": false, "not sent": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rdb := testenv.Redis(t)
			runner := quotaredis.New(rdb, testenv.Prefix(t, rdb))
			mustIntact(t, runner)
			f := &flaky{Store: runner, notSent: notSent}
			clk := &clock{t: time.Now()}
			g := New(f, clk.now)
			req := failOpen()
			for range 2 {
				if d, err := g.Admit(ctx, req); err != nil || !d.Allowed || !d.Degraded {
					t.Fatalf("%+v, %v", d, err)
				}
			}
			err := g.FlushOutage(ctx, false)
			if notSent != (err == nil) {
				t.Fatalf("first flush: %v", err)
			}
			if d, err := g.Admit(ctx, req); err != nil || !d.Allowed {
				t.Fatalf("%+v, %v", d, err)
			}
			for range 3 {
				clk.add(breakerPause) // the admissions' errors opened the breaker
				if err := g.FlushOutage(ctx, false); err != nil {
					t.Fatal(err)
				}
			}
			if u, r := pendingUsage(t, runner, req.TenantID); u != 6 || r != 3 {
				t.Fatalf("pending %d units, %d requests; want 6 and 3, once", u, r)
			}
			if rows, units := g.OutagePending(); rows != 0 || units != 0 {
				t.Fatalf("still held: %d rows, %d units", rows, units)
			}
		})
	}
}

// TestFailOpenRefundAndSettleNetTheUsageHeld: a fail-open admission that
// is refunded, or settled to another cost, leaves the units it finally
// cost; also once its first units have left the node.
func TestFailOpenRefundAndSettleNetTheUsageHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, runner, clk := failingGate(t)
	flush := func() {
		t.Helper()
		clk.add(breakerPause) // the admissions' errors opened the breaker
		if err := g.FlushOutage(ctx, false); err != nil {
			t.Fatal(err)
		}
	}
	req := failOpen()
	req.Overage, req.OveragePriceCentsPer1K = quota.OverageBill, 1000
	req.Limits.MonthlyQuota = quota.Ptr(int64(3))
	admit := func() quota.Decision {
		t.Helper()
		d, err := g.Admit(ctx, req)
		if err != nil || !d.Allowed || !d.Degraded {
			t.Fatalf("%+v, %v", d, err)
		}
		return d
	}
	refunded := admit()
	if err := g.Refund(ctx, req, refunded); err != nil {
		t.Fatal(err)
	}
	settled := admit()
	id := "rid-" + testenv.RandomHex(4)
	if err := g.Reserve(ctx, id, req, settled); err != nil {
		t.Fatal(err)
	}
	if s, err := g.Settle(ctx, req.TenantID, id, 5); err != nil || s.Status != quota.SettleApplied || s.Delta != 3 {
		t.Fatalf("settle to 5: %+v, %v; want applied, delta 3", s, err)
	}
	if s, err := g.Settle(ctx, req.TenantID, id, 9); err != nil || s.Status != quota.SettleAlready {
		t.Fatalf("second settle: %+v, %v; want already", s, err)
	}
	flush()
	// 2 requests, 0 + 5 units; 5 past a monthly quota of 3: 2 overage
	rows, err := runner.Pending(ctx, req.TenantID)
	if err != nil || len(rows) != 1 || rows[0].Units != 5 || rows[0].Requests != 2 || rows[0].Overage != 2 {
		t.Fatalf("pending %+v, %v; want one row: 5 units, 2 requests, 2 overage", rows, err)
	}
	// a refund after the units left the node gives back its units and
	// the overage recovered for them
	late := admit()
	flush()
	if err := g.Refund(ctx, req, late); err != nil {
		t.Fatal(err)
	}
	flush()
	rows, err = runner.Pending(ctx, req.TenantID)
	if err != nil || len(rows) != 1 || rows[0].Units != 5 || rows[0].Requests != 3 || rows[0].Overage != 2 {
		t.Fatalf("after a late refund: pending %+v, %v; want 5 units, 3 requests, 2 overage", rows, err)
	}
}

// TestFailOpenWithAnIdempotencyKeyFailsClosed: keys are kept in Redis
// only, so a request that carries one is not run in process, where a
// repeat could run twice.
func TestFailOpenWithAnIdempotencyKeyFailsClosed(t *testing.T) {
	t.Parallel()
	g, _, _ := mustDeadGate(t)
	req := failOpen()
	req.IdempotencyKey, req.IdempotencyFingerprint = "k1", "GET /api/demo/echo"
	for i := range 2 {
		if d, err := g.Admit(context.Background(), req); quota.ErrorCode(err) != quota.CodeUnavailable {
			t.Fatalf("attempt %d with the key during an outage: %+v, %v; want unavailable", i, d, err)
		}
	}
	req.IdempotencyKey = ""
	if d, err := g.Admit(context.Background(), req); err != nil || !d.Allowed || !d.Degraded {
		t.Fatalf("without a key: %+v, %v; want admitted in process", d, err)
	}
}

// TestFailOpenUsageBoundRefusesNewRows: past the rows a node may hold, a
// fail-open request that needs a new row is refused (unavailable), never
// served unbilled; a row already held still grows.
func TestFailOpenUsageBoundRefusesNewRows(t *testing.T) {
	t.Parallel()
	g, _, _ := mustDeadGate(t)
	g.outage.held = maxOutageRows - 1
	held := failOpen()
	if d, err := g.Admit(context.Background(), held); err != nil || !d.Allowed {
		t.Fatalf("the last row: %+v, %v", d, err)
	}
	other := failOpen()
	if _, err := g.Admit(context.Background(), other); quota.ErrorCode(err) != quota.CodeUnavailable {
		t.Fatalf("a new row past the bound: %v, want unavailable", err)
	}
	if d, err := g.Admit(context.Background(), held); err != nil || !d.Allowed {
		t.Fatalf("the held row again: %+v, %v; want admitted", d, err)
	}
	if got := g.OutageRefused(); got != 1 {
		t.Fatalf("refused %d, want 1", got)
	}
}

// TestFailOpenUsageUnderConcurrentFlushes: admissions and refunds racing
// the flushes end up in Redis exactly: every unit admitted and not
// refunded, every request.
func TestFailOpenUsageUnderConcurrentFlushes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, runner, clk := failingGate(t)
	tenants := make([]quota.Request, 4)
	for i := range tenants {
		tenants[i] = failOpen()
		tenants[i].Cost = 1
		tenants[i].Limits.DailyQuota = quota.Ptr(int64(1000))
	}
	stop := make(chan struct{})
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		for {
			select {
			case <-stop:
				return
			default:
			}
			clk.add(breakerPause)
			if err := g.FlushOutage(ctx, false); err != nil {
				t.Error(err)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	var refunds [4]atomic.Int64
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				req := tenants[(w+i)%4]
				d, err := g.Admit(ctx, req)
				if err != nil || !d.Allowed {
					t.Errorf("%+v, %v", d, err)
					return
				}
				if i%5 == 0 {
					if err := g.Refund(ctx, req, d); err != nil {
						t.Error(err)
					}
					refunds[(w+i)%4].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-flushed
	clk.add(breakerPause)
	if err := g.FlushOutage(ctx, false); err != nil {
		t.Fatal(err)
	}
	for i, req := range tenants {
		u, r := pendingUsage(t, runner, req.TenantID)
		if want := 100 - refunds[i].Load(); u != want || r != 100 {
			t.Errorf("tenant %d: pending %d units, %d requests; want %d and 100", i, u, r, want)
		}
	}
	if rows, units := g.OutagePending(); rows != 0 || units != 0 {
		t.Fatalf("still held: %d rows, %d units", rows, units)
	}
}

// TestFailOpenGiveBackToTheLedgerNamesNoMoreOverageThanUnits: a refund of
// a fail-open request whose units Redis recovered, then sent to the ledger
// (Redis not ready again at shutdown), gives back no more overage units than
// units: its last units first, the meter's overage, then the tier's. The
// tier's quota of 10 is filled by demo; search's 2 + 2 units are past it,
// the last 2 past search's own quota of 2 too (the meter's only): 2 units
// of each overage. Refunding a search of 2 gives back the meter's 2: the
// ledger keeps the tier's 2.
func TestFailOpenGiveBackToTheLedgerNamesNoMoreOverageThanUnits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	var tenant string
	if err := db.QueryRow(ctx, `INSERT INTO tenants (name, tier, webhook_secret) VALUES ('t', 'pro', decode(md5('t') || md5('t'), 'hex')) RETURNING id::text`).Scan(&tenant); err != nil {
		t.Fatal(err)
	}
	g, runner, clk := failingGate(t)
	g.Ledger = billing.NewLedger(db)
	req := func(meter string, cost int64) quota.Request {
		return quota.Request{TenantID: tenant, Meter: meter, Cost: cost, FailOpen: true, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
			Limits:      quota.Limits{MonthlyQuota: quota.Ptr(int64(10))},
			MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: quota.Ptr(int64(2)), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}}}
	}
	admit := func(q quota.Request) quota.Decision {
		t.Helper()
		d, err := g.Admit(ctx, q)
		if err != nil || !d.Allowed || !d.Degraded {
			t.Fatalf("%+v, %v", d, err)
		}
		return d
	}
	flush := func() {
		t.Helper()
		clk.add(breakerPause) // the admissions' errors opened the breaker
		if err := g.FlushOutage(ctx, false); err != nil {
			t.Fatal(err)
		}
	}
	admit(req("demo", 10))
	flush()
	admit(req("search", 2))
	last := admit(req("search", 2))
	flush()
	rc := billing.NewReconciler(db, runner, time.Now, slog.New(slog.DiscardHandler))
	if err := rc.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ledger := func() (units, over, meterOver int64) {
		t.Helper()
		if err := db.QueryRow(ctx, `SELECT coalesce(sum(units), 0), coalesce(sum(overage_units), 0), coalesce(sum(meter_overage_units), 0)
			FROM usage WHERE tenant_id = $1 AND meter = 'search'`, tenant).Scan(&units, &over, &meterOver); err != nil {
			t.Fatal(err)
		}
		return units, over, meterOver
	}
	if u, o, m := ledger(); u != 4 || o != 2 || m != 2 {
		t.Fatalf("search in the ledger: %d units, %d of the tier's overage, %d of the meter's; want 4, 2, 2", u, o, m)
	}
	if err := g.Refund(ctx, req("search", 2), last); err != nil {
		t.Fatal(err)
	}
	// Redis may not take it (a loss the worker has not repaired yet), and
	// the node shuts down: the ledger takes it
	if err := runner.MarkRestoring(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.FlushOutage(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, n := g.OutageRecorded(); n != -2 {
		t.Fatalf("recorded by the ledger: %d units, want -2 (search's 2 given back)", n)
	}
	if u, o, m := ledger(); u != 2 || o != 2 || m != 0 {
		t.Errorf("search in the ledger after the refund: %d units, %d of the tier's overage, %d of the meter's; want 2, 2, 0", u, o, m)
	}
}

// TestFailOpenRowsAreCountedInTheOrderAdmitted: the rows of a batch are
// counted in Redis in the order their usage was admitted, as admission
// would have counted it: 10 units of demo fill the tier's quota of 10,
// then 4 of search are past it, the last 2 past search's own quota of 2
// too (the meter's overage only): 2 units of each overage. Counted the
// other way round, search's 2 would be the meter's and demo's last 4 the
// tier's: 6 units of overage for 4 units past the quota. For 12 tenants,
// each in one batch.
func TestFailOpenRowsAreCountedInTheOrderAdmitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, runner, clk := failingGate(t)
	tenants := make([]string, 12)
	for i := range tenants {
		tenants[i] = "tn-" + testenv.RandomHex(6)
		for _, m := range []struct {
			meter string
			cost  int64
		}{{"demo", 10}, {"search", 4}} {
			req := quota.Request{TenantID: tenants[i], Meter: m.meter, Cost: m.cost, FailOpen: true,
				Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000, Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(10))},
				MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: quota.Ptr(int64(2)), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}}}
			if d, err := g.Admit(ctx, req); err != nil || !d.Allowed || !d.Degraded {
				t.Fatalf("%+v, %v", d, err)
			}
			clk.add(time.Millisecond)
		}
	}
	clk.add(breakerPause) // the admissions' errors opened the breaker
	if err := g.FlushOutage(ctx, false); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range tenants {
		rows, err := runner.Pending(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		var over, meterOver int64
		for _, r := range rows {
			over, meterOver = over+r.Overage, meterOver+r.MeterOverage
		}
		if over != 2 || meterOver != 2 {
			t.Errorf("tenant %s: %d units of the tier's overage, %d of the meter's; want 2 and 2", tenant, over, meterOver)
		}
	}
}

// TestFailOpenRefusesARequestRedisMayHaveCounted: a fail-open tenant's
// request whose Redis call got no answer (Redis paused) may still be
// counted there when Redis resumes, so it is refused rather than admitted
// in process (which would count it twice); the requests after it meet the
// open breaker and are admitted in process, counted once each.
func TestFailOpenRefusesARequestRedisMayHaveCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	proc, rdb, runner, g := ownRedisGate(t, 300*time.Millisecond)
	req := failOpen()
	if d, err := g.Admit(ctx, req); err != nil || !d.Allowed || d.Degraded {
		t.Fatalf("before the pause: %+v, %v", d, err)
	}
	proc.Pause()
	resumed := false
	defer func() {
		if !resumed {
			proc.Resume()
		}
	}()
	// Until the breaker opens (breakerErrors failures), each request
	// reaches the paused Redis and is refused; then they are admitted here.
	refused := 0
	for {
		d, err := g.Admit(ctx, req)
		if err == nil {
			if !d.Allowed || !d.Degraded || refused != breakerErrors {
				t.Fatalf("after %d refusals: %+v; want admitted in process once the breaker opened at %d", refused, d, breakerErrors)
			}
			break
		}
		if quota.ErrorCode(err) != quota.CodeUnavailable || refused == breakerErrors {
			t.Fatalf("request %d Redis got no answer to: %v; want unavailable (it may be counted there), %d times", refused+1, err, breakerErrors)
		}
		if rows, units := g.OutagePending(); rows != 0 || units != 0 {
			t.Fatalf("held in process for a refused request: %d rows, %d units; want none", rows, units)
		}
		refused++
	}
	if _, units := g.OutagePending(); units != req.Cost {
		t.Fatalf("held in process: %d units, want %d (the one admitted here)", units, req.Cost)
	}
	proc.Resume()
	resumed = true
	// The paused calls run on resume: Redis counts the first request and
	// those of the refused ones whose call it got (a refused request may
	// have been stopped earlier, on a new connection's handshake); the
	// process holds the one it admitted, whose call Redis never got. No
	// request is counted twice: Redis holds at most the first and the
	// refused ones.
	deadline := time.Now().Add(5 * time.Second)
	for rdb.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("Redis does not answer after the resume")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	u, r := pendingUsage(t, runner, req.TenantID)
	if r < 1 || r > int64(1+refused) || u != r*req.Cost {
		t.Fatalf("Redis holds %d units in %d requests after the resume; want the first and at most the %d refused", u, r, refused)
	}
}
