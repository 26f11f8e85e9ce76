package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/app"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// workerRun runs the worker with env until the test ends and lets the test
// wait for its cycles and read its log and metrics.
type workerRun struct {
	cycles  chan struct{}
	started chan string // the metrics address
	done    chan error

	mu   sync.Mutex
	logs strings.Builder
}

func (w *workerRun) log() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.logs.String()
}

// stores opens a database of the test's own, migrated (its pool closed when
// the test ends), and a Redis client with a key prefix of the test's own.
func stores(t *testing.T) (dbURL string, db *pgxpool.Pool, rdb redis.UniversalClient, prefix string) {
	t.Helper()
	dbURL = testenv.MigratedDatabase(t)
	db, err := pgdb.Open(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	rdb = testenv.Redis(t)
	return dbURL, db, rdb, testenv.Prefix(t, rdb)
}

func startWorker(t *testing.T, env map[string]string) *workerRun {
	t.Helper()
	w := &workerRun{cycles: make(chan struct{}, 10_000), started: make(chan string, 1), done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			w.mu.Lock()
			w.logs.WriteString(line + "\n")
			w.mu.Unlock()
			var m struct {
				Msg  string `json:"msg"`
				Addr string `json:"metrics_addr"`
			}
			_ = json.Unmarshal([]byte(line), &m)
			switch m.Msg {
			case "worker started":
				w.started <- m.Addr
			case "worker cycle":
				w.cycles <- struct{}{}
			}
		}
	}()
	go func() {
		w.done <- app.RunWorker(ctx, func(k string) string { return env[k] }, pw)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-w.done; err != nil {
			t.Errorf("run = %v, want nil after its context ends", err)
		}
		<-scanned
	})
	return w
}

// waitCycles returns once the worker has completed n cycles after the call;
// the first may have begun before it, so n = 2 sees one whole cycle. The
// deadline only keeps a broken worker from hanging the test.
func (w *workerRun) waitCycles(t *testing.T, n int) {
	t.Helper()
	for len(w.cycles) > 0 { // cycles that ended before the call
		<-w.cycles
	}
	for range n {
		select {
		case <-w.cycles:
		case err := <-w.done:
			t.Fatalf("the worker stopped: %v", err)
		case <-time.After(60 * time.Second):
			t.Fatal("no worker cycle within 60 s")
		}
	}
}

// waitCyclesUntil waits for whole cycles (as waitCycles(t, 2) does for
// one) until done holds, at most limit of them; the caller then checks
// what it expects, and a failure shows the worker's step errors.
func (w *workerRun) waitCyclesUntil(t *testing.T, limit int, done func() bool) {
	t.Helper()
	w.waitCycles(t, 2)
	for n := 1; n < limit && !done(); n++ {
		w.waitCycles(t, 1)
	}
	if !done() {
		for _, line := range strings.Split(w.log(), "\n") {
			if strings.Contains(line, `"level":"ERROR"`) || strings.Contains(line, `"level":"WARN"`) {
				t.Log(line)
			}
		}
	}
}

// metric returns the value of an unlabelled series on the worker's
// /metrics endpoint.
func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("no series %s on /metrics", name)
	return 0
}

// TestWorkerHoldsTheMonthOpenWhileABatchIsStuck runs the worker just after a
// month ended, with one tenant's last usage of that month in a batch
// Postgres rejects: the worker flushes the other tenant, reports the stuck
// batch, and finalizes no invoice of the month until the batch is recorded.
func TestWorkerHoldsTheMonthOpenWhileABatchIsStuck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, db, rdb, prefix := stores(t)

	cur := quota.MonthStart(time.Now())
	prev, lastHour := cur.AddDate(0, -1, 0), cur.Add(-time.Hour)
	var good, bad string
	for _, id := range []*string{&good, &bad} {
		tn, err := catalogdb.NewStore(db).CreateTenant(ctx, "test", "tenant", "pro")
		if err != nil {
			t.Fatal(err)
		}
		*id = tn.ID
		mustExec(t, db, `UPDATE tenants SET created_at = $2 WHERE id = $1`, tn.ID, prev)
		mustExec(t, db, `UPDATE tenant_tier_history SET valid_from = $2 WHERE tenant_id = $1`, tn.ID, prev)
	}
	// The last hour of the month, as admit.lua counts it; the bad tenant's
	// also holds a row under a meter longer than the ledger accepts.
	pending := func(id string) string { return prefix + ":v1:{t:" + id + "}:pending" }
	f := fmt.Sprintf("%d|", lastHour.Unix())
	long := f + strings.Repeat("m", 65) + "|"
	mustRedis(t, rdb.HSet(ctx, pending(good), f+"demo|u", 40, f+"demo|r", 4).Err())
	mustRedis(t, rdb.HSet(ctx, pending(bad), f+"demo|u", 10, f+"demo|r", 1, long+"u", 7, long+"r", 1).Err())

	w := startWorker(t, map[string]string{
		"REDIS_URL":                    testenv.RedisURL(t),
		"DATABASE_URL":                 dbURL,
		"TOLLGATE_RECONCILE_INTERVAL":  interval,
		"TOLLGATE_INVOICE_GRACE":       "0s",
		"TOLLGATE_LOG_LEVEL":           "debug",
		"TOLLGATE_WORKER_METRICS_ADDR": "127.0.0.1:0",
		"TOLLGATE_REDIS_PREFIX":        prefix,
	})
	var addr string
	select {
	case addr = <-w.started:
	case err := <-w.done:
		t.Fatalf("the worker stopped: %v", err)
	}
	units := func(id string) (n int64) {
		t.Helper()
		if err := db.QueryRow(ctx, `SELECT coalesce(sum(units), 0)::bigint FROM usage WHERE tenant_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	status := func(id string) string {
		t.Helper()
		var s string
		if err := db.QueryRow(ctx, `SELECT coalesce((SELECT status FROM invoices WHERE tenant_id = $1 AND period = $2), 'none')`, id, prev).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	// The first whole cycle flushes everything it can; under load a step
	// may run past its timeout (the interval) and the cycle
	// retries it, so wait for whole cycles until the good tenant is in,
	// at most 20, then check everything at once.
	w.waitCyclesUntil(t, 20, func() bool { return units(good) == 40 && metric(t, addr, "tollgate_worker_stuck_batches") == 1 })
	if got := units(good); got != 40 {
		t.Errorf("good tenant: %d units in Postgres, want 40: a stuck batch must not block it", got)
	}
	if got := units(bad); got != 0 {
		t.Errorf("bad tenant: %d units in Postgres, want 0 while its batch is rejected", got)
	}
	for _, id := range []string{good, bad} {
		if got := status(id); got == "final" {
			t.Errorf("tenant %s: invoice of %s is final while a batch of that month is stuck", id, prev.Format("2006-01"))
		}
	}
	if got := metric(t, addr, "tollgate_worker_stuck_batches"); got != 1 {
		t.Errorf("tollgate_worker_stuck_batches = %v, want 1", got)
	}
	if !strings.Contains(w.log(), `"tenant_id":"`+bad+`"`) {
		t.Errorf("the log does not name the stuck batch's tenant %s", bad)
	}
	if t.Failed() {
		t.FailNow()
	}

	// An operator drops the bad row from the batch in flight.
	mustRedis(t, rdb.HDel(ctx, prefix+":v1:{t:"+bad+"}:flushing", long+"u", long+"r").Err())
	w.waitCyclesUntil(t, 20, func() bool { return units(bad) == 10 && status(good) == "final" && status(bad) == "final" })
	if got := units(bad); got != 10 {
		t.Errorf("bad tenant after the repair: %d units in Postgres, want 10", got)
	}
	for _, id := range []string{good, bad} {
		if got := status(id); got != "final" {
			t.Errorf("tenant %s: invoice of %s is %s once every batch is recorded, want final", id, prev.Format("2006-01"), got)
		}
	}
	if got := metric(t, addr, "tollgate_worker_stuck_batches"); got != 0 {
		t.Errorf("tollgate_worker_stuck_batches = %v after the repair, want 0", got)
	}
}

func mustExec(tb testing.TB, db *pgxpool.Pool, sql string, args ...any) {
	tb.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

func mustRedis(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}
