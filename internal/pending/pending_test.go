package pending_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/pending"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/quotaredis/quotaredistest"
	"github.com/tollgate/tollgate/internal/testenv"
)

func TestParsePending(t *testing.T) {
	rows, err := pending.ParsePending(map[string]string{
		"1795348800|demo|u": "7", "1795348800|demo|r": "3", "1795348800|demo|x": "2",
		"1795348800|demo|s": "4", "1795348800|demo|d": "1",
		"1795345200|report|u": "10", "1795345200|report|r": "1", "1795345200|report|o": "4",
		"1795345200|search|d": "6",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []quota.PendingRow{
		{Hour: time.Unix(1795345200, 0).UTC(), Meter: "report", Units: 10, Requests: 1, Overage: 4},
		{Hour: time.Unix(1795345200, 0).UTC(), Meter: "search", Degraded: 6},
		{Hour: time.Unix(1795348800, 0).UTC(), Meter: "demo", Units: 7, Requests: 3, Rejected: 2, ShadowRefused: 4, Degraded: 1},
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
		if _, err := pending.ParsePending(bad); err == nil {
			t.Errorf("ParsePending(%v) = nil error, want one: billing data is never dropped silently", bad)
		}
	}
}

// TestPendingCountsShadowRefusalsAndDegraded: the admission script's
// policy counters ("|s" a shadow policy would have refused, admitted or
// not; "|d" answered with a degrade policy's fallback) reach Pending beside
// the requests and refusals, and nothing else counts them.
func TestPendingCountsShadowRefusalsAndDegraded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r := quotaredistest.OnPrefix(t, c, quotaredis.New)
	tenant := quotaredistest.NewTenant()
	// token buckets of 1 and 2 that refill one per 1000 s: empty for the test
	shadow := quota.Policy{Name: "shadow-one", Algorithm: quota.AlgTokenBucket, Capacity: quota.Ptr(int64(1)),
		RefillPerSec: quota.Ptr(0.001), OnRefuse: quota.RefuseShadow}
	degrade := quota.Policy{Name: "degrade-two", Algorithm: quota.AlgTokenBucket, Capacity: quota.Ptr(int64(2)),
		RefillPerSec: quota.Ptr(0.001), OnRefuse: quota.RefuseDegrade,
		Fallback: &quota.Fallback{Status: 200, ContentType: "text/plain", Body: "later"}}
	for _, p := range []*quota.Policy{&shadow, &degrade} {
		p.Defaults()
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	calls := []quota.PolicyCall{{Policy: &shadow, Value: tenant, Limit: 1}, {Policy: &degrade, Value: tenant, Limit: 2}}
	now := time.Date(2026, 11, 22, 10, 30, 0, 0, time.UTC)
	limits := quota.Limits{DailyQuota: quota.Ptr(int64(3))}
	for i, step := range []struct {
		cost int64
		want string // admitted, degraded, refused
	}{
		{1, "admitted"}, // both policies admit
		{1, "admitted"}, // shadow refuses: counted, admitted
		{1, "degraded"}, // degrade refuses, the tier admits: the fallback
		{2, "refused"},  // the daily quota refuses first: a refusal, not degraded
	} {
		d := quotaredistest.MustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "demo", Cost: step.cost, Limits: limits,
			Policies: calls, RequestID: fmt.Sprintf("req-%d", i), Now: now.Add(time.Duration(i) * time.Second)})
		got := "refused"
		switch {
		case d.Allowed:
			got = "admitted"
		case d.Fallback != nil:
			got = "degraded"
		}
		if got != step.want {
			t.Fatalf("request %d: %s (%+v), want %s", i+1, got, d, step.want)
		}
	}
	rows, err := r.Pending(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	want := quota.PendingRow{Hour: now.Truncate(time.Hour), Meter: "demo", Units: 2, Requests: 2, Rejected: 1,
		ShadowRefused: 3, Degraded: 1}
	if len(rows) != 1 || rows[0] != want {
		t.Fatalf("pending: got %+v, want [%+v]", rows, want)
	}
	many, err := r.PendingMany(ctx, []string{tenant})
	if err != nil || len(many[tenant]) != 1 || many[tenant][0] != want {
		t.Fatalf("PendingMany: got %+v, %v; want [%+v]", many[tenant], err, want)
	}
	batches, err := r.Claim(ctx, []string{tenant}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(batches) != 1 || batches[0].Err != nil || len(batches[0].Rows) != 1 || batches[0].Rows[0] != want {
		t.Fatalf("claimed: got %+v, want one batch of [%+v]", batches, want)
	}
}

func TestRefundGivesBackQuotaInThePeriodOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r := quotaredis.New(c, testenv.Prefix(t, c))
	tenant := quotaredistest.NewTenant()
	limits := quota.Limits{DailyQuota: quota.Ptr(int64(100)), MonthlyQuota: quota.Ptr(int64(1000))}
	now := time.Date(2026, 11, 22, 23, 59, 0, 0, time.UTC)
	d := quotaredistest.MustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "m", Cost: 30, Limits: limits, Now: now})
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
	d2 := quotaredistest.MustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "m", Cost: 5, Limits: limits, Now: now.Add(2 * time.Minute)})
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
	r := quotaredis.New(c, testenv.Prefix(t, c))
	a, b, idle := quotaredistest.NewTenant(), quotaredistest.NewTenant(), quotaredistest.NewTenant()
	now := time.Date(2026, 11, 22, 10, 30, 0, 0, time.UTC)
	quotaredistest.MustAdmit(t, r, quota.Request{TenantID: a, Meter: "m", Cost: 3, Now: now})
	quotaredistest.MustAdmit(t, r, quota.Request{TenantID: a, Meter: "n", Cost: 4, Now: now.Add(time.Hour)})
	quotaredistest.MustAdmit(t, r, quota.Request{TenantID: b, Meter: "m", Cost: 7, Now: now})

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
