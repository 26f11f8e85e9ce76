package usage

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/postgres"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/ratelimit"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestReaderAddsRecordedAndPendingUsage: a report and the month totals add
// what the flush recorded to what is still pending, per day and per meter,
// and show the limits as they stand without consuming anything.
func TestReaderAddsRecordedAndPendingUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	rdb := testenv.Redis(t)
	rl := ratelimit.New(rdb, testenv.Prefix(t, rdb))
	store := postgres.NewStore(db)
	tenant, err := store.CreateTenant(ctx, "test", "acme", "free")
	if err != nil {
		t.Fatal(err)
	}
	other, err := store.CreateTenant(ctx, "test", "other", "free")
	if err != nil {
		t.Fatal(err)
	}
	limits := quota.Limits{DailyQuota: quota.Ptr(int64(1000)), MonthlyQuota: quota.Ptr(int64(10_000))}
	admit := func(meter string, cost int64) {
		t.Helper()
		d, err := rl.Admit(ctx, quota.Request{TenantID: tenant.ID, Meter: meter, Cost: cost, Limits: limits})
		if err != nil || !d.Allowed {
			t.Fatalf("admit %s %d: %+v, %v; want allowed", meter, cost, d, err)
		}
		if err := rl.ReportActive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	admit("search", 3)
	admit("export", 5)
	rec := billing.NewReconciler(db, rl, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := rec.Flush(ctx); err != nil { // 8 units recorded
		t.Fatal(err)
	}
	admit("search", 2) // pending
	admit("search", 4) // pending

	r := NewReader(rl, billing.NewLedger(db), time.Now)
	p := catalog.Principal{Tenant: tenant, Tier: quota.Tier{Slug: "free"}, Limits: limits}
	for range 2 { // reading consumes nothing
		u, err := r.For(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if m := u.Month(); m.Units != 14 || m.Requests != 4 {
			t.Fatalf("month: got %+v, want 14 units in 4 requests", m)
		}
		want := map[string]int64{"export": 5, "search": 9}
		if len(u.Meters) != len(want) {
			t.Fatalf("meters: got %+v, want %v", u.Meters, want)
		}
		for _, m := range u.Meters {
			if m.Units != want[m.Meter] {
				t.Errorf("meter %s: got %d units, want %d", m.Meter, m.Units, want[m.Meter])
			}
		}
		if l, ok := u.Limit(quota.LimitDaily); !ok || l.Remaining != 1000-14 {
			t.Fatalf("daily limit: got %+v (%t), want %d remaining", l, ok, 1000-14)
		}
		if ms := u.MonthStart(); !ms.Equal(quota.MonthStart(ms)) || u.Daily[0].Date < ms.Format(time.DateOnly) {
			t.Errorf("month start %v, daily %+v: want the start of the month of the days", ms, u.Daily)
		}
	}
	totals, err := r.MonthTotals(ctx, []string{tenant.ID, other.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := totals[tenant.ID]; got.Units != 14 || got.Requests != 4 {
		t.Errorf("month totals: got %+v, want 14 units in 4 requests", got)
	}
	if got, ok := totals[other.ID]; !ok || got.Units != 0 {
		t.Errorf("month totals of a tenant without usage: got %+v (%t), want zero, present", got, ok)
	}
}
