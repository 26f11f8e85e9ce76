package worker

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/app"
	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestMain lets a test run this binary as the real worker process.
func TestMain(m *testing.M) {
	if os.Getenv("TOLLGATE_TEST_RUN_WORKER") == "1" {
		os.Exit(app.Main("worker", app.RunWorker))
	}
	os.Exit(m.Run())
}

// TestKill9UnderLoadLosesAndDoublesNothing kills real worker processes with
// SIGKILL at random moments while admissions flow, then lets a last worker
// finish: Postgres holds exactly the units admitted.
func TestKill9UnderLoadLosesAndDoublesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, db, rdb, prefix := stores(t)
	store := catalogdb.NewStore(db)
	var ids []string
	for range 10 {
		tn, err := store.CreateTenant(ctx, "test", "tenant", "pro")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tn.ID)
	}
	rl := quotaredis.New(rdb, prefix)

	// The load: admissions as API nodes make them, reported each 50 ms.
	admitted := map[string]int64{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rnd := rand.New(rand.NewPCG(7, 7))
		last := time.Now()
		for n := 0; n < 500_000; n++ { // bounded
			select {
			case <-stop:
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
				admitted[id] += cost
			}
			if time.Since(last) > 50*time.Millisecond {
				_ = rl.ReportActive(ctx)
				last = time.Now()
			}
		}
	}()

	env := append(os.Environ(), "TOLLGATE_TEST_RUN_WORKER=1", "DATABASE_URL="+dbURL, "REDIS_URL="+testenv.RedisURL(t),
		"TOLLGATE_REDIS_PREFIX="+prefix, "TOLLGATE_RECONCILE_INTERVAL="+interval, "TOLLGATE_WORKER_METRICS_ADDR=127.0.0.1:0",
		"TOLLGATE_LOG_LEVEL=error")
	rnd := rand.New(rand.NewPCG(1, 2))
	kills := 0
	for range 8 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		started := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill it at a random moment once it is flushing: every kill lands
		// mid-work, however slowly the machine starts the process.
		for deadline := time.Now().Add(30 * time.Second); ; {
			var n int64
			_ = db.QueryRow(ctx, `SELECT count(*) FROM usage_flushed WHERE flushed_at >= $1`, started).Scan(&n)
			if n > 0 {
				break
			}
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				t.Fatal("a worker flushed nothing within 30 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(time.Duration(rnd.IntN(300)) * time.Millisecond)
		if err := cmd.Process.Kill(); err != nil { // SIGKILL
			t.Fatal(err)
		}
		_ = cmd.Wait()
		kills++
	}
	close(stop)
	wg.Wait()
	_ = rl.ReportActive(ctx)

	var flushedBefore int64
	_ = db.QueryRow(ctx, `SELECT coalesce(sum(units), 0)::bigint FROM usage`).Scan(&flushedBefore)
	if flushedBefore == 0 {
		t.Fatal("the killed workers flushed nothing; the test did not exercise them")
	}
	// A last worker finishes whatever the killed ones left in flight.
	rec := billing.NewReconciler(db, rl, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var total, want int64
	for id, u := range admitted {
		want += u
		var got int64
		_ = db.QueryRow(ctx, `SELECT coalesce(sum(units), 0)::bigint FROM usage WHERE tenant_id = $1`, id).Scan(&got)
		if got != u {
			t.Errorf("tenant %s: %d units in Postgres, want the %d admitted", id, got, u)
		}
		total += got
	}
	t.Logf("%d workers killed with SIGKILL; %d units admitted, %d flushed by the killed workers", kills, want, flushedBefore)
	if total != want {
		t.Fatalf("Postgres holds %d units, want the %d admitted", total, want)
	}
}
