package billing

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/worker"
)

// sharedFlushTenants is how many active tenants, each with pending usage, one
// flush cycle of BenchmarkSharedFlush moves.
const sharedFlushTenants = 100_000

// BenchmarkSharedFlush is one worker cycle's flush of 100,000 active
// tenants, each with pending usage (one hour, one meter), split between 1, 2
// and 4 workers (worker.Shares) flushing at once against one Postgres, on
// one Redis and on a 3-master Redis Cluster; each worker moving 1 or 4
// chunks at once (Reconciler.Parallel; the worker runs 4), each worker on a
// Postgres pool of its own (4 connections, as a worker process has) and the
// Redis client shared. ns/op is the wall
// time of the cycle: from the workers' start to the last one's end; the
// CPU seconds each part spent on it are reported beside (cpuUse), which
// bound the wall time from below on a machine that runs them all. The
// seeding (pipelined) and a first cycle are outside the timer; every cycle
// checks that each tenant's batch was recorded, then vacuums the tables it
// updated, as autovacuum would (untimed; its Postgres CPU is reported as
// vacuum-cpu-s/op), so that each sub-benchmark starts as clean as the
// first whether or not the server runs autovacuum.
func BenchmarkSharedFlush(b *testing.B) {
	ctx := context.Background()
	db := testenv.Postgres(b)
	r := &rig{db: db}
	ids := r.tenants(b, sharedFlushTenants, "pro")
	// Statistics, as a database in service has them (else the planner
	// scans the tenants for every chunk).
	if _, err := db.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	for _, redisName := range []string{"redis", "cluster"} {
		b.Run(redisName, func(b *testing.B) {
			var rdb redis.UniversalClient
			if redisName == "cluster" {
				rdb = testenv.Cluster(b)
			} else {
				rdb = testenv.Redis(b)
			}
			prefix := testenv.Prefix(b, rdb)
			rl := quotaredis.New(rdb, prefix)
			if err := rl.LoadFunctions(ctx, quiet); err != nil {
				b.Fatal(err)
			}
			for _, workers := range []int{1, 2, 4} {
				for _, par := range []int{1, 4} {
					b.Run(fmt.Sprintf("workers=%d/parallel=%d", workers, par), func(b *testing.B) {
						benchFlush(b, r, rl, rdb, prefix, ids, workers, par)
					})
				}
			}
		})
	}
}

// benchFlush times one cycle's flush of ids by workers workers, each with
// Shares of its own and par chunks at once.
func benchFlush(b *testing.B, r *rig, rl *quotaredis.Store, rdb redis.UniversalClient, prefix string, ids []string, workers, par int) {
	ctx := context.Background()
	recs := make([]*Reconciler, workers)
	shares := make([]*worker.Shares, workers)
	for i := range workers {
		// A pool of each worker's own, as each worker process has.
		db, err := pgxpool.NewWithConfig(ctx, r.db.Config())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(db.Close)
		shares[i] = worker.NewShares(db, quiet)
		b.Cleanup(shares[i].Close)
		recs[i] = NewReconciler(db, rl, time.Now, quiet)
		recs[i].Share, recs[i].Parallel = shares[i], par
		recs[i].lastSweep = time.Now() // the active set alone, as in most cycles
	}
	for range 2 { // one cycle to give back, one to take
		for _, sh := range shares {
			if err := sh.Sync(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i, sh := range shares {
		if sh.Leads() { // marks Redis intact: the others flush only then
			if err := recs[i].Repair(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Cleanup(func() { // the batches recorded last, not left to the next sub-benchmark
		for _, rec := range recs {
			if err := rec.Close(ctx); err != nil {
				b.Error(err)
			}
		}
	})
	// cycle flushes every tenant's new pending usage with every worker
	// at once and checks that each tenant's batch was recorded; it returns
	// the CPU the parts spent, and adds what the vacuum after it spent to
	// vacuum.
	var vacuum float64
	cycle := func() cpuUse {
		b.StopTimer()
		seedPending(b, rdb, prefix, ids)
		began := time.Now()
		cpu0 := cpuNow(b, rdb)
		b.StartTimer()
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for i, rec := range recs {
			wg.Go(func() { errs[i] = rec.Flush(ctx) })
		}
		wg.Wait()
		b.StopTimer()
		spent := cpuNow(b, rdb).since(cpu0)
		for i, err := range errs {
			if err != nil {
				b.Fatalf("worker %d: %v", i, err)
			}
		}
		var recorded int64
		if err := r.db.QueryRow(ctx, `SELECT count(*) FROM usage_flushed WHERE flushed_at >= $1`, began).Scan(&recorded); err != nil {
			b.Fatal(err)
		}
		if recorded != int64(len(ids)) {
			b.Fatalf("%d batches recorded by the cycle, want one per tenant (%d)", recorded, len(ids))
		}
		for _, rec := range recs {
			_ = rec.TakeFlushed()
		}
		// Vacuum what the cycle updated, as autovacuum would between
		// cycles (every tenant's rows were updated), so that no row is
		// timed on the dead rows of those before it; its Postgres CPU is
		// reported apart.
		vac0 := cpuNow(b, rdb)
		if _, err := r.db.Exec(ctx, `VACUUM usage_flushed, usage_month_totals, usage`); err != nil {
			b.Fatal(err)
		}
		vacuum += cpuNow(b, rdb).since(vac0).postgres
		b.StartTimer()
		return spent
	}
	// One cycle untimed first: each timed one is a cycle in service, each
	// tenant's claim dropping the batch the cycle before recorded (the
	// first flush of a month also inserts each tenant's rows: that of
	// the first sub-benchmark's warm-up).
	cycle()
	b.ResetTimer()
	vacuum = 0
	var cpu cpuUse
	for b.Loop() {
		spent := cycle()
		cpu.workers, cpu.redis, cpu.postgres, cpu.local = cpu.workers+spent.workers, cpu.redis+spent.redis,
			cpu.postgres+spent.postgres, spent.local
	}
	b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tenants/s")
	cpu.report(b)
	if cpu.local {
		b.ReportMetric(vacuum/float64(b.N), "vacuum-cpu-s/op")
	}
}

// seedPending gives every tenant pending usage (3 units, 1 request in the
// current hour) and reports them active, pipelined.
func seedPending(b *testing.B, rdb redis.UniversalClient, prefix string, ids []string) {
	b.Helper()
	ctx := context.Background()
	hour := strconv.FormatInt(time.Now().Truncate(time.Hour).Unix(), 10)
	for start := 0; start < len(ids); start += 1000 {
		part := ids[start:min(start+1000, len(ids))]
		members := make([]any, len(part))
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range part {
				p.HSet(ctx, prefix+":v1:{t:"+id+"}:pending", hour+"|demo|u", 3, hour+"|demo|r", 1)
				members[i] = id
			}
			p.SAdd(ctx, prefix+":v1:active", members...)
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// monthCloseTenants is how many tenants BenchmarkSharedMonthClose closes a
// month for.
const monthCloseTenants = 20_000

// BenchmarkSharedMonthClose is the closing of a month of 20,000 tenants
// (each invoice created and finalized) split between 1, 2 and 4 workers at
// once, each owning the tenants of its share of the shards (as
// worker.Shares splits them) and each on a Postgres pool of its own. ns/op
// is the wall time from the workers' start to the last one's end; the CPU
// seconds each part spent are reported beside (cpuUse), and the most
// invoices one worker generated as max-worker-invoices/op. Before each
// close, untimed, the month's invoices are deleted.
func BenchmarkSharedMonthClose(b *testing.B) {
	ctx := context.Background()
	db := testenv.Postgres(b)
	r := &rig{db: db}
	ids := r.tenants(b, monthCloseTenants, "pro")
	if _, err := db.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	month := quota.MonthStart(time.Now())
	now := func() time.Time { return month.AddDate(0, 1, 0).Add(2 * time.Hour) } // past its end and the grace
	for _, workers := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			pools := make([]*pgxpool.Pool, workers)
			for i := range pools {
				pool, err := pgxpool.NewWithConfig(ctx, db.Config())
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(pool.Close)
				pools[i] = pool
			}
			var most int
			var cpu cpuUse
			for b.Loop() {
				b.StopTimer()
				if _, err := db.Exec(ctx, `DELETE FROM invoices WHERE period = $1`, month); err != nil {
					b.Fatal(err)
				}
				if _, err := db.Exec(ctx, `VACUUM ANALYZE invoices`); err != nil {
					b.Fatal(err)
				}
				invs := make([]*Invoicer, workers)
				for i := range invs {
					inv := NewInvoicer(pools[i], now, time.Hour)
					inv.TenantsPerRun = len(ids) // the whole month in one Run
					inv.Owns = func(id string) bool { return worker.ShardOf(id)%workers == i }
					inv.FullSweepEvery, inv.sweepStarted = time.Hour, now() // no sweep of the next month's drafts
					invs[i] = inv
				}
				cpu0 := cpuNow(b, nil)
				b.StartTimer()
				var wg sync.WaitGroup
				errs := make([]error, workers)
				for i, inv := range invs {
					wg.Go(func() { errs[i] = inv.Run(ctx) })
				}
				wg.Wait()
				b.StopTimer()
				spent := cpuNow(b, nil).since(cpu0)
				for i, err := range errs {
					if err != nil {
						b.Fatalf("worker %d: %v", i, err)
					}
				}
				var final int
				if err := db.QueryRow(ctx, `SELECT count(*) FROM invoices WHERE period = $1 AND status = 'final'`, month).Scan(&final); err != nil {
					b.Fatal(err)
				}
				if final != len(ids) {
					b.Fatalf("%d invoices final, want one per tenant (%d)", final, len(ids))
				}
				for i := range invs {
					n := 0
					for _, id := range ids {
						if invs[i].Owns(id) {
							n++
						}
					}
					most = max(most, n)
				}
				cpu.workers, cpu.postgres, cpu.local = cpu.workers+spent.workers, cpu.postgres+spent.postgres, spent.local
				b.StartTimer()
			}
			b.ReportMetric(cpu.workers/float64(b.N), "worker-cpu-s/op")
			if cpu.local {
				b.ReportMetric(cpu.postgres/float64(b.N), "postgres-cpu-s/op")
			}
			b.ReportMetric(float64(most), "max-worker-invoices/op")
			b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "invoices/s")
		})
	}
}
