package app

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/worker"
)

func TestWorkerMetricsSeries(t *testing.T) {
	rec := billing.NewReconciler(nil, nil, time.Now, nil)
	alerts := billing.NewDeliverer(nil, nil, time.Now)
	rec.UnitsFlushed.Add(42)
	rec.LateCredits.Add(2)
	rec.LateCreditCents.Add(31)
	rec.LateRaises.Add(1)
	rec.RescuedBatches.Add(4)
	rec.OlderDataBatches.Add(5)
	alerts.Retried.Add(3)
	reg, cycle := workerMetrics(rec, alerts, func() time.Time { return time.Now().Add(-2 * time.Second) })
	cycle.Observe(0.25)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				got[f.GetName()] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[f.GetName()] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				got[f.GetName()] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	for name, want := range map[string]float64{
		"tollgate_worker_units_flushed_total":      42,
		"tollgate_worker_tenants_flushed_total":    0,
		"tollgate_webhook_failures_total":          3,
		"tollgate_worker_cycle_seconds":            1,
		"tollgate_worker_stuck_batches":            0,
		"tollgate_worker_late_credits_total":       2,
		"tollgate_worker_late_credit_cents_total":  31,
		"tollgate_worker_late_raises_total":        1,
		"tollgate_worker_rescued_batches_total":    4,
		"tollgate_worker_older_data_batches_total": 5,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %t), want %v", name, v, ok, want)
		}
	}
	if lag := got["tollgate_worker_lag_seconds"]; lag < 2 || lag > 60 {
		t.Errorf("tollgate_worker_lag_seconds = %v, want about 2", lag)
	}
}

// TestWorkerSharesSeries: a lone worker, once synced, holds the 64 shards,
// leads and counts itself alive.
func TestWorkerSharesSeries(t *testing.T) {
	t.Parallel()
	db, err := pgdb.Open(context.Background(), testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sh := worker.NewShares(db, nil)
	defer sh.Close()
	if err := sh.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sharesMetrics(reg, sh)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
	}
	for name, want := range map[string]float64{
		"tollgate_worker_shards": 64, "tollgate_worker_leader": 1, "tollgate_worker_members": 1,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %t), want %v", name, v, ok, want)
		}
	}
}
