package worker

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/app"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// interval is the reconcile interval the tests run the worker at. It is
// also each step's budget: under -race, on a busy 2-core machine, a step's
// queries took longer than 100 ms, every step of every cycle timed out and
// the tests that wait for the worker's work saw none.
const interval = "500ms"

func TestWorkerRunsAndStopsGracefully(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"REDIS_URL":                    testenv.RedisURL(t),
		"DATABASE_URL":                 testenv.NewDatabase(t),
		"TOLLGATE_RECONCILE_INTERVAL":  interval,
		"TOLLGATE_LOG_LEVEL":           "debug",
		"TOLLGATE_WORKER_METRICS_ADDR": "127.0.0.1:0",
		"TOLLGATE_REDIS_PREFIX":        testenv.Prefix(t, testenv.Redis(t)),
	}
	// Stop the worker once it has run two cycles, however long it takes to
	// start on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	var out strings.Builder
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		cycles := 0
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), `"msg":"worker cycle"`) {
				if cycles++; cycles == 2 {
					cancel()
				}
			}
		}
	}()
	err := app.RunWorker(ctx, func(k string) string { return env[k] }, pw)
	pw.Close()
	<-scanned
	if err != nil {
		t.Fatalf("run = %v, want nil after its context ends", err)
	}
	if n := strings.Count(out.String(), `"msg":"worker cycle"`); n < 2 {
		t.Fatalf("%d cycles logged within 60 s, want ≥2:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), `"msg":"worker stopped"`) {
		t.Fatalf("no graceful stop logged:\n%s", out.String())
	}
}

func TestWorkerRefusesBadConfig(t *testing.T) {
	t.Parallel()
	err := app.RunWorker(context.Background(), func(k string) string {
		return map[string]string{"TOLLGATE_RECONCILE_INTERVAL": "often"}[k]
	}, &strings.Builder{})
	if err == nil || !strings.Contains(err.Error(), "TOLLGATE_RECONCILE_INTERVAL") {
		t.Fatalf("run = %v, want an error naming TOLLGATE_RECONCILE_INTERVAL", err)
	}
}

// TestWorkerStopDropsTheBatchesItRecorded: a worker leaves the batch it
// recorded in flight until the tenant's next claim drops it (here, an hour
// away); stopping, it drops it itself.
func TestWorkerStopDropsTheBatchesItRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, db, rdb, prefix := stores(t)
	rl := quotaredis.New(rdb, prefix)
	tn, err := catalogdb.NewStore(db).CreateTenant(ctx, "test", "tenant", "pro")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rl.Admit(ctx, quota.Request{TenantID: tn.ID, Meter: "demo", Cost: 5}); err != nil {
		t.Fatal(err)
	}
	mustRedis(t, rl.ReportActive(ctx))
	flushing := prefix + ":v1:{t:" + tn.ID + "}:flushing"

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- app.RunWorker(wctx, func(k string) string {
			return map[string]string{
				"REDIS_URL":                    testenv.RedisURL(t),
				"DATABASE_URL":                 dbURL,
				"TOLLGATE_RECONCILE_INTERVAL":  "1h", // the first cycle only
				"TOLLGATE_WORKER_METRICS_ADDR": "127.0.0.1:0",
				"TOLLGATE_REDIS_PREFIX":        prefix,
			}[k]
		}, io.Discard)
	}()
	var units int64
	for deadline := time.Now().Add(60 * time.Second); units != 5 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		if err := db.QueryRow(ctx, `SELECT coalesce(sum(units), 0)::bigint FROM usage WHERE tenant_id = $1`, tn.ID).Scan(&units); err != nil {
			t.Fatal(err)
		}
	}
	if units != 5 {
		t.Fatalf("the ledger holds %d units after 60 s, want the 5 admitted", units)
	}
	if n, err := rdb.Exists(ctx, flushing).Result(); err != nil || n != 1 {
		t.Fatalf("the recorded batch in flight: %d, %v; want it there until the next claim", n, err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run = %v, want nil after its context ends", err)
	}
	if n, err := rdb.Exists(ctx, flushing).Result(); err != nil || n != 0 {
		t.Errorf("the recorded batch in flight after the worker stopped: %d, %v; want it dropped", n, err)
	}
}
