package billing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/quota"
)

// BenchmarkRecordBesideFinalInvoices records one flush transaction's
// batches (a chunk: 500 tenants, each one row of the current hour) for
// tenants with a year of final invoices and the current month's draft:
// what every flush transaction pays, late usage or not.
func BenchmarkRecordBesideFinalInvoices(b *testing.B) {
	ctx := context.Background()
	r, ids, hour := benchFinalInvoices(b)
	rc := r.reconciler()
	batches := make([]quota.Batch, len(ids))
	for i := 0; b.Loop(); i++ {
		for k, id := range ids {
			batches[k] = quota.Batch{ID: fmt.Sprintf("bench-%d-%d", i, k), TenantID: id,
				Rows: []quota.PendingRow{{Hour: hour, Meter: "demo", Units: 3, Requests: 3}}}
		}
		if err := rc.recordTx(ctx, batches); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tenants/s")
}

// BenchmarkLockLateInvoices is the part of it that looks for ended
// periods the rows fall in (lockLateInvoices), in a transaction of its
// own. Mid-period, the rows of the current hour: one index probe finds
// that no period ended since. At a period's end, rows of the period's
// last hour: one index range scan per tenant, each locking the tenant's
// invoice of the period.
func BenchmarkLockLateInvoices(b *testing.B) {
	ctx := context.Background()
	r, ids, hour := benchFinalInvoices(b)
	cur := quota.MonthStart(hour)
	for _, bc := range []struct {
		name      string
		hour, now time.Time
		want      int
	}{
		{"mid-period", hour, hour, 0},
		{"at a period's end", cur.Add(-time.Hour), cur.Add(10 * time.Minute), len(ids)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			batches := make([]quota.Batch, len(ids))
			for k, id := range ids {
				batches[k] = quota.Batch{ID: fmt.Sprintf("bench-%d", k), TenantID: id,
					Rows: []quota.PendingRow{{Hour: bc.hour, Meter: "demo", Units: 3, Requests: 3}}}
			}
			for b.Loop() {
				err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
					late, err := lockLateInvoices(ctx, tx, batches, bc.now)
					if err == nil && len(late) != bc.want {
						err = fmt.Errorf("%d ended invoices, want %d", len(late), bc.want)
					}
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchFinalInvoices returns a rig with a chunk of tenants that each have
// a year of final invoices and the current month's draft, and the hour to
// record their usage in.
func benchFinalInvoices(b *testing.B) (*rig, []string, time.Time) {
	ctx := context.Background()
	r := mustRig(b, nil)
	ids := r.tenants(b, chunk, "pro")
	hour := time.Now().UTC().Truncate(time.Hour)
	cur := quota.MonthStart(hour)
	if _, err := r.db.Exec(ctx, `
		INSERT INTO invoices (tenant_id, period, period_start, period_end, status, finalized_at)
		SELECT t, (m AT TIME ZONE 'UTC')::date, m, m + interval '1 month',
		       CASE WHEN m < $2 THEN 'final' ELSE 'draft' END, CASE WHEN m < $2 THEN $2 END
		FROM unnest($1::uuid[]) AS t, generate_series($2::timestamptz - interval '12 months', $2::timestamptz, interval '1 month') AS m`,
		ids, cur); err != nil {
		b.Fatal(err)
	}
	if _, err := r.db.Exec(ctx, `ANALYZE invoices`); err != nil {
		b.Fatal(err)
	}
	return r, ids, hour
}
