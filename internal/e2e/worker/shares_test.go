package worker

import (
	"context"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/worker"
)

// shardHolders returns, per backend pid, how many shard locks it holds in
// the database of db.
func shardHolders(t *testing.T, db *pgxpool.Pool) map[int32]int {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT pid, count(*)::int FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND classid = $1::int8::oid AND objsubid = 2
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		GROUP BY pid`, int64(0x746c6702))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int{}
	for rows.Next() {
		var pid int32
		var n int
		if err := rows.Scan(&pid, &n); err != nil {
			t.Fatal(err)
		}
		out[pid] = n
	}
	return out
}

// waitFor polls cond every 20 ms, at most 1500 times; false if it never held.
func waitFor(cond func() bool) bool {
	for range 1500 {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// TestTwoWorkerProcessesSplitAndHandOver runs two real worker processes
// while admissions flow: they split the 64 shards (32 each); one is killed
// with SIGKILL, and the other takes all 64 and flushes the dead one's
// tenants too. Postgres ends up with exactly the units admitted, flushed by
// the workers alone.
func TestTwoWorkerProcessesSplitAndHandOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, db, rdb, prefix := stores(t)
	store := catalogdb.NewStore(db)
	var ids []string
	shardsHit := map[int]bool{}
	for range 40 {
		tn, err := store.CreateTenant(ctx, "test", "tenant", "pro")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tn.ID)
		shardsHit[worker.ShardOf(tn.ID)] = true
	}
	rl := quotaredis.New(rdb, prefix)

	admitted := map[string]int64{}
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		rnd := rand.New(rand.NewPCG(3, 3))
		last := time.Now()
		for n := 0; n < 500_000; n++ { // bounded
			select {
			case <-stop:
				_ = rl.ReportActive(ctx)
				return
			default:
			}
			id, cost := ids[rnd.IntN(len(ids))], int64(1+rnd.IntN(5))
			d, err := rl.Admit(ctx, quota.Request{TenantID: id, Meter: "demo", Cost: cost,
				Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(1 << 40))}})
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				mu.Lock()
				admitted[id] += cost
				mu.Unlock()
			}
			if time.Since(last) > 50*time.Millisecond {
				_ = rl.ReportActive(ctx)
				last = time.Now()
			}
		}
	})
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	env := append(os.Environ(), "TOLLGATE_TEST_RUN_WORKER=1", "DATABASE_URL="+dbURL, "REDIS_URL="+testenv.RedisURL(t),
		"TOLLGATE_REDIS_PREFIX="+prefix, "TOLLGATE_RECONCILE_INTERVAL="+interval, "TOLLGATE_WORKER_METRICS_ADDR=127.0.0.1:0",
		"TOLLGATE_LOG_LEVEL=error")
	var procs []*exec.Cmd
	for range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	}

	split := waitFor(func() bool {
		h := shardHolders(t, db)
		if len(h) != 2 {
			return false
		}
		for _, n := range h {
			if n != worker.Shards/2 {
				return false
			}
		}
		return true
	})
	if !split {
		t.Fatalf("two workers never split the shards 32/32 within 30 s: %v", shardHolders(t, db))
	}
	time.Sleep(300 * time.Millisecond) // both flush for a few cycles under load
	if err := procs[0].Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = procs[0].Wait()
	handed := waitFor(func() bool {
		h := shardHolders(t, db)
		return len(h) == 1 && h[firstKey(h)] == worker.Shards
	})
	if !handed {
		t.Fatalf("the surviving worker never held all 64 shards within 30 s: %v", shardHolders(t, db))
	}
	time.Sleep(200 * time.Millisecond) // the survivor flushes under load alone
	close(stop)
	wg.Wait()

	ledger := func() map[string]int64 {
		out := map[string]int64{}
		rows, err := db.Query(ctx, `SELECT tenant_id::text, sum(units)::bigint FROM usage GROUP BY tenant_id`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			var u int64
			_ = rows.Scan(&id, &u)
			out[id] = u
		}
		return out
	}
	equal := func(got map[string]int64) bool {
		for _, id := range ids {
			if got[id] != admitted[id] {
				return false
			}
		}
		return true
	}
	if !waitFor(func() bool { return equal(ledger()) }) {
		got := ledger()
		for _, id := range ids {
			if got[id] != admitted[id] {
				t.Errorf("tenant %s (shard %d): %d units in Postgres, want the %d admitted", id, worker.ShardOf(id), got[id], admitted[id])
			}
		}
		return
	}
	t.Logf("40 tenants over %d shards; the survivor holds all 64 and the ledger equals the usage admitted", len(shardsHit))
}

func firstKey(m map[int32]int) int32 {
	for k := range m {
		return k
	}
	return 0
}
