package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// outageStack is a stack on a Redis of the test's own, which the test
// stops and starts, and the worker's reconciler on it.
func outageStack(t *testing.T) (*stack, *testenv.RedisProcess, *quotaredis.Store, *billing.Reconciler) {
	t.Helper()
	s := mustStack(t)
	proc := testenv.StartRedis(t)
	s.redis = proc.URL
	opts, err := redis.ParseURL(proc.URL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	rl := quotaredis.New(rdb, s.prefix)
	rc := billing.NewReconciler(s.pool, rl, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := rc.Repair(context.Background()); err != nil { // the worker's first start
		t.Fatal(err)
	}
	return s, proc, rl, rc
}

// invoiceLine returns the quantity and amount of the tenant's line of kind
// on this month's invoice (0, 0 when it has none).
func invoiceLine(t *testing.T, s *stack, tenantID, kind string) (qty, cents int64) {
	t.Helper()
	_ = s.pool.QueryRow(context.Background(), `SELECT l.quantity, l.amount_cents FROM invoice_lines l JOIN invoices i ON i.id = l.invoice_id
		WHERE i.tenant_id = $1 AND i.period = $2 AND l.kind = $3`, tenantID, quota.MonthStart(time.Now().UTC()), kind).Scan(&qty, &cents)
	return qty, cents
}

// TestFailOpenUsageIsBilledOnce stops the API's Redis: the 3 requests the
// fail-open tier is served meanwhile reach the invoice once Redis answers
// again (after the worker restored what the restart lost), with the
// overage they make past the monthly quota, exactly once however many
// reports and flushes follow.
func TestFailOpenUsageIsBilledOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	if quota.MonthStart(now).AddDate(0, 1, 0).Sub(now) < 5*time.Minute {
		t.Skip("too close to the month's end: the invoice would change months during the test")
	}
	s, proc, rl, rc := outageStack(t)
	ctx := context.Background()
	base := s.start()
	// 2 units a month included, then 1 cent a unit
	tier := s.tier(1, quota.Limits{MonthlyQuota: quota.Ptr(int64(2))}, func(t *quota.Tier) {
		t.FailOpen, t.Overage, t.OveragePriceCentsPer1K = true, quota.OverageBill, 1000
	})
	tenant, key := s.tenant(tier.Slug)
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 || r.header.Get("Tollgate-Degraded") != "" {
		t.Fatalf("before the outage: %d %q", r.status, r.header.Get("Tollgate-Degraded"))
	}
	eventually(t, "the first request reported", func() bool {
		if err := rc.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		var n int64
		_ = s.pool.QueryRow(ctx, `SELECT coalesce(sum(units), 0) FROM usage WHERE tenant_id = $1`, tenant.ID).Scan(&n)
		return n == 1
	})

	proc.Stop()
	for i := range 3 {
		if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 || r.header.Get("Tollgate-Degraded") != "fail-open" {
			t.Fatalf("request %d during the outage: %d %q, want 200 fail-open", i, r.status, r.header.Get("Tollgate-Degraded"))
		}
	}
	if m := do(t, "GET", base+"/metrics", "", ""); !strings.Contains(string(m.body), "tollgate_failopen_pending_units 3") {
		t.Fatalf("/metrics during the outage lacks tollgate_failopen_pending_units 3")
	}

	proc.Start() // a restart: Redis lost what it held
	if err := rc.Repair(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the outage's usage pending in Redis", func() bool {
		rows, err := rl.Pending(ctx, tenant.ID)
		return err == nil && len(rows) == 1 && rows[0].Units == 3
	})
	for range 2 {
		time.Sleep(1100 * time.Millisecond) // more reports of the node
		if err := rc.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := billing.NewInvoicer(s.pool, time.Now, 48*time.Hour).Run(ctx); err != nil {
			t.Fatal(err)
		}
		if qty, _ := invoiceLine(t, s, tenant.ID, "included"); qty != 4 {
			t.Fatalf("invoice's usage: %d units, want 4 (1 before the outage, 3 during it, once)", qty)
		}
		if qty, cents := invoiceLine(t, s, tenant.ID, "overage"); qty != 2 || cents != 2 {
			t.Fatalf("invoice's overage: %d units, %d cents; want 2 and 2 (4 past a quota of 2)", qty, cents)
		}
	}
	if m := do(t, "GET", base+"/metrics", "", ""); !strings.Contains(string(m.body), "tollgate_failopen_pending_units 0") ||
		!strings.Contains(string(m.body), `tollgate_failopen_recorded_units_total{store="redis"} 3`) {
		t.Fatalf("/metrics after the outage: want 0 pending, 3 recorded by redis")
	}
}

// TestFailOpenUsageReachesTheLedgerAtShutdown: a node shut down while its
// Redis is away writes the fail-open usage it holds to the ledger
// directly, once.
func TestFailOpenUsageReachesTheLedgerAtShutdown(t *testing.T) {
	t.Parallel()
	s, proc, _, _ := outageStack(t)
	ctx := context.Background()
	base, stop := startStoppableAPI(t, map[string]string{
		"REDIS_URL": s.redis, "DATABASE_URL": s.dbURL, "TOLLGATE_REDIS_PREFIX": s.prefix, "TOLLGATE_SHUTDOWN_TIMEOUT": "2s"})
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(100))}, func(t *quota.Tier) { t.FailOpen = true })
	tenant, key := s.tenant(tier.Slug)
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
		t.Fatalf("before the outage: %d", r.status)
	}
	proc.Stop()
	for range 2 {
		if r := do(t, "POST", base+"/api/demo/report", key, ""); r.status != 201 || r.header.Get("Tollgate-Degraded") != "fail-open" {
			t.Fatalf("during the outage: %d %q, want 201 fail-open", r.status, r.header.Get("Tollgate-Degraded"))
		}
	}
	stop()
	var units, requests int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(sum(units), 0), coalesce(sum(requests), 0) FROM usage WHERE tenant_id = $1 AND meter = 'report'`,
		tenant.ID).Scan(&units, &requests); err != nil {
		t.Fatal(err)
	}
	if units != 20 || requests != 2 {
		t.Fatalf("ledger after the shutdown: %d units, %d requests of report; want 20 and 2", units, requests)
	}
}

// TestFailOpenRefundAndSettleRoutes: during an outage a fail-open request
// on a refund route whose upstream fails is refunded, and one on a settle
// route is settled to the cost its upstream reports; what reaches Redis
// afterwards is what they finally cost.
func TestFailOpenRefundAndSettleRoutes(t *testing.T) {
	t.Parallel()
	s, proc, rl, rc := outageStack(t)
	ctx := context.Background()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/fail"):
			w.WriteHeader(http.StatusInternalServerError)
		case strings.HasPrefix(r.URL.Path, "/gen/"):
			w.Header().Set("Tollgate-Actual-Cost", "3")
			w.WriteHeader(http.StatusOK)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	t.Cleanup(up.Close)
	s.routes = filepath.Join(t.TempDir(), "routes.json")
	table := fmt.Sprintf(`{"routes": [
		{"method": "*", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": %q, "refund_on_5xx": true},
		{"method": "*", "path": "/api/gen/", "meter": "gen", "cost": 10, "upstream": %q, "settle": true}
	]}`, up.URL+"/up/", up.URL+"/gen/")
	if err := os.WriteFile(s.routes, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	base := s.start()
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))}, func(t *quota.Tier) { t.FailOpen = true })
	tenant, key := s.tenant(tier.Slug)

	proc.Stop()
	if r := do(t, "GET", base+"/api/up/fail", key, ""); r.status != 500 || r.header.Get("Tollgate-Degraded") != "fail-open" ||
		r.header.Get("Tollgate-Refunded") != "1" {
		t.Fatalf("failed call during the outage: %d %v, want a refunded fail-open 500", r.status, r.header)
	}
	if r := do(t, "GET", base+"/api/up/ok", key, ""); r.status != 201 {
		t.Fatalf("call during the outage: %d", r.status)
	}
	if r := do(t, "GET", base+"/api/gen/x", key, ""); r.status != 200 || r.header.Get("Tollgate-Settled-Cost") != "3" {
		t.Fatalf("settle route during the outage: %d %v, want 200 settled to 3", r.status, r.header)
	}

	proc.Start()
	if err := rc.Repair(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the outage's usage pending in Redis", func() bool {
		rows, err := rl.Pending(ctx, tenant.ID)
		return err == nil && len(rows) == 2
	})
	rows, _ := rl.Pending(ctx, tenant.ID)
	got := map[string][2]int64{}
	for _, r := range rows {
		got[r.Meter] = [2]int64{r.Units, r.Requests}
	}
	if got["up"] != [2]int64{1, 2} || got["gen"] != [2]int64{3, 1} {
		t.Fatalf("pending %v, want up: 1 unit of 2 requests (one refunded), gen: 3 units (settled) of 1", got)
	}
}
