package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestResetQuotasOnce: a reset empties the day's and month's used units,
// keeps grants and the month's overage (billed, and bounded by the spend
// cap whatever resets happen), and is applied once: sent again after
// more usage, it empties nothing; a later reset applies; a reset of a past
// day and month leaves the current counters alone; a tenant without state
// gets none. Through real admissions, on one server.
func TestResetQuotasOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 10, Overage: quota.OverageBill, OveragePriceCentsPer1K: 100,
		Limits: quota.Limits{DailyQuota: i64(1000), MonthlyQuota: i64(25)}}
	for range 3 {
		if d := mustAdmit(t, r, req); !d.Allowed {
			t.Fatalf("admission refused: %s", fmtDecision(d))
		}
	}
	if err := r.Grant(ctx, tenant, "day", 7, now); err != nil {
		t.Fatal(err)
	}
	if err := r.Grant(ctx, tenant, "month", 9, now); err != nil {
		t.Fatal(err)
	}
	check := func(name string, du, dg, mu, mg, mo int64) {
		t.Helper()
		st := stateOf(t, c, r, tenant)
		if st.Day.Used != du || st.Day.Grant != dg || st.Month.Used != mu || st.Month.Grant != mg || st.Month.Overage != mo {
			t.Errorf("%s: got day used %d grant %d, month used %d grant %d overage %d; want %d %d, %d %d %d", name,
				st.Day.Used, st.Day.Grant, st.Month.Used, st.Month.Grant, st.Month.Overage, du, dg, mu, mg, mo)
		}
	}
	check("before", 30, 7, 30, 9, 5)

	applied, err := r.ResetQuotas(ctx, tenant, now)
	if err != nil || !applied {
		t.Fatalf("reset: %v, %v; want applied", applied, err)
	}
	check("after the reset", 0, 7, 0, 9, 5)

	mustAdmit(t, r, req)
	if applied, err := r.ResetQuotas(ctx, tenant, now); err != nil || !applied {
		t.Fatalf("the same reset again: %v, %v; want applied (before)", applied, err)
	}
	check("after the same reset again", 10, 7, 10, 9, 5)

	if _, err := r.ResetQuotas(ctx, tenant, now.AddDate(0, -2, 0)); err != nil {
		t.Fatal(err)
	}
	check("after an older reset", 10, 7, 10, 9, 5)

	later := now.Add(time.Millisecond)
	if _, err := r.ResetQuotas(ctx, tenant, later); err != nil {
		t.Fatal(err)
	}
	check("after a later reset", 0, 7, 0, 9, 5)

	other := newTenant()
	if applied, err := r.ResetQuotas(ctx, other, now); err != nil || applied {
		t.Fatalf("a tenant without state: %v, %v; want not applied", applied, err)
	}
	if n, err := c.Exists(ctx, r.StateKeys(other)...).Result(); err != nil || n != 0 {
		t.Fatalf("a tenant without state: %d keys written (%v), want none", n, err)
	}
}

// TestResetQuotasEmptiesMeterQuotas: a reset empties the meters' counters of
// the change's day and month too, once: usage after it is not emptied by a
// retry.
func TestResetQuotasEmptiesMeterQuotas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	qs := []quota.MeterQuota{{Meter: "search", DailyQuota: i64(50), MonthlyQuota: i64(30), Overage: quota.OverageBlock}}
	req := quota.Request{TenantID: tenant, Meter: "search", Cost: 10, MeterQuotas: qs}
	for range 3 {
		if d := mustAdmit(t, r, req); !d.Allowed {
			t.Fatalf("admission refused: %s", fmtDecision(d))
		}
	}
	if d := mustAdmit(t, r, req); d.Allowed {
		t.Fatalf("past the meter's monthly quota: %s", fmtDecision(d))
	}
	room := func() (day, month int64) {
		t.Helper()
		ls, err := r.PeekMeterQuotas(ctx, tenant, quota.Calendar{}, qs, time.Time{})
		if err != nil || len(ls) != 2 {
			t.Fatalf("peek: %v %+v", err, ls)
		}
		return ls[0].Remaining, ls[1].Remaining
	}
	if applied, err := r.ResetQuotas(ctx, tenant, now); err != nil || !applied {
		t.Fatalf("reset: %v, %v", applied, err)
	}
	if d, m := room(); d != 50 || m != 30 {
		t.Fatalf("after the reset: search.daily %d, search.monthly %d left; want 50 and 30", d, m)
	}
	mustAdmit(t, r, req)
	if _, err := r.ResetQuotas(ctx, tenant, now); err != nil {
		t.Fatal(err)
	}
	if d, m := room(); d != 40 || m != 20 {
		t.Fatalf("after the same reset again: %d and %d left; want 40 and 20 (applied once)", d, m)
	}
}
