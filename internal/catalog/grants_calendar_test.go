package catalog

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
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
	runner := quotaredis.New(rdb, testenv.Prefix(t, rdb))
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

// TestMissedGrantsInTheTenantsCalendar: grants recorded but not applied
// (the live counter failed) are applied by the worker's step in the
// tenant's calendar: a month grant of a tenant anchored on the 15th (its
// period starts on a 15th, not on the UTC month's 1st) and a day grant of a
// tenant 14 hours ahead of UTC (its local date is often tomorrow's).
func TestMissedGrantsInTheTenantsCalendar(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, nodes, _ := mustNodes(t, testenv.Postgres(t), 1)
	rdb := testenv.Redis(t)
	runner := quotaredis.New(rdb, testenv.Prefix(t, rdb))
	g := NewGrants(store, runner, nodes[0], time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	now := time.Now()
	for _, tc := range []struct {
		anchor int
		zone   string
		period string
		limit  quota.LimitName
	}{
		{15, "America/New_York", "month", quota.LimitMonthly},
		{1, "Pacific/Kiritimati", "day", quota.LimitDaily},
	} {
		tenant, err := store.CreateTenantWith(ctx, "test", quota.Tenant{Name: "far", Tier: "pro",
			BillingAnchorDay: tc.anchor, TimeZone: tc.zone})
		if err != nil {
			t.Fatal(err)
		}
		cal, err := nodes[0].Calendar(ctx, tenant.ID)
		if err != nil {
			t.Fatal(err)
		}
		gr, _, err := store.CreateGrantIdempotent(ctx, "test", tenant.ID, "", tc.period, periodDate(cal, tc.period, now), 7)
		if err != nil || gr.Applied {
			t.Fatalf("%s: recorded grant %+v %v, want unapplied", tc.zone, gr, err)
		}
		done, err := g.ApplyMissed(ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, d := range done {
			found = found || d.ID == gr.ID
		}
		if !found {
			t.Fatalf("%s: ApplyMissed applied %+v, not the %s grant %s of %s", tc.zone, done, tc.period, gr.ID, gr.PeriodStart)
		}
		d, err := runner.PeekIn(ctx, tenant.ID, cal, quota.Limits{DailyQuota: quota.Ptr(int64(100)), MonthlyQuota: quota.Ptr(int64(100))}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if l, _ := d.Limit(tc.limit); l.Limit != 107 {
			t.Errorf("%s: %s limit after the missed grant: %+v, want 107", tc.zone, tc.limit, l)
		}
	}
}
