package billing

import (
	"context"
	"fmt"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// TestMeterQuotaCrossingsAndOverage: the tier's meter quota of "search"
// (1,000 units a month, billed past it) gets its own threshold alerts, once
// per threshold, apart from the tier-wide quota's; the units past it are
// recorded as the meter's overage, not the tier's.
func TestMeterQuotaCrossingsAndOverage(t *testing.T) {
	t.Parallel()
	r := mustRig(t, nil)
	ctx := context.Background()
	if _, err := r.db.Exec(ctx, `UPDATE tiers SET meter_quotas = '[{"meter": "search", "daily_quota": null, "monthly_quota": 1000,
		"overage": "bill", "overage_price_cents_per_1k": 50}]' WHERE slug = 'free'`); err != nil {
		t.Fatal(err)
	}
	id := r.tenants(t, 1, "free")[0] // monthly quota 10,000
	qs := []quota.MeterQuota{{Meter: "search", MonthlyQuota: quota.Ptr(int64(1000)), Overage: quota.OverageBill, OveragePriceCentsPer1K: 50}}
	rc := r.reconciler()
	flush := func(meter string, units int64) {
		t.Helper()
		d, err := r.rl.Admit(ctx, quota.Request{TenantID: id, Meter: meter, Cost: units, MeterQuotas: qs,
			Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(10000))}})
		if err != nil || !d.Allowed {
			t.Fatalf("admit %s %d: %v %+v", meter, units, err, d)
		}
		_ = r.rl.ReportActive(ctx)
		if err := rc.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	alerts := func() map[string]int {
		rows, err := r.db.Query(ctx, `SELECT meter, threshold FROM alerts WHERE tenant_id = $1`, id)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var m string
			var th int
			_ = rows.Scan(&m, &th)
			out[fmt.Sprintf("%s@%d", m, th)]++
		}
		return out
	}
	flush("search", 799)
	if a := alerts(); len(a) != 0 {
		t.Fatalf("at 79.9 %% of search: %v, want none", a)
	}
	flush("search", 1)
	if a := alerts(); len(a) != 1 || a["search@80"] != 1 {
		t.Fatalf("at 80 %% of search: %v, want search's 80 %% alert only", a)
	}
	flush("search", 300) // 1,100: 100 units of the meter's overage
	flush("demo", 7000)  // 8,100 of the tier's 10,000
	if a := alerts(); len(a) != 3 || a["search@80"] != 1 || a["search@100"] != 1 || a["@80"] != 1 {
		t.Fatalf("alerts %v, want search at 80 and 100 %%, the tier at 80 %%", a)
	}
	var units, over, meterOver int64
	if err := r.db.QueryRow(ctx, `SELECT sum(units), sum(overage_units), sum(meter_overage_units) FROM usage WHERE tenant_id = $1 AND meter = 'search'`, id).
		Scan(&units, &over, &meterOver); err != nil {
		t.Fatal(err)
	}
	if units != 1100 || over != 0 || meterOver != 100 {
		t.Fatalf("search usage: %d units, %d overage, %d meter overage; want 1100, 0, 100", units, over, meterOver)
	}
}
