package ratelimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

func TestParsePending(t *testing.T) {
	rows, err := ParsePending(map[string]string{
		"1795348800|demo|u": "7", "1795348800|demo|r": "3", "1795348800|demo|x": "2",
		"1795345200|report|u": "10", "1795345200|report|r": "1", "1795345200|report|o": "4",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []quota.PendingRow{
		{Hour: time.Unix(1795345200, 0).UTC(), Meter: "report", Units: 10, Requests: 1, Overage: 4},
		{Hour: time.Unix(1795348800, 0).UTC(), Meter: "demo", Units: 7, Requests: 3, Rejected: 2},
	}
	if len(rows) != len(want) {
		t.Fatalf("got %d rows, want %d", len(rows), len(want))
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d = %+v, want %+v", i, rows[i], want[i])
		}
	}
	for _, bad := range []map[string]string{
		{"x|demo|u": "1"}, {"1|demo|z": "1"}, {"1|demo": "1"}, {"1|demo|u": "lots"},
	} {
		if _, err := ParsePending(bad); err == nil {
			t.Errorf("ParsePending(%v) = nil error, want one: billing data is never dropped silently", bad)
		}
	}
}

func TestRefundGivesBackQuotaInThePeriodOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r := New(c, testenv.Prefix(t, c))
	tenant := newTenant()
	limits := quota.Limits{DailyQuota: quota.Ptr(int64(100)), MonthlyQuota: quota.Ptr(int64(1000))}
	now := time.Date(2026, 11, 22, 23, 59, 0, 0, time.UTC)
	d := mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "m", Cost: 30, Limits: limits, Now: now})
	if err := r.Refund(ctx, tenant, "m", 30, 0, d.Now); err != nil {
		t.Fatal(err)
	}
	peek, err := r.Peek(ctx, tenant, limits, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := peek.Limit(quota.LimitDaily); l.Remaining != 100 {
		t.Fatalf("daily remaining after refund = %d, want 100", l.Remaining)
	}
	rows, err := r.Pending(ctx, tenant)
	if err != nil || len(rows) != 1 || rows[0].Units != 0 || rows[0].Requests != 1 {
		t.Fatalf("pending after refund = %+v, %v; want 0 units and the request still counted", rows, err)
	}
	// A refund of a request admitted yesterday leaves today's quota alone.
	d2 := mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "m", Cost: 5, Limits: limits, Now: now.Add(2 * time.Minute)})
	if err := r.Refund(ctx, tenant, "m", 30, 0, now); err != nil {
		t.Fatal(err)
	}
	peek, _ = r.Peek(ctx, tenant, limits, d2.Now.Add(time.Second))
	if l, _ := peek.Limit(quota.LimitDaily); l.Remaining != 95 {
		t.Fatalf("today's daily remaining after yesterday's refund = %d, want 95", l.Remaining)
	}
}

func TestPendingManyMatchesPendingPerTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r := New(c, testenv.Prefix(t, c))
	a, b, idle := newTenant(), newTenant(), newTenant()
	now := time.Date(2026, 11, 22, 10, 30, 0, 0, time.UTC)
	mustAdmit(t, r, quota.Request{TenantID: a, Meter: "m", Cost: 3, Now: now})
	mustAdmit(t, r, quota.Request{TenantID: a, Meter: "n", Cost: 4, Now: now.Add(time.Hour)})
	mustAdmit(t, r, quota.Request{TenantID: b, Meter: "m", Cost: 7, Now: now})

	got, err := r.PendingMany(ctx, []string{a, b, idle})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a, b} {
		want, err := r.Pending(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got[id]) != fmt.Sprint(want) {
			t.Errorf("PendingMany[%s] = %v, want %v (Pending)", id, got[id], want)
		}
	}
	if len(got[a]) != 2 || len(got[b]) != 1 {
		t.Errorf("rows: a %d, b %d; want 2 and 1", len(got[a]), len(got[b]))
	}
	if _, ok := got[idle]; ok {
		t.Errorf("a tenant with nothing pending is in the map: %v", got[idle])
	}
	if _, err := r.PendingMany(ctx, []string{"bad{id}"}); quota.ErrorCode(err) != quota.CodeInvalid {
		t.Errorf("PendingMany with a bad id: %v, want CodeInvalid", err)
	}
}
