package billing

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
)

func TestTenantTotalsSumsThePeriodPerTenant(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	a := invTenant(t, db, "free", invNov)
	b := invTenant(t, db, "pro", invNov)
	idle := invTenant(t, db, "pro", invNov)
	invUsage(t, db, a, invNov.Add(time.Hour), 10, 0)
	invUsage(t, db, a, invNov.Add(49*time.Hour), 5, 0)
	invExec(t, db, `INSERT INTO usage (tenant_id, hour, meter, units, requests, rejected) VALUES ($1, $2, 'other', 2, 1, 3)`,
		a, invNov.Add(2*time.Hour))
	invUsage(t, db, a, invDec, 1000, 0) // next month: outside the period
	invUsage(t, db, b, invNov.Add(-time.Hour), 1000, 0)
	invUsage(t, db, b, invNov, 7, 0)

	got, err := NewLedger(db).TenantTotals(context.Background(), []string{a, b, idle}, invNov, invDec)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Totals{a: {Units: 17, Requests: 16, Rejected: 3}, b: {Units: 7, Requests: 7}}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("totals of %s = %+v, want %+v", id, got[id], w)
		}
	}
	if _, ok := got[idle]; ok || len(got) != 2 {
		t.Errorf("got %d tenants (%v), want only the two with usage", len(got), got)
	}
}
