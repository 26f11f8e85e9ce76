package worker

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/pgdb"
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
	db, err := pgdb.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)

	prev := quota.MonthStart(time.Now()).AddDate(0, -1, 0)
	ids := map[string]string{}
	for _, name := range []string{"Good Payer", "Broken Customer"} {
		tn, err := catalogdb.NewStore(db).CreateTenant(ctx, "test", name, "pro")
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
		"TOLLGATE_RECONCILE_INTERVAL":  interval,
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

// TestKill9MidExportExportsEachThingOnce kills a real worker process with
// SIGKILL right after Stripe made the invoice's first item, before the
// worker heard back; once the killed worker's lease is over, a new worker
// process finishes the export: every call was made with the same key and
// parameters, only the unanswered one twice, and the invoice is exported
// once with Stripe's ids stored.
func TestKill9MidExportExportsEachThingOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	proxy := testenv.NewStripeProxy(t, testenv.StripeMockURL(t))
	dbURL := testenv.MigratedDatabase(t)
	db, err := pgdb.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	tn, err := catalogdb.NewStore(db).CreateTenant(ctx, "test", "Killed Midway", "free")
	if err != nil {
		t.Fatal(err)
	}
	var inv string
	if err := db.QueryRow(ctx, `INSERT INTO invoices (tenant_id, period, status, finalized_at, total_cents)
		VALUES ($1, '2026-11-01', 'final', now(), 3400) RETURNING id::text`, tn.ID).Scan(&inv); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO invoice_lines (invoice_id, line_no, kind, description, quantity, amount_cents)
		VALUES ($1, 1, 'subscription', 'Pro plan', 1, 2900), ($1, 2, 'overage', 'Overage', 5000, 500)`, inv)

	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "TOLLGATE_TEST_RUN_WORKER=1", "DATABASE_URL="+dbURL, "REDIS_URL="+testenv.RedisURL(t),
			"TOLLGATE_REDIS_PREFIX="+testenv.Prefix(t, testenv.Redis(t)), "TOLLGATE_RECONCILE_INTERVAL=500ms",
			"TOLLGATE_WORKER_METRICS_ADDR=127.0.0.1:0", "TOLLGATE_LOG_LEVEL=error",
			"TOLLGATE_STRIPE_KEY=sk_test_tollgate", "TOLLGATE_STRIPE_URL="+proxy.URL)
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	first := start()
	killed := make(chan struct{})
	proxy.AfterForward(func(_ int, c testenv.StripeCall) bool {
		if c.IdempotencyKey != stripeexport.LineKey(inv, 1) {
			return false
		}
		_ = first.Process.Kill() // SIGKILL
		close(killed)
		return true
	})
	select {
	case <-killed:
	case <-time.After(60 * time.Second):
		_ = first.Process.Kill()
		t.Fatal("the first worker did not reach the invoice's first item within 60 s")
	}
	_ = first.Wait()
	proxy.AfterForward(nil)
	before := proxy.Calls()
	var status string
	var sid *string
	if err := db.QueryRow(ctx, `SELECT status, stripe_invoice_id FROM invoice_exports WHERE invoice_id = $1`, inv).Scan(&status, &sid); err != nil ||
		status != "pending" || sid == nil {
		t.Fatalf("after the kill: status %q, stripe invoice %v (%v); want pending with the invoice's Stripe id", status, sid, err)
	}

	// The killed worker's lease, two minutes, is over.
	mustExec(t, db, `UPDATE invoice_exports SET next_attempt_at = now() WHERE invoice_id = $1`, inv)
	second := start()
	defer func() { _ = second.Process.Kill(); _ = second.Wait() }()
	for deadline := time.Now().Add(60 * time.Second); status != "exported"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the second worker did not finish the export within 60 s (status %q)", status)
		}
		if err := db.QueryRow(ctx, `SELECT status FROM invoice_exports WHERE invoice_id = $1`, inv).Scan(&status); err != nil {
			t.Fatal(err)
		}
	}
	all := append(before, proxy.Calls()...)
	byKey := map[string]testenv.StripeCall{}
	var order []string
	for _, c := range all {
		if prev, ok := byKey[c.IdempotencyKey]; ok && (prev.Path != c.Path || !reflect.DeepEqual(prev.Form, c.Form)) {
			t.Errorf("key %s sent again with %s %v, first with %s %v", c.IdempotencyKey, c.Path, c.Form, prev.Path, prev.Form)
		} else if !ok {
			order = append(order, c.IdempotencyKey)
		}
		byKey[c.IdempotencyKey] = c
	}
	want := []string{stripeexport.CustomerKey(tn.ID), stripeexport.InvoiceKey(inv, "create"), stripeexport.LineKey(inv, 1),
		stripeexport.LineKey(inv, 2), stripeexport.InvoiceKey(inv, "finalize")}
	if !slices.Equal(order, want) || len(all) != len(want)+1 {
		t.Fatalf("calls %d, keys %q; want keys %q with only the unanswered one made twice", len(all), order, want)
	}
	var gotSID, gotCust string
	if err := db.QueryRow(ctx, `SELECT x.stripe_invoice_id, t.stripe_customer_id FROM invoice_exports x, tenants t
		WHERE x.invoice_id = $1 AND t.id = $2`, inv, tn.ID).Scan(&gotSID, &gotCust); err != nil {
		t.Fatal(err)
	}
	if gotSID != byKey[stripeexport.InvoiceKey(inv, "create")].ID || gotCust != byKey[stripeexport.CustomerKey(tn.ID)].ID {
		t.Errorf("stored invoice %q and customer %q, want the ids Stripe answered", gotSID, gotCust)
	}
}
