package main

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/postgres"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/stripeexport"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWorkerExportsFinalInvoicesToStripe runs the worker with a Stripe key
// and stripe-mock (behind a recording proxy) just after a month ended: it
// finalizes the month's invoices of two pro tenants and exports them. One
// tenant's customer cannot be made (Stripe answers 500): its export is
// recorded failed with the error and counted, the other's exported, and
// /metrics says so.
func TestWorkerExportsFinalInvoicesToStripe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	proxy := testenv.NewStripeProxy(t, testenv.StripeMockURL(t))
	dbURL := testenv.MigratedDatabase(t)
	db, err := postgres.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)

	prev := quota.MonthStart(time.Now()).AddDate(0, -1, 0)
	ids := map[string]string{}
	for _, name := range []string{"Good Payer", "Broken Customer"} {
		tn, err := postgres.NewStore(db).CreateTenant(ctx, "test", name, "pro")
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = tn.ID
		mustExec(t, db, `UPDATE tenants SET created_at = $2 WHERE id = $1`, tn.ID, prev)
		mustExec(t, db, `UPDATE tenant_tier_history SET valid_from = $2 WHERE tenant_id = $1`, tn.ID, prev)
	}
	proxy.FailWith(func(_ int, c testenv.StripeCall) int {
		if c.IdempotencyKey == stripeexport.CustomerKey(ids["Broken Customer"]) {
			return 500
		}
		return 0
	})

	w := startWorker(t, map[string]string{
		"REDIS_URL":                    testenv.RedisURL(t),
		"DATABASE_URL":                 dbURL,
		"TOLLGATE_RECONCILE_INTERVAL":  "200ms",
		"TOLLGATE_INVOICE_GRACE":       "0s",
		"TOLLGATE_LOG_LEVEL":           "debug",
		"TOLLGATE_WORKER_METRICS_ADDR": "127.0.0.1:0",
		"TOLLGATE_REDIS_PREFIX":        testenv.Prefix(t, testenv.Redis(t)),
		"TOLLGATE_STRIPE_KEY":          "sk_test_tollgate",
		"TOLLGATE_STRIPE_URL":          proxy.URL,
	})
	var addr string
	select {
	case addr = <-w.started:
	case err := <-w.done:
		t.Fatalf("the worker stopped: %v", err)
	}
	type row struct {
		status, stripeID, lastError string
		total                       int64
	}
	export := func(tenant string) (r row) {
		t.Helper()
		err := db.QueryRow(ctx, `SELECT coalesce(x.status, 'none'), coalesce(x.stripe_invoice_id, ''), coalesce(x.last_error, ''), i.total_cents
			FROM invoices i LEFT JOIN invoice_exports x ON x.invoice_id = i.id
			WHERE i.tenant_id = $1 AND i.period = $2 AND i.status = 'final'`, tenant, prev).Scan(&r.status, &r.stripeID, &r.lastError, &r.total)
		if err != nil {
			return row{status: "no final invoice"}
		}
		return r
	}
	w.waitCyclesUntil(t, 100, func() bool {
		return export(ids["Good Payer"]).status == "exported" && export(ids["Broken Customer"]).status == "failed" &&
			metric(t, addr, "tollgate_stripe_exports_failing") == 1
	})
	good, broken := export(ids["Good Payer"]), export(ids["Broken Customer"])
	if good.status != "exported" || !strings.HasPrefix(good.stripeID, "in_") || good.total <= 0 {
		t.Errorf("the good tenant's invoice: %+v, want a paid invoice exported with Stripe's invoice id", good)
	}
	if broken.status != "failed" || !strings.Contains(broken.lastError, "create customer: HTTP 500") {
		t.Errorf("the broken tenant's invoice: %+v, want failed with Stripe's 500", broken)
	}
	for series, want := range map[string]float64{
		`tollgate_stripe_exports_total{outcome="exported"}`: 1,
		`tollgate_stripe_exports_total{outcome="failed"}`:   1, // retried only after 30 s
		`tollgate_stripe_exports_failing`:                   1,
	} {
		if got := metric(t, addr, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	var sent, want []string
	for _, c := range proxy.Calls() {
		if c.Path == "/v1/invoiceitems" {
			sent = append(sent, c.Form.Get("amount"))
		}
	}
	rows, err := db.Query(ctx, `SELECT l.amount_cents::text FROM invoice_lines l JOIN invoices i ON i.id = l.invoice_id
		WHERE i.tenant_id = $1 AND i.period = $2 ORDER BY l.line_no`, ids["Good Payer"], prev)
	if err != nil {
		t.Fatal(err)
	}
	if want, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 || !slices.Equal(sent, want) {
		t.Errorf("invoice item amounts sent %q, want the invoice's lines %q", sent, want)
	}
}

// metricsText returns the worker's /metrics page.
func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWorkerWithoutStripeKeyExportsNothing: without TOLLGATE_STRIPE_KEY
// the worker has no export step and no export series.
func TestWorkerWithoutStripeKeyExportsNothing(t *testing.T) {
	t.Parallel()
	w := startWorker(t, map[string]string{
		"REDIS_URL":                    testenv.RedisURL(t),
		"DATABASE_URL":                 testenv.NewDatabase(t),
		"TOLLGATE_RECONCILE_INTERVAL":  "100ms",
		"TOLLGATE_LOG_LEVEL":           "debug",
		"TOLLGATE_WORKER_METRICS_ADDR": "127.0.0.1:0",
		"TOLLGATE_REDIS_PREFIX":        testenv.Prefix(t, testenv.Redis(t)),
	})
	addr := <-w.started
	w.waitCycles(t, 2)
	body := metricsText(t, addr)
	if strings.Contains(body, "tollgate_stripe_") || strings.Contains(w.log(), "stripe export on") {
		t.Errorf("a worker without a Stripe key shows Stripe series or logs the export on")
	}
	if !strings.Contains(body, "tollgate_worker_cycle_seconds") {
		t.Errorf("/metrics lacks the worker's own series:\n%s", body)
	}
}
