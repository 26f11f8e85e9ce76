package billing

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/worker"
)

// sharedWorkers returns n Reconcilers on the rig, each with worker.Shares of
// its own, synced until they split the shards.
func (r *rig) sharedWorkers(t *testing.T, n int) ([]*Reconciler, []*worker.Shares) {
	t.Helper()
	var recs []*Reconciler
	var shares []*worker.Shares
	for range n {
		sh := worker.NewShares(r.db, quiet)
		t.Cleanup(sh.Close)
		rec := r.reconciler()
		rec.Share = sh
		rec.Parallel = 2
		rec.lastSweep = time.Now() // the tests that sweep say so
		recs, shares = append(recs, rec), append(shares, sh)
	}
	for range 2 { // one cycle to give back, one to take
		syncShares(t, shares)
	}
	// The leader's repair marks Redis intact (a new prefix reads as lost):
	// the others flush only then.
	for i, sh := range shares {
		if sh.Leads() {
			if err := recs[i].Repair(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	return recs, shares
}

// invoicedTenants returns the tenants whose invoice of period has status.
func invoicedTenants(tb testing.TB, db *pgxpool.Pool, period time.Time, status string) map[string]bool {
	tb.Helper()
	rows, err := db.Query(context.Background(), `SELECT tenant_id::text FROM invoices WHERE period = $1 AND status = $2`, period, status)
	if err != nil {
		tb.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// leadAndOther returns, of two workers' shares, the index of the one that
// leads and of the other.
func leadAndOther(shares []*worker.Shares) (lead, other int) {
	if shares[1].Leads() {
		return 1, 0
	}
	return 0, 1
}

func syncShares(t *testing.T, shares []*worker.Shares) {
	t.Helper()
	for _, sh := range shares {
		if err := sh.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// flushAll runs one Flush of each Reconciler at once, as workers do, and
// returns the tenants each recorded.
func flushAll(t *testing.T, recs []*Reconciler) []map[string]bool {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(recs))
	for i, rec := range recs {
		wg.Go(func() { errs[i] = rec.Flush(context.Background()) })
	}
	wg.Wait()
	out := make([]map[string]bool, len(recs))
	for i, rec := range recs {
		if errs[i] != nil {
			t.Fatalf("worker %d: %v", i, errs[i])
		}
		out[i] = map[string]bool{}
		for _, id := range rec.TakeFlushed() {
			out[i][id] = true
		}
	}
	return out
}

// ledgerEquals fails unless the ledger holds exactly want units per tenant.
func (r *rig) ledgerEquals(t *testing.T, ids []string, want map[string]int64) {
	t.Helper()
	got := map[string]int64{}
	rows, err := r.db.Query(context.Background(), `SELECT tenant_id::text, sum(units)::bigint FROM usage GROUP BY tenant_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var u int64
		if err := rows.Scan(&id, &u); err != nil {
			t.Fatal(err)
		}
		got[id] = u
	}
	for _, id := range ids {
		if got[id] != want[id] {
			t.Errorf("tenant %s: %d units in the ledger, want the %d admitted", id, got[id], want[id])
		}
	}
}

// TestSharedWorkersSplitTheTenants: two, then three workers flushing at
// once each flush only their shards' tenants, between them every tenant
// with usage, none twice; the ledger holds the units admitted. A worker's
// flush skips the tenants of others' shards (they stay pending for them),
// and only the leader sweeps.
func TestSharedWorkersSplitTheTenants(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 3} {
		r := mustRig(t, nil)
		ids := r.tenants(t, 300, "pro")
		recs, shares := r.sharedWorkers(t, n)

		admitted := r.admit(t, ids, 3000, uint64(n))
		flushed := flushAll(t, recs)
		seen := map[string]int{}
		for i, f := range flushed {
			if len(f) == 0 {
				t.Errorf("%d workers: worker %d flushed nothing", n, i)
			}
			for id := range f {
				if !shares[i].Owns(id) {
					t.Errorf("%d workers: worker %d flushed tenant %s of shard %d, not its own", n, i, id, worker.ShardOf(id))
				}
				seen[id]++
			}
		}
		for id := range admitted {
			if seen[id] != 1 {
				t.Errorf("%d workers: tenant %s flushed by %d workers, want 1", n, id, seen[id])
			}
		}
		r.ledgerEquals(t, ids, admitted)
		// The recorded batches stay in flight, and their tenants active,
		// until each tenant's next claim drops them: the next cycle, with
		// no new usage, records nothing and leaves no tenant active.
		if left, err := r.rl.ActiveTenants(context.Background()); err != nil || len(left) != len(admitted) {
			t.Errorf("%d workers: %d tenants left active after every worker flushed (%v), want the %d with a recorded batch", n, len(left), err, len(admitted))
		}
		for i, f := range flushAll(t, recs) {
			if len(f) != 0 {
				t.Errorf("%d workers: worker %d recorded %d tenants again in a cycle with no new usage", n, i, len(f))
			}
		}
		if left, err := r.rl.ActiveTenants(context.Background()); err != nil || len(left) != 0 {
			t.Errorf("%d workers: %d tenants left active after a cycle with no new usage (%v)", n, len(left), err)
		}
		if left, err := r.rl.SweepTenants(context.Background()); err != nil || len(left) != 0 {
			t.Errorf("%d workers: %d tenants with usage in Redis after a cycle with no new usage (%v)", n, len(left), err)
		}
		r.ledgerEquals(t, ids, admitted)

		// Usage no API node reported (the active set is lost): only the
		// leader sweeps, and it flushes every tenant it finds.
		more := r.admit(t, ids, 500, uint64(10+n))
		for id, u := range more {
			admitted[id] += u
		}
		if err := r.rdb.Del(context.Background(), r.prefix+":v1:active").Err(); err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			rec.SweepEvery = 0
		}
		for i, f := range flushAll(t, recs) {
			switch {
			case shares[i].Leads() && len(f) != len(more):
				t.Errorf("%d workers: the leader's sweep flushed %d tenants, want the %d with usage", n, len(f), len(more))
			case !shares[i].Leads() && len(f) != 0:
				t.Errorf("%d workers: worker %d, not the leader, flushed %d tenants with no active set", n, i, len(f))
			}
		}
		r.ledgerEquals(t, ids, admitted)
	}
}

// errDied stops a flush where a worker's death would.
var errDied = errors.New("worker died")

// TestSharedWorkerKilledHandsOver: one of three workers dies after it
// recorded its tenants' batches and before it dropped them from Redis (its
// session ends, its batches stay in flight); on their next cycle the other
// two take its shards and flush its tenants, the batches in flight (recorded
// again, counted once) and the usage admitted since: the ledger holds
// exactly the units admitted.
func TestSharedWorkerKilledHandsOver(t *testing.T) {
	t.Parallel()
	r := mustRig(t, nil)
	ids := r.tenants(t, 300, "pro")
	recs, shares := r.sharedWorkers(t, 3)
	admitted := r.admit(t, ids, 3000, 11)

	// Worker 2 records its batches, then dies before finishing them.
	recs[2].hook = func(step string) error {
		if step == "committed" {
			return errDied
		}
		return nil
	}
	if err := recs[2].Flush(context.Background()); !errors.Is(err, errDied) {
		t.Fatalf("dying worker's Flush = %v, want it cut short after its commit", err)
	}
	var inFlight []string
	for _, id := range ids {
		if shares[2].Owns(id) && admitted[id] > 0 {
			inFlight = append(inFlight, id)
		}
	}
	if len(inFlight) == 0 {
		t.Fatal("the dying worker owned no tenant with usage; the test exercises nothing")
	}
	shares[2].Close()

	more := r.admit(t, ids, 1000, 12)
	for id, u := range more {
		admitted[id] += u
	}
	syncShares(t, shares[:2])
	flushed := flushAll(t, recs[:2])
	for _, id := range inFlight {
		if !flushed[0][id] && !flushed[1][id] {
			t.Errorf("tenant %s of the dead worker's shards flushed by neither survivor", id)
		}
	}
	r.ledgerEquals(t, ids, admitted)

	// A worker with no share (it flushes every tenant it finds) finds
	// nothing left to add.
	all := r.reconciler()
	all.SweepEvery = 0
	if err := all.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.ledgerEquals(t, ids, admitted)
}

// TestParallelFlushChunks: a flush moving several chunks at once records
// every tenant once; one whose chunk fails midway (a crash after a commit)
// returns that error, and the next flush completes the rest: the ledger
// holds exactly the units admitted.
func TestParallelFlushChunks(t *testing.T) {
	t.Parallel()
	r := mustRig(t, nil)
	ids := r.tenants(t, 1600, "pro")
	admitted := r.admit(t, ids, 6000, 21)
	if len(admitted) <= 3*chunk {
		t.Fatalf("%d tenants with usage, want more than three chunks", len(admitted))
	}
	rec := r.reconciler()
	rec.Parallel = 3
	rec.lastSweep = time.Now()
	var commits atomic.Int64
	rec.hook = func(step string) error {
		if step == "committed" && commits.Add(1) == 2 {
			return errDied
		}
		return nil
	}
	if err := rec.Flush(context.Background()); !errors.Is(err, errDied) {
		t.Fatalf("Flush = %v, want the error of the chunk that failed", err)
	}
	rec.hook = func(string) error { return nil }
	if err := rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.ledgerEquals(t, ids, admitted)
	// The tenants recorded by the second flush stay active until their
	// next claim drops their batches: a third, with no new usage.
	if err := rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left, err := r.rl.ActiveTenants(context.Background()); err != nil || len(left) != 0 {
		t.Errorf("%d tenants left active after a flush with no new usage (%v)", len(left), err)
	}
	if left, err := r.rl.SweepTenants(context.Background()); err != nil || len(left) != 0 {
		t.Errorf("%d tenants with usage in Redis after a flush with no new usage (%v)", len(left), err)
	}
	r.ledgerEquals(t, ids, admitted)
}

// TestSharedWorkersWaitForTheLeadersRepair: after Redis lost data, a worker
// that does not lead flushes nothing until the leader has restored the
// counters; then it flushes its share, and the ledger holds the units
// admitted.
func TestSharedWorkersWaitForTheLeadersRepair(t *testing.T) {
	t.Parallel()
	r := mustRig(t, nil)
	ids := r.tenants(t, 200, "pro")
	recs, shares := r.sharedWorkers(t, 2)
	lead, other := leadAndOther(shares)
	admitted := r.admit(t, ids, 2000, 31)
	if err := r.rdb.Del(context.Background(), r.prefix+":v1:epoch").Err(); err != nil { // the loss
		t.Fatal(err)
	}
	if err := recs[other].Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := recs[other].TakeFlushed(); len(got) != 0 {
		t.Fatalf("a worker that does not lead flushed %d tenants before the leader's repair, want none", len(got))
	}
	if err := recs[lead].Repair(context.Background()); err != nil {
		t.Fatal(err)
	}
	flushed := flushAll(t, recs)
	if len(flushed[other]) == 0 {
		t.Fatal("after the leader's repair, the other worker still flushed nothing")
	}
	r.ledgerEquals(t, ids, admitted)
}

// TestLeadersSweepLeavesOthersNothingToRecordAgain: the workers leave the
// batches they recorded in flight until their tenants' next claims. The
// leader's sweep finds those of the other worker's tenants too, and flushes
// them with the new usage; it drops what it recorded of them at once, so
// the other worker's next cycle finds nothing of them to record again, and
// a worker that loses shards drops what it recorded of them.
func TestLeadersSweepLeavesOthersNothingToRecordAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	ids := r.tenants(t, 200, "pro")
	recs, shares := r.sharedWorkers(t, 2)
	lead, other := leadAndOther(shares)
	admitted := r.admit(t, ids, 2000, 21)
	flushAll(t, recs) // each worker's tenants' batches left in flight
	more := r.admit(t, ids, 2000, 22)
	for id, u := range more {
		admitted[id] += u
	}
	recs[lead].SweepEvery = 0
	if err := recs[lead].Flush(ctx); err != nil {
		t.Fatal(err)
	}
	recs[lead].SweepEvery = time.Hour
	r.ledgerEquals(t, ids, admitted)
	inFlight := 0
	for _, id := range ids {
		n, err := r.rdb.Exists(ctx, r.prefix+":v1:{t:"+id+"}:flushing").Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 && !shares[lead].Owns(id) {
			inFlight++
		}
	}
	if inFlight != 0 {
		t.Errorf("the leader's sweep left %d batches of the other worker's tenants in flight, want none", inFlight)
	}
	before := recs[other].Batches.Load()
	flushAll(t, recs) // no new usage
	if n := recs[other].Batches.Load() - before; n != 0 {
		t.Errorf("the other worker recorded %d batches again after the leader's sweep, want none", n)
	}
	if left, err := r.rl.SweepTenants(ctx); err != nil || len(left) != 0 {
		t.Errorf("%d tenants with usage in Redis after a cycle with no new usage (%v)", len(left), err)
	}

	// A worker whose shards move drops the batches it recorded of them
	// (here: all of them, once the other worker is the only one left).
	again := r.admit(t, ids, 2000, 23)
	for id, u := range again {
		admitted[id] += u
	}
	flushAll(t, recs)
	shares[lead].Close()
	for range 2 {
		syncShares(t, shares[other:other+1])
	}
	before = recs[other].Batches.Load()
	if err := recs[lead].Flush(ctx); err != nil { // owns nothing now: only drops
		t.Fatal(err)
	}
	if err := recs[other].Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := recs[other].Batches.Load() - before; n != 0 {
		t.Errorf("the remaining worker recorded %d batches again of the tenants it took, want none: the worker that lost them drops them", n)
	}
	r.ledgerEquals(t, ids, admitted)
}

// TestWorkersSplitTheInvoiceSweep: each worker's sweep of the current
// month's drafts regenerates the tenants it owns and no other; together
// they cover every tenant. A worker that owns few tenants ends its sweep
// call after listing sweepListed × TenantsPerRun of them.
func TestWorkersSplitTheInvoiceSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	ids := r.tenants(t, 60, "pro")
	recs, shares := r.sharedWorkers(t, 2)
	owned := make([]int, 2)
	for _, id := range ids {
		for i, sh := range shares {
			if sh.Owns(id) {
				owned[i]++
			}
		}
	}
	if owned[0] == 0 || owned[1] == 0 || owned[0]+owned[1] != len(ids) {
		t.Fatalf("the workers own %v of the %d tenants, want a split of them all", owned, len(ids))
	}
	drafted := func() map[string]bool { return invoicedTenants(t, r.db, quota.MonthStart(time.Now()), "draft") }
	lead, other := leadAndOther(shares)
	cycles := make([]*Cycle, 2)
	for i := range cycles {
		inv := NewInvoicer(r.db, time.Now, time.Hour)
		inv.Owns = shares[i].Owns
		inv.FullSweepEvery = time.Hour
		cycles[i] = NewCycle(recs[i], inv)
	}
	if err := cycles[other].Invoices(ctx); err != nil {
		t.Fatal(err)
	}
	got := drafted()
	for _, id := range ids {
		if got[id] != shares[other].Owns(id) {
			t.Fatalf("after the other worker's sweep: tenant %s drafted %t, owned by it %t", id, got[id], shares[other].Owns(id))
		}
	}
	if err := cycles[lead].Invoices(ctx); err != nil {
		t.Fatal(err)
	}
	if got := drafted(); len(got) != len(ids) {
		t.Fatalf("after both workers' sweeps: %d tenants drafted, want all %d", len(got), len(ids))
	}

	// A worker that owns none of them lists 8 × 5 tenants a call.
	none := NewInvoicer(r.db, time.Now, time.Hour)
	none.TenantsPerRun = 5
	none.Owns = func(string) bool { return false }
	if err := none.Run(ctx); err != nil {
		t.Fatal(err)
	}
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	if want := sorted[sweepListed*5-1]; none.sweepAfter != want {
		t.Fatalf("a sweep call owning nothing stopped after %q, want the %dth tenant %q", none.sweepAfter, sweepListed*5, want)
	}
}

// TestWorkersSplitTheMonthClose: each worker closes the month of the
// tenants it owns, once the leader's sweep has published that the month's
// usage is all in the ledger; a worker whose share grows after it closed the
// month closes it for the tenants it took.
func TestWorkersSplitTheMonthClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	ids := r.tenants(t, 60, "pro")
	month := quota.MonthStart(time.Now())
	end := month.AddDate(0, 1, 0)
	now := func() time.Time { return end.Add(2 * time.Hour) } // past the month's end and the grace
	recs, shares := r.sharedWorkers(t, 2)
	lead, other := leadAndOther(shares)
	cycles := make([]*Cycle, 2)
	for i := range cycles {
		recs[i].now = now
		inv := NewInvoicer(r.db, now, time.Hour)
		inv.Owns, inv.Gained = shares[i].Owns, shares[i].Gained
		cycles[i] = NewCycle(recs[i], inv)
	}
	final := func() map[string]bool { return invoicedTenants(t, r.db, month, "final") }
	step := func(i int) {
		t.Helper()
		if err := cycles[i].Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := cycles[i].Invoices(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Before the leader has swept, no one knows the month's usage is all
	// in the ledger: nothing is final.
	step(other)
	if got := final(); len(got) != 0 {
		t.Fatalf("before the leader's sweep: %d invoices final, want none", len(got))
	}
	// The leader's sweep publishes how far the flush has come; the other
	// worker reads it, and closes the month of its own tenants only.
	recs[lead].lastSweep = time.Time{}
	if err := recs[lead].Flush(ctx); err != nil {
		t.Fatal(err)
	}
	step(other)
	if got := recs[other].FlushedThrough(); !got.Equal(now()) {
		t.Fatalf("the other worker's FlushedThrough %v, want the leader's sweep %v", got, now())
	}
	got := final()
	for _, id := range ids {
		if got[id] != shares[other].Owns(id) {
			t.Fatalf("after the other worker's close: tenant %s final %t, owned by it %t", id, got[id], shares[other].Owns(id))
		}
	}
	// Its month is closed: another cycle does nothing more.
	step(other)
	if n := len(final()); n != len(got) {
		t.Fatalf("a second cycle of the other worker: %d invoices final, want still %d", n, len(got))
	}
	// The leader dies before closing its tenants' month; the other takes
	// its shards, and closes the month for them too.
	shares[lead].Close()
	// (Postgres ends the dead worker's session, and so frees its locks, a
	// moment after it closed.)
	for k := 0; k < 100 && len(shares[other].Owned()) < worker.Shards; k++ {
		syncShares(t, shares[other:other+1])
		time.Sleep(10 * time.Millisecond)
	}
	if !shares[other].Leads() || len(shares[other].Owned()) != worker.Shards {
		t.Fatalf("after the leader's death the other worker holds %d shards (leads %t), want all", len(shares[other].Owned()), shares[other].Leads())
	}
	step(other)
	if got := final(); len(got) != len(ids) {
		t.Fatalf("after the other worker took the leader's shards: %d invoices final, want all %d", len(got), len(ids))
	}
}
