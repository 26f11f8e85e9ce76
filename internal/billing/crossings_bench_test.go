package billing

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// BenchmarkRecordCrossings is the flush's check of one chunk's 2,000
// tenants against their monthly quotas, late in a month: each tenant has
// 600 hourly rows this month (25 days of traffic). ns/op is one check, in a
// transaction rolled back after it. The check reads each tenant's month
// from usage_month_totals, so its time does not grow with the hours the
// month holds.
func BenchmarkRecordCrossings(b *testing.B) {
	ctx := context.Background()
	r := &rig{db: testenv.Postgres(b)}
	ids := r.tenants(b, 2000, "pro")
	now := time.Now().UTC()
	month := quota.MonthStart(now)
	hours := min(600, int(now.Sub(month)/time.Hour)+1)
	if _, err := r.db.Exec(ctx, `
		INSERT INTO usage (tenant_id, hour, meter, units, requests)
		SELECT t, $2::timestamptz + make_interval(hours => h), 'demo', 1, 1
		FROM unnest($1::uuid[]) t, generate_series(0, $3 - 1) h`, ids, month, hours); err != nil {
		b.Fatal(err)
	}
	if _, err := r.db.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	rc := NewReconciler(r.db, nil, func() time.Time { return now }, quiet)
	for b.Loop() {
		tx, err := r.db.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := rc.recordCrossings(ctx, tx, ids); err != nil {
			b.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(hours), "hours-a-tenant")
}
