package billing

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// errCrash stops a flush at a hook's step, as a crash would.
var errCrash = errors.New("crash")

// crashAfter returns a hook that stops the flush once it reaches step.
func crashAfter(step string) func(string) error {
	return func(s string) error {
		if s == step {
			return errCrash
		}
		return nil
	}
}

// flushedRow returns the tenant's row of usage_flushed.
func (r *rig) flushedRow(tb testing.TB, tenantID string) (seq int64, batchID string) {
	tb.Helper()
	if err := r.db.QueryRow(context.Background(), `SELECT seq, batch_id FROM usage_flushed WHERE tenant_id = $1`, tenantID).
		Scan(&seq, &batchID); err != nil {
		tb.Fatal(err)
	}
	return seq, batchID
}

// TestFlushRemembersOneRowPerTenant: many flushes of a tenant leave one row
// of usage_flushed, whose sequence grows with each batch, and no batch id in
// usage_batches; a flush that crashed after its commit is replayed by the
// next one, which counts it once.
func TestFlushRemembersOneRowPerTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "pro")[0]
	rc := r.reconciler()
	var last int64
	for i := range 5 {
		r.admitUnits(t, id, 3)
		mustFlush(t, rc)
		seq, _ := r.flushedRow(t, id)
		if seq <= last {
			t.Fatalf("flush %d: sequence %d, not above the last one's %d", i, seq, last)
		}
		last = seq
	}
	r.admitUnits(t, id, 4)
	rc.hook = crashAfter("committed")
	if err := rc.Flush(ctx); !errors.Is(err, errCrash) {
		t.Fatalf("flush: %v, want the crash after the commit", err)
	}
	rc.hook = func(string) error { return nil }
	if err := r.rl.ReportActive(ctx); err != nil {
		t.Fatal(err)
	}
	mustFlush(t, rc) // the same batch again, then nothing new
	if got := r.ledger(t)[id]; got != 19 {
		t.Fatalf("ledger after a replayed batch: %d units, want 19", got)
	}
	var rows, ids int
	if err := r.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_flushed), (SELECT count(*) FROM usage_batches)`).Scan(&rows, &ids); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || ids != 0 {
		t.Fatalf("after 6 batches: %d rows of usage_flushed and %d batch ids, want 1 and none", rows, ids)
	}
}

// TestBatchOfAnEarlierReleaseIsRecordedOnceByItsID: a batch in flight
// without a sequence (claimed by a release before sequences) is recorded by
// its id in usage_batches, once, however often it is replayed.
func TestBatchOfAnEarlierReleaseIsRecordedOnceByItsID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "pro")[0]
	hour := strconv.FormatInt(time.Now().Truncate(time.Hour).Unix(), 10)
	flushing := r.prefix + ":v1:{t:" + id + "}:flushing"
	legacy := func() {
		t.Helper()
		if err := r.rdb.HSet(ctx, flushing, "batch", "0123456789abcdef0000000000000001", hour+"|demo|u", 7, hour+"|demo|r", 2).Err(); err != nil {
			t.Fatal(err)
		}
		if err := r.rdb.SAdd(ctx, r.prefix+":v1:active", id).Err(); err != nil {
			t.Fatal(err)
		}
	}
	rc := r.reconciler()
	for range 2 { // recorded, then the same batch in flight again
		legacy()
		mustFlush(t, rc)
		if got := r.ledger(t)[id]; got != 7 {
			t.Fatalf("ledger: %d units, want 7 (the batch once)", got)
		}
	}
	var ids int
	if err := r.db.QueryRow(ctx, `SELECT count(*) FROM usage_batches WHERE batch_id = '0123456789abcdef0000000000000001'`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if ids != 1 {
		t.Fatalf("%d rows of the batch's id in usage_batches, want 1", ids)
	}
	if n, err := r.rdb.Exists(ctx, flushing).Result(); err != nil || n != 0 {
		t.Fatalf("the batch is still in flight (%d, %v)", n, err)
	}
}

// TestStaleClaimIsNotRecordedAgain: a worker that claimed a batch, then
// stalled while another worker recorded that batch and the next, records
// nothing when it comes back.
func TestStaleClaimIsNotRecordedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "pro")[0]
	r.admitUnits(t, id, 5)
	stale, err := r.rl.Claim(ctx, []string{id}, nil)
	if err != nil || len(stale) != 1 || stale[0].Seq == 0 {
		t.Fatalf("claim: %+v, %v; want one batch with a sequence", stale, err)
	}
	other := r.reconciler()
	mustFlush(t, other) // records the claimed batch and drops it from Redis
	r.admitUnits(t, id, 6)
	mustFlush(t, other) // the next batch
	if got := r.ledger(t)[id]; got != 11 {
		t.Fatalf("ledger: %d, want 11", got)
	}
	if err := r.reconciler().recordTx(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if got := r.ledger(t)[id]; got != 11 {
		t.Fatalf("ledger after the stale claim was recorded: %d, want 11 (nothing more)", got)
	}
}

// TestBatchBelowTheLedgersSequenceIsRescued: after Redis' clock went back,
// a new batch's sequence can be below the last the ledger recorded of its
// tenant, and not among its recent ones. It is still in flight, so it is
// recorded, and once only: its replay after a crash adds nothing.
func TestBatchBelowTheLedgersSequenceIsRescued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "pro")[0]
	invExec(t, r.db, `INSERT INTO usage_flushed (tenant_id, seq, batch_id, flushed_at) VALUES ($1, $2, 'from-before', now())`,
		id, int64(1)<<60)
	r.admitUnits(t, id, 8)
	rc := r.reconciler()
	rc.hook = crashAfter("committed")
	if err := rc.Flush(ctx); !errors.Is(err, errCrash) {
		t.Fatalf("flush: %v, want the crash after the commit", err)
	}
	if got := r.ledger(t)[id]; got != 8 {
		t.Fatalf("ledger: %d units, want the batch's 8", got)
	}
	rc.hook = func(string) error { return nil }
	if err := r.rl.ReportActive(ctx); err != nil {
		t.Fatal(err)
	}
	mustFlush(t, rc)
	if got := r.ledger(t)[id]; got != 8 {
		t.Fatalf("ledger after the replay: %d units, want 8", got)
	}
	if n := rc.RescuedBatches.Load(); n != 1 {
		t.Fatalf("%d batches counted as rescued, want 1", n)
	}
	seq, batch := r.flushedRow(t, id)
	if seq != int64(1)<<60 || batch == "from-before" {
		t.Fatalf("usage_flushed: sequence %d, batch %q; want the greater sequence kept and the rescued batch's id", seq, batch)
	}
	if _, err := r.rl.Claim(ctx, []string{id}, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := r.rdb.Exists(ctx, r.prefix+":v1:{t:"+id+"}:flushing").Result(); err != nil || n != 0 {
		t.Fatalf("a batch is in flight after the replay (%d, %v)", n, err)
	}
}

// TestBatchInFlightAgainAfterRedisWentBackIsNotRecordedTwice: Redis goes
// back to data from before a recorded batch was dropped (a restart from its
// files, a failover to a replica behind): the batch is in flight again
// after a later one was recorded. Its sequence is among its tenant's
// recent ones, so it is dropped, not recorded twice.
func TestBatchInFlightAgainAfterRedisWentBackIsNotRecordedTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "pro")[0]
	flushing := r.prefix + ":v1:{t:" + id + "}:flushing"
	var saved map[string]string
	rc := r.reconciler()
	rc.hook = func(step string) error {
		if step == "claimed" && saved == nil {
			var err error
			saved, err = r.rdb.HGetAll(ctx, flushing).Result()
			return err
		}
		return nil
	}
	r.admitUnits(t, id, 5)
	mustFlush(t, rc)
	r.admitUnits(t, id, 6)
	mustFlush(t, rc)
	if len(saved) == 0 || saved["seq"] == "" {
		t.Fatalf("the first batch as claimed: %v", saved)
	}
	if err := r.rdb.HSet(ctx, flushing, saved).Err(); err != nil { // Redis went back
		t.Fatal(err)
	}
	if err := r.rdb.SAdd(ctx, r.prefix+":v1:active", id).Err(); err != nil {
		t.Fatal(err)
	}
	mustFlush(t, rc)
	if got := r.ledger(t)[id]; got != 11 {
		t.Fatalf("ledger: %d units, want 11 (the first batch once)", got)
	}
	if n, err := r.rdb.Exists(ctx, flushing).Result(); err != nil || n != 0 {
		t.Fatalf("the old batch is still in flight (%d, %v)", n, err)
	}
}

// TestQuotaCheckIgnoresTheSessionTimeZone: the check of monthly quotas finds
// the month's sums whatever the session's TimeZone (the months are UTC).
func TestQuotaCheckIgnoresTheSessionTimeZone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "pro")[0]
	var q int64
	if err := r.db.QueryRow(ctx, `SELECT monthly_quota FROM tiers WHERE slug = 'pro'`).Scan(&q); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	invExec(t, r.db, `INSERT INTO usage (tenant_id, hour, meter, units, requests) VALUES ($1, $2, 'demo', $3, 1)`,
		id, now.Truncate(time.Hour), q)
	rc := NewReconciler(r.db, nil, func() time.Time { return now }, quiet)
	err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL TimeZone = 'Pacific/Kiritimati'`); err != nil { // UTC+14
			return err
		}
		return rc.recordCrossings(ctx, tx, []string{id})
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := r.db.QueryRow(ctx, `SELECT count(*) FROM alerts WHERE tenant_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d alerts for a month at 100 %% of its quota, want 2 (80 %% and 100 %%)", n)
	}
}

// fcallCounter counts the Redis functions a client calls, by name, also in
// pipelines, and the keys they were called with.
type fcallCounter struct {
	mu    sync.Mutex
	calls map[string]int
	keys  map[string]int
}

func (h *fcallCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *fcallCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}
func (h *fcallCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}
func (h *fcallCounter) count(cmd redis.Cmder) {
	args := cmd.Args()
	if name := strings.ToLower(cmd.Name()); (name != "fcall" && name != "fcall_ro") || len(args) < 2 {
		return
	}
	fn, _ := args[1].(string)
	name := fn[strings.LastIndex(fn, "_")+1:]
	numKeys, _ := strconv.Atoi(fmt.Sprint(args[2]))
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls[name]++
	h.keys[name] += numKeys
}

// take returns the calls and keys counted since the last take.
func (h *fcallCounter) take() (calls, keys map[string]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	calls, keys = h.calls, h.keys
	h.calls, h.keys = map[string]int{}, map[string]int{}
	return calls, keys
}

// TestBusyCycleClaimsTenantsInFewCalls: a cycle that flushes tenants whose
// last batch was recorded in the cycle before calls one Redis function:
// the claim, once for up to 64 tenants, which drops each tenant's batch
// and takes the usage pending since. A cycle with nothing new drops the
// batches the same way and leaves no tenant active and nothing in flight.
func TestBusyCycleClaimsTenantsInFewCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	calls := &fcallCounter{calls: map[string]int{}, keys: map[string]int{}}
	rdb.AddHook(calls)
	r := mustRig(t, rdb)
	ids := r.tenants(t, 100, "pro")
	rc := r.reconciler()
	rc.SweepEvery = time.Hour
	rc.lastSweep = time.Now() // the active set alone
	want := map[string]int64{}
	for cycle := range 3 {
		if cycle < 2 {
			for _, id := range ids {
				if _, err := r.rl.Admit(ctx, quota.Request{TenantID: id, Meter: "demo", Cost: 3}); err != nil {
					t.Fatal(err)
				}
				want[id] += 3
			}
			if err := r.rl.ReportActive(ctx); err != nil {
				t.Fatal(err)
			}
		}
		calls.take()
		if err := rc.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		got, keys := calls.take()
		// (three keys a tenant: its pending, flushing and state hashes)
		if cycle > 0 && (got["claim"] != 2 || keys["claim"] != 3*len(ids) || len(got) != 1) {
			t.Errorf("cycle %d: Redis functions called %v with keys %v, want only claim, twice (64 tenants, then 36), each of the %d tenants once",
				cycle+1, got, keys, len(ids))
		}
	}
	r.ledgerEquals(t, ids, want)
	if left, err := r.rl.ActiveTenants(ctx); err != nil || len(left) != 0 {
		t.Errorf("%d tenants active after a cycle with nothing new (%v)", len(left), err)
	}
	if left, err := r.rl.SweepTenants(ctx); err != nil || len(left) != 0 {
		t.Errorf("%d tenants with usage in Redis after a cycle with nothing new (%v)", len(left), err)
	}
}

// TestClockBackIsNotOlderData: Redis' clock went back, its data intact:
// the batches claimed next have sequences below the ledger's greatest,
// each following the one recorded last. They are rescued, one after
// another, and none is taken for older data.
func TestClockBackIsNotOlderData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "pro")[0]
	ahead := int64(1) << 60 // the last batch, claimed while the clock was far ahead
	invExec(t, r.db, `INSERT INTO usage_flushed (tenant_id, seq, batch_id, recent, prev, prev_of, flushed_at)
		VALUES ($1, $2, 'from-ahead', ARRAY[$2::bigint], 0, $2, now())`, id, ahead)
	r.admitUnits(t, id, 1)
	if err := r.rdb.HSet(ctx, r.prefix+":v2:{t:"+id+"}", "lc", ahead).Err(); err != nil {
		t.Fatal(err)
	}
	rc := r.reconciler()
	var want int64 = 1
	mustFlush(t, rc)
	for _, n := range []int64{2, 3} {
		r.admitUnits(t, id, n)
		want += n
		mustFlush(t, rc)
	}
	if got := r.ledger(t)[id]; got != want {
		t.Fatalf("ledger: %d, want %d (every batch recorded)", got, want)
	}
	if n, m := rc.RescuedBatches.Load(), rc.OlderDataBatches.Load(); n != 3 || m != 0 {
		t.Fatalf("%d batches rescued and %d taken for older data, want 3 and 0", n, m)
	}
}

// TestBatchAfterAnEarlierReleasesRecordIsRecorded: during a rolling
// upgrade a worker of a release that does not mark claims in the state
// hash claims a batch of the tenant, which this release records, or which
// that release records itself; the next batch this release claims follows
// an older one, as far as Redis knows, and is recorded all the same.
func TestBatchAfterAnEarlierReleasesRecordIsRecorded(t *testing.T) {
	t.Parallel()
	for name, record := range map[string]string{
		// (as this release records a batch that release claimed: unmarked)
		"recorded by this release": `UPDATE usage_flushed SET seq = $2, batch_id = 'earlier-release',
			recent = (ARRAY[$2::bigint] || recent)[1:16], prev = NULL, prev_of = $2 WHERE tenant_id = $1`,
		// (as that release records it: sequence, batch, recent)
		"recorded by that release": `UPDATE usage_flushed SET seq = $2, batch_id = 'earlier-release',
			recent = (ARRAY[$2::bigint] || recent)[1:16] WHERE tenant_id = $1`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := mustRig(t, nil)
			id := r.tenants(t, 1, "pro")[0]
			rc := r.reconciler()
			r.admitUnits(t, id, 5)
			mustFlush(t, rc)
			seq, _ := r.flushedRow(t, id)
			invExec(t, r.db, record, id, seq+1)
			r.admitUnits(t, id, 6)
			mustFlush(t, rc)
			if got := r.ledger(t)[id]; got != 11 {
				t.Fatalf("ledger: %d, want 11 (the batch after the earlier release's recorded)", got)
			}
			if n := rc.OlderDataBatches.Load(); n != 0 {
				t.Fatalf("%d batches taken for older data, want none", n)
			}
		})
	}
}
