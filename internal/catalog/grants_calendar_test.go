package catalog

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/ratelimit"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestGrantInTheTenantsCalendar: a month grant for a tenant in
// America/New_York with anchor 15 is recorded for its billing period's
// first local date and lands in that period's counter.
func TestGrantInTheTenantsCalendar(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, nodes, _ := mustNodes(t, testenv.Postgres(t), 1)
	rdb := testenv.Redis(t)
	runner := ratelimit.New(rdb, testenv.Prefix(t, rdb))
	tenant, err := store.CreateTenantWith(ctx, "test", quota.Tenant{Name: "ny", Tier: "pro",
		BillingAnchorDay: 15, TimeZone: "America/New_York"})
	if err != nil {
		t.Fatal(err)
	}
	g := NewGrants(store, runner, nodes[0], time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	cal, err := nodes[0].Calendar(ctx, tenant.ID)
	if err != nil || cal.AnchorDay != 15 || cal.Zone.String() != "America/New_York" {
		t.Fatalf("Calendar: %v %v", cal, err)
	}
	now := time.Now()
	gr, _, err := g.Create(ctx, "test", tenant.ID, "", "month", 5)
	if err != nil || !gr.Applied {
		t.Fatalf("grant: %+v %v, want applied", gr, err)
	}
	pid := cal.PeriodID(now)
	if want := time.Date(pid/100, time.Month(pid%100), 15, 0, 0, 0, 0, time.UTC).Format(time.DateOnly); gr.PeriodStart != want {
		t.Errorf("period start %s, want %s", gr.PeriodStart, want)
	}
	d, err := runner.PeekIn(ctx, tenant.ID, cal, quota.Limits{MonthlyQuota: quota.Ptr(int64(100))}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := d.Limit(quota.LimitMonthly); l.Limit != 105 {
		t.Errorf("monthly limit after the grant: %+v, want 105", l)
	}
}
