package worker

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWorkerCreditsALateRefund runs the worker with TOLLGATE_INVOICE_GRACE=0
// on a tenant whose last month had 3,600 units of overage (Pro: 180 cents):
// the month's invoice becomes final at the first cycles. A refund of 600 of
// those units then arrives: the worker records it, leaves the final
// invoice as it was, gives the 30 cents back as a credit that this month's
// draft draws, and counts it in its metrics.
func TestWorkerCreditsALateRefund(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, db, rdb, prefix := stores(t)
	rl := quotaredis.New(rdb, prefix)

	cur := quota.MonthStart(time.Now())
	prev := cur.AddDate(0, -1, 0)
	tn, err := catalogdb.NewStore(db).CreateTenant(ctx, "test", "tenant", "pro")
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `UPDATE tenants SET created_at = $2 WHERE id = $1`, tn.ID, prev)
	mustExec(t, db, `UPDATE tenant_tier_history SET valid_from = $2 WHERE tenant_id = $1`, tn.ID, prev)
	admit := func(at time.Time, cost int64) quota.Decision {
		t.Helper()
		d, err := rl.Admit(ctx, quota.Request{TenantID: tn.ID, Meter: "demo", Cost: cost, Now: at,
			Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(1000))}, Overage: quota.OverageBill})
		if err != nil || !d.Allowed {
			t.Fatalf("admit %d: %+v, %v", cost, d, err)
		}
		mustRedis(t, rl.ReportActive(ctx))
		return d
	}
	admit(cur.Add(-2*time.Hour), 1000)
	d := admit(cur.Add(-time.Hour), 3600)

	w := startWorker(t, map[string]string{
		"REDIS_URL":                    testenv.RedisURL(t),
		"DATABASE_URL":                 dbURL,
		"TOLLGATE_RECONCILE_INTERVAL":  interval,
		"TOLLGATE_INVOICE_GRACE":       "0s",
		"TOLLGATE_LOG_LEVEL":           "debug", // (the cycles' log lines)
		"TOLLGATE_WORKER_METRICS_ADDR": "127.0.0.1:0",
		"TOLLGATE_REDIS_PREFIX":        prefix,
	})
	var addr string
	select {
	case addr = <-w.started:
	case err := <-w.done:
		t.Fatalf("the worker stopped: %v", err)
	}
	ledger := billing.NewLedger(db)
	invoice := func(month time.Time) billing.Invoice {
		t.Helper()
		invs, err := ledger.TenantInvoices(ctx, tn.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, inv := range invs {
			if inv.Period == month.Format("2006-01") {
				return inv
			}
		}
		return billing.Invoice{}
	}
	w.waitCyclesUntil(t, 50, func() bool { return invoice(prev).Status == "final" })
	last := invoice(prev)
	if last.Status != "final" || last.TotalCents != 4900+180 {
		t.Fatalf("last month: %s, %d cents; want final, %d", last.Status, last.TotalCents, 4900+180)
	}

	mustRedis(t, rl.Refund(ctx, tn.ID, "demo", 600, 600, d.Now))
	mustRedis(t, rl.ReportActive(ctx))
	reason := "Late refund of " + prev.Format("2006-01")
	drawn := func() bool {
		for _, l := range invoice(cur).Lines {
			if l.Kind == "credit" && l.Description == "Credit: "+reason && l.AmountCents == -30 {
				return true
			}
		}
		return false
	}
	w.waitCyclesUntil(t, 50, drawn)
	if !drawn() {
		t.Errorf("this month's draft: %+v, want a line of -30 for %q", invoice(cur).Lines, reason)
	}
	var n, cents int64
	if err := db.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount_cents), 0)::bigint FROM credits WHERE tenant_id = $1 AND reason = $2`,
		tn.ID, reason).Scan(&n, &cents); err != nil {
		t.Fatal(err)
	}
	if n != 1 || cents != 30 {
		t.Errorf("%d late credits of %d cents, want one of 30", n, cents)
	}
	if got := invoice(prev); !reflect.DeepEqual(got, last) {
		t.Errorf("the final invoice changed:\n got %+v\nwant %+v", got, last)
	}
	if got := metric(t, addr, "tollgate_worker_late_credits_total"); got != 1 {
		t.Errorf("tollgate_worker_late_credits_total = %v, want 1", got)
	}
	if got := metric(t, addr, "tollgate_worker_late_credit_cents_total"); got != 30 {
		t.Errorf("tollgate_worker_late_credit_cents_total = %v, want 30", got)
	}
}
