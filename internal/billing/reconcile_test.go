package billing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type rig struct {
	db     *pgxpool.Pool
	rdb    redis.UniversalClient
	prefix string
	rl     *quotaredis.Store
}

func mustRig(tb testing.TB, rdb redis.UniversalClient) *rig {
	tb.Helper()
	if rdb == nil {
		rdb = testenv.Redis(tb)
	}
	prefix := testenv.Prefix(tb, rdb)
	return &rig{db: testenv.Postgres(tb), rdb: rdb, prefix: prefix, rl: quotaredis.New(rdb, prefix)}
}

// tenants inserts n tenants on tier and returns their ids.
func (r *rig) tenants(tb testing.TB, n int, tier string) []string {
	tb.Helper()
	rows, err := r.db.Query(context.Background(), `
		INSERT INTO tenants (name, tier, webhook_secret)
		SELECT 'tenant ' || i, $2, decode(md5(i::text) || md5(i::text), 'hex') FROM generate_series(1, $1) i
		RETURNING id::text`, n, tier)
	if err != nil {
		tb.Fatal(err)
	}
	var ids []string
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		ids = append(ids, id)
	}
	return ids
}

func (r *rig) reconciler() *Reconciler { return NewReconciler(r.db, r.rl, time.Now, quiet) }

// admit sends n admissions of random cost spread over tenants and returns the
// units admitted per tenant, as the API would count them.
func (r *rig) admit(tb testing.TB, ids []string, n int, seed uint64) map[string]int64 {
	tb.Helper()
	rnd := rand.New(rand.NewPCG(seed, seed))
	got := map[string]int64{}
	for range n {
		id := ids[rnd.IntN(len(ids))]
		cost := int64(1 + rnd.IntN(9))
		d, err := r.rl.Admit(context.Background(), quota.Request{TenantID: id, Meter: []string{"demo", "report"}[rnd.IntN(2)],
			Cost: cost, Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(1 << 40))}})
		if err != nil {
			tb.Fatal(err)
		}
		if d.Allowed {
			got[id] += cost
		}
	}
	if err := r.rl.ReportActive(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return got
}

// counts are a tenant's usage counters as the ledger keeps them.
type counts struct{ units, requests, rejected, shadowRefused, degraded int64 }

// policed is the policies of admitPoliced, per tenant: token buckets that
// refill one per 1000 s (empty for the test) of 3 (shadow, every request)
// and 8 (degrade, the "report" meter's requests).
var policed = func() struct{ shadow, degrade quota.Policy } {
	var p struct{ shadow, degrade quota.Policy }
	p.shadow = quota.Policy{Name: "shadow-three", Algorithm: quota.AlgTokenBucket, Capacity: quota.Ptr(int64(3)),
		RefillPerSec: quota.Ptr(0.001), OnRefuse: quota.RefuseShadow}
	p.degrade = quota.Policy{Name: "degrade-reports", Algorithm: quota.AlgTokenBucket, Capacity: quota.Ptr(int64(8)),
		RefillPerSec: quota.Ptr(0.001), OnRefuse: quota.RefuseDegrade,
		Fallback: &quota.Fallback{Status: 200, ContentType: "text/plain", Body: "later"}}
	for _, pol := range []*quota.Policy{&p.shadow, &p.degrade} {
		pol.Defaults()
		if err := pol.Validate(); err != nil {
			panic(err)
		}
	}
	return p
}()

// admitPoliced is admit under a daily quota of 60 units and the policed
// policies: some requests are admitted, some refused by the quota, some
// degraded, and many counted as shadow refusals. It returns each tenant's
// counters as its decisions tell them.
func (r *rig) admitPoliced(tb testing.TB, ids []string, n int, seed uint64) map[string]counts {
	tb.Helper()
	rnd := rand.New(rand.NewPCG(seed, seed))
	got := map[string]counts{}
	for i := range n {
		id := ids[rnd.IntN(len(ids))]
		cost := int64(1 + rnd.IntN(9))
		meter := []string{"demo", "report"}[rnd.IntN(2)]
		calls := []quota.PolicyCall{{Policy: &policed.shadow, Value: id, Limit: 3}}
		if meter == "report" {
			calls = append(calls, quota.PolicyCall{Policy: &policed.degrade, Value: id, Limit: 8})
		}
		d, err := r.rl.Admit(context.Background(), quota.Request{TenantID: id, Meter: meter, Cost: cost,
			Limits: quota.Limits{DailyQuota: quota.Ptr(int64(60))}, Policies: calls, RequestID: fmt.Sprintf("req-%d-%d", seed, i)})
		if err != nil {
			tb.Fatal(err)
		}
		c := got[id]
		switch {
		case d.Allowed:
			c.units, c.requests = c.units+cost, c.requests+1
		case d.Fallback != nil:
			c.degraded++
		default:
			c.rejected++
		}
		for _, st := range d.Policies {
			if st.Outcome == quota.PolicyShadowRefused {
				c.shadowRefused++
			}
		}
		got[id] = c
	}
	if err := r.rl.ReportActive(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return got
}

// ledgerCounts returns the counters per tenant in Postgres.
func (r *rig) ledgerCounts(tb testing.TB) map[string]counts {
	tb.Helper()
	rows, err := r.db.Query(context.Background(), `
		SELECT tenant_id::text, sum(units)::bigint, sum(requests)::bigint, sum(rejected)::bigint,
		       sum(shadow_refused)::bigint, sum(degraded)::bigint
		FROM usage GROUP BY 1`)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	out := map[string]counts{}
	for rows.Next() {
		var id string
		var c counts
		if err := rows.Scan(&id, &c.units, &c.requests, &c.rejected, &c.shadowRefused, &c.degraded); err != nil {
			tb.Fatal(err)
		}
		out[id] = c
	}
	return out
}

// equalCounts checks every tenant's counters in the ledger against those
// admitted, and that the traffic had some of each.
func equalCounts(tb testing.TB, got, want map[string]counts) {
	tb.Helper()
	var all counts
	for id, w := range want {
		if got[id] != w {
			tb.Errorf("tenant %s: %+v in Postgres, want the %+v admitted", id, got[id], w)
		}
		all.units, all.rejected = all.units+w.units, all.rejected+w.rejected
		all.shadowRefused, all.degraded = all.shadowRefused+w.shadowRefused, all.degraded+w.degraded
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			tb.Errorf("tenant %s: %+v in Postgres, want nothing", id, got[id])
		}
	}
	if all.units == 0 || all.rejected == 0 || all.shadowRefused == 0 || all.degraded == 0 {
		tb.Errorf("the traffic had %+v in all: want some of each counter", all)
	}
}

// ledger returns the units per tenant in Postgres.
func (r *rig) ledger(tb testing.TB) map[string]int64 {
	tb.Helper()
	rows, err := r.db.Query(context.Background(), `SELECT tenant_id::text, sum(units)::bigint FROM usage GROUP BY 1`)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var u int64
		_ = rows.Scan(&id, &u)
		out[id] = u
	}
	return out
}

func equalUnits(tb testing.TB, got, want map[string]int64) {
	tb.Helper()
	var g, w int64
	for id, u := range want {
		w += u
		if got[id] != u {
			tb.Errorf("tenant %s: %d units in Postgres, want the %d admitted", id, got[id], u)
		}
	}
	for _, u := range got {
		g += u
	}
	if g != w {
		tb.Errorf("Postgres holds %d units in all, want the %d admitted", g, w)
	}
}

// addCounts adds the counts of more to want, tenant by tenant.
func addCounts(want, more map[string]counts) {
	for id, c := range more {
		w := want[id]
		w.units, w.requests, w.rejected = w.units+c.units, w.requests+c.requests, w.rejected+c.rejected
		w.shadowRefused, w.degraded = w.shadowRefused+c.shadowRefused, w.degraded+c.degraded
		want[id] = w
	}
}

// TestFlushIsExactlyOnceThroughACrashAtEachStep stops the flush between each
// pair of its steps, as a crash would (the recorded batches are dropped by
// the next cycle's claims: "finished" is in the second cycle), then lets
// fresh reconcilers finish:
// every admitted unit is in Postgres exactly once, and so is every request
// admitted, refused, refused by a shadow policy or degraded.
func TestFlushIsExactlyOnceThroughACrashAtEachStep(t *testing.T) {
	t.Parallel()
	for _, step := range []string{"claimed", "committed", "finished"} {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			r := mustRig(t, nil)
			ids := r.tenants(t, 20, "pro")
			want := r.admitPoliced(t, ids, 300, 1)
			crash := r.reconciler()
			crash.hook = func(s string) error {
				if s == step {
					return errors.New("crash at " + s)
				}
				return nil
			}
			err := crash.Flush(context.Background())
			if step == "finished" && err == nil {
				// The recorded batches are dropped by their tenants' next
				// claims, which take the usage counted since: in the next
				// cycle.
				addCounts(want, r.admitPoliced(t, ids, 100, 3))
				err = crash.Flush(context.Background())
			}
			if err == nil {
				t.Fatal("the crashing flush returned no error")
			}
			// More traffic arrives while the batch is in flight.
			addCounts(want, r.admitPoliced(t, ids, 100, 2))
			for range 2 { // a restarted worker, twice
				if err := r.reconciler().Flush(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			equalCounts(t, r.ledgerCounts(t), want)
			left, _ := r.rl.SweepTenants(context.Background())
			if len(left) != 0 {
				t.Fatalf("%d tenants still have usage in Redis after the flush", len(left))
			}
		})
	}
}

// TestTwoWorkersFlushingAtOnceUnderLoad runs two reconcilers in a loop while
// admissions flow.
func TestTwoWorkersFlushingAtOnceUnderLoad(t *testing.T) {
	t.Parallel()
	r := mustRig(t, nil)
	ids := r.tenants(t, 30, "pro")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var flushes atomic.Int64
	for range 2 {
		rc := r.reconciler()
		rc.SweepEvery = 50 * time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := rc.Flush(ctx); err != nil && ctx.Err() == nil {
					t.Errorf("flush: %v", err)
				}
				flushes.Add(1)
			}
		}()
	}
	want := map[string]int64{}
	// at least 10 rounds of load, and on until both workers have flushed
	// several times meanwhile (bounded: a slow machine gets more rounds,
	// not a failure)
	for i := 0; i < 10 || (flushes.Load() < 4 && i < 400); i++ {
		for id, u := range r.admit(t, ids, 100, uint64(10+i)) {
			want[id] += u
		}
	}
	cancel()
	wg.Wait()
	if err := r.reconciler().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	equalUnits(t, r.ledger(t), want)
	if flushes.Load() < 4 {
		t.Fatalf("only %d flushes ran concurrently with the load", flushes.Load())
	}
}

// TestSweepFindsTenantsNoNodeReported covers an API node that died before
// reporting its tenants.
func TestSweepFindsTenantsNoNodeReported(t *testing.T) {
	t.Parallel()
	r := mustRig(t, nil)
	ids := r.tenants(t, 3, "pro")
	want := r.admit(t, ids, 30, 3)
	if err := r.rdb.Del(context.Background(), r.prefix+":v1:active").Err(); err != nil {
		t.Fatal(err)
	}
	rc := r.reconciler()
	rc.lastSweep = time.Now() // not due: the active set alone finds nothing
	if err := rc.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := r.ledger(t); len(got) != 0 {
		t.Fatalf("flushed %v without the sweep", got)
	}
	rc.lastSweep = time.Time{}
	if err := rc.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	equalUnits(t, r.ledger(t), want)
}

// TestRepairRestoresQuotasAfterRedisLosesItsData flushes a Redis of the
// test's own mid-month: the next cycle restores the remaining quota from the
// ledger, no free reset.
func TestRepairRestoresQuotasAfterRedisLosesItsData(t *testing.T) {
	t.Parallel()
	proc := testenv.StartRedis(t)
	opts, _ := redisdb.ParseURL(proc.URL)
	rdb, err := redisdb.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	r := mustRig(t, rdb)
	ids := r.tenants(t, 2, "pro")
	limits := quota.Limits{DailyQuota: quota.Ptr(int64(1000)), MonthlyQuota: quota.Ptr(int64(5000))}
	ctx := context.Background()
	admit := func(id string, cost int64) {
		if _, err := r.rl.Admit(ctx, quota.Request{TenantID: id, Meter: "demo", Cost: cost, Limits: limits}); err != nil {
			t.Fatal(err)
		}
	}
	admit(ids[0], 300)
	admit(ids[1], 40)
	rc := r.reconciler()
	if err := rc.Repair(ctx); err != nil { // first start: nothing to restore
		t.Fatal(err)
	}
	if err := r.rl.ReportActive(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rc.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	admit(ids[0], 25) // pending, not flushed, when Redis loses everything
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	admit(ids[0], 5) // after the loss, before the worker's next cycle
	if err := rc.Repair(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id          string
		daily, left int64
	}{
		// 300 flushed + 5 pending after the loss; the 25 pending at the loss are gone (one interval).
		{ids[0], 1000 - 305, 5000 - 305},
		{ids[1], 1000 - 40, 5000 - 40},
	} {
		d, err := r.rl.Peek(ctx, tc.id, limits, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		day, _ := d.Limit(quota.LimitDaily)
		month, _ := d.Limit(quota.LimitMonthly)
		if day.Remaining != tc.daily || month.Remaining != tc.left {
			t.Errorf("tenant %s after repair: daily %d monthly %d remaining, want %d and %d", tc.id, day.Remaining, month.Remaining, tc.daily, tc.left)
		}
	}
	// Repair is idempotent: a second loss-free cycle changes nothing.
	if err := rc.Repair(ctx); err != nil {
		t.Fatal(err)
	}
	d, _ := r.rl.Peek(ctx, ids[0], limits, time.Time{})
	if m, _ := d.Limit(quota.LimitMonthly); m.Remaining != 5000-305 {
		t.Fatalf("after a second repair: monthly remaining %d, want %d", m.Remaining, 5000-305)
	}
}

func TestCrossingsAreRecordedOncePerThreshold(t *testing.T) {
	t.Parallel()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "free")[0] // monthly quota 10,000
	ctx := context.Background()
	rc := r.reconciler()
	flushUnits := func(units int64) {
		if _, err := r.rl.Admit(ctx, quota.Request{TenantID: id, Meter: "demo", Cost: units,
			Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(1 << 40))}}); err != nil {
			t.Fatal(err)
		}
		_ = r.rl.ReportActive(ctx)
		if err := rc.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	count := func() (n80, n100 int) {
		_ = r.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE threshold = 80), count(*) FILTER (WHERE threshold = 100) FROM alerts WHERE tenant_id = $1`, id).Scan(&n80, &n100)
		return
	}
	flushUnits(7999)
	if a, b := count(); a != 0 || b != 0 {
		t.Fatalf("at 79.99 %%: alerts %d/%d, want none", a, b)
	}
	flushUnits(1)
	if a, b := count(); a != 1 || b != 0 {
		t.Fatalf("at 80 %%: alerts %d/%d, want the 80 %% one", a, b)
	}
	flushUnits(500)
	flushUnits(1600)
	if a, b := count(); a != 1 || b != 1 {
		t.Fatalf("at 101 %%: alerts %d/%d, want one of each", a, b)
	}
}

// BenchmarkReconcileCycle100k measures one flush of 100,000 active tenants,
// each with pending usage in two meters, into an empty ledger.
func BenchmarkReconcileCycle100k(b *testing.B) {
	const n = 100_000
	r := mustRig(b, nil)
	ids := r.tenants(b, n, "pro")
	ctx := context.Background()
	hour := time.Now().UTC().Truncate(time.Hour).Unix()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		// Pending usage as the admission script leaves it, written directly.
		for start := 0; start < n; start += 1000 {
			_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, id := range ids[start:min(start+1000, n)] {
					k := r.prefix + ":v1:{t:" + id + "}:pending"
					p.HSet(ctx, k, fmt.Sprintf("%d|demo|u", hour), 3, fmt.Sprintf("%d|demo|r", hour), 3,
						fmt.Sprintf("%d|report|u", hour), 10, fmt.Sprintf("%d|report|r", hour), 1)
					p.SAdd(ctx, r.prefix+":v1:active", id)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		rc := r.reconciler()
		rc.lastSweep = time.Now()
		b.StartTimer()
		if err := rc.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if got := rc.TenantsFlushed.Load(); got != n {
			b.Fatalf("flushed %d tenants, want %d", got, n)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(n)/(b.Elapsed().Seconds()/float64(b.N)), "tenants/s")
}

// TestFailedFlushSweepsAgain: tenants only the sweep finds (their API node
// never reported them) are swept again by the next cycle when the flush
// that swept them failed, not SweepEvery later.
func TestFailedFlushSweepsAgain(t *testing.T) {
	t.Parallel()
	r := mustRig(t, nil)
	ids := r.tenants(t, 5, "pro")
	want := r.admit(t, ids, 50, 3)
	ctx := context.Background()
	if err := r.rdb.Del(ctx, r.prefix+":v1:active").Err(); err != nil { // as if no node reported them
		t.Fatal(err)
	}
	rc := r.reconciler()
	rc.hook = func(s string) error {
		if s == "claimed" {
			return errors.New("Postgres went away")
		}
		return nil
	}
	if err := rc.Flush(ctx); err == nil {
		t.Fatal("the failing flush returned no error")
	}
	rc.hook = func(string) error { return nil }
	if err := rc.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	equalUnits(t, r.ledger(t), want)
}
