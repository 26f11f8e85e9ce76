package usage

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestReaderAddsRecordedAndPendingUsage: a report and the month totals add
// what the flush recorded to what is still pending, per day and per meter
// (the policies' shadow refusals and degraded requests too), and show the
// limits as they stand without consuming anything.
func TestReaderAddsRecordedAndPendingUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	rdb := testenv.Redis(t)
	rl := quotaredis.New(rdb, testenv.Prefix(t, rdb))
	store := catalogdb.NewStore(db)
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
	// one token each, refilled one per 1000 s: empty for the test
	shadow := mustPolicy(t, quota.Policy{Name: "shadow-one", Algorithm: quota.AlgTokenBucket,
		Capacity: quota.Ptr(int64(1)), RefillPerSec: quota.Ptr(0.001), OnRefuse: quota.RefuseShadow})
	degrade := mustPolicy(t, quota.Policy{Name: "degrade-one", Algorithm: quota.AlgTokenBucket,
		Capacity: quota.Ptr(int64(1)), RefillPerSec: quota.Ptr(0.001), OnRefuse: quota.RefuseDegrade,
		Fallback: &quota.Fallback{Status: 200, ContentType: "text/plain", Body: "later"}})
	policed := func(meter string, wantAllowed bool) {
		t.Helper()
		d, err := rl.Admit(ctx, quota.Request{TenantID: tenant.ID, Meter: meter, Cost: 1, Limits: limits,
			RequestID: "req-" + testenv.RandomHex(4),
			Policies:  []quota.PolicyCall{{Policy: &shadow, Value: tenant.ID, Limit: 1}, {Policy: &degrade, Value: tenant.ID, Limit: 1}}})
		if err != nil || d.Allowed != wantAllowed || (!wantAllowed && d.Fallback == nil) {
			t.Fatalf("policed %s: %+v, %v; want allowed %t (else the fallback)", meter, d, err, wantAllowed)
		}
		if err := rl.ReportActive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	admit("search", 3)
	admit("export", 5)
	policed("search", true)  // both policies admit: 1 unit
	policed("search", false) // shadow refused, degraded
	rec := billing.NewReconciler(db, rl, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := rec.Flush(ctx); err != nil { // 9 units, 1 shadow refusal, 1 degraded recorded
		t.Fatal(err)
	}
	admit("search", 2)       // pending
	admit("search", 4)       // pending
	policed("export", false) // pending: shadow refused, degraded

	r := NewReader(rl, billing.NewLedger(db), time.Now)
	p := catalog.Principal{Tenant: tenant, Tier: quota.Tier{Slug: "free"}, Limits: limits}
	for range 2 { // reading consumes nothing
		u, err := r.For(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if m := u.Month(); m.Units != 15 || m.Requests != 5 || m.Rejected != 0 {
			t.Fatalf("month: got %+v, want 15 units in 5 requests, none refused", m)
		}
		want := map[string]Meter{
			"export": {Meter: "export", Units: 5, Requests: 1, ShadowRefused: 1, Degraded: 1},
			"search": {Meter: "search", Units: 10, Requests: 4, ShadowRefused: 1, Degraded: 1},
		}
		if len(u.Meters) != len(want) {
			t.Fatalf("meters: got %+v, want %v", u.Meters, want)
		}
		for _, m := range u.Meters {
			if m != want[m.Meter] {
				t.Errorf("meter %s: got %+v, want %+v", m.Meter, m, want[m.Meter])
			}
		}
		var day Day
		for _, d := range u.Daily {
			day.Units, day.ShadowRefused, day.Degraded = day.Units+d.Units, day.ShadowRefused+d.ShadowRefused, day.Degraded+d.Degraded
		}
		if day.Units != 15 || day.ShadowRefused != 2 || day.Degraded != 2 {
			t.Errorf("daily rows %+v: want 15 units, 2 shadow refusals, 2 degraded in all", u.Daily)
		}
		if l, ok := u.Limit(quota.LimitDaily); !ok || l.Remaining != 1000-15 {
			t.Fatalf("daily limit: got %+v (%t), want %d remaining", l, ok, 1000-15)
		}
		if u.Policies == nil || len(u.Policies) != 0 {
			t.Errorf("policies: got %#v, want an empty list (For leaves them to its caller)", u.Policies)
		}
		if ms := u.MonthStart(); !ms.Equal(quota.MonthStart(ms)) || u.Daily[0].Date < ms.Format(time.DateOnly) {
			t.Errorf("month start %v, daily %+v: want the start of the month of the days", ms, u.Daily)
		}
	}
	totals, err := r.MonthTotals(ctx, []string{tenant.ID, other.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := totals[tenant.ID]; got.Units != 15 || got.Requests != 5 {
		t.Errorf("month totals: got %+v, want 15 units in 5 requests", got)
	}
	if got, ok := totals[other.ID]; !ok || got.Units != 0 {
		t.Errorf("month totals of a tenant without usage: got %+v (%t), want zero, present", got, ok)
	}
}

// mustPolicy returns p with its defaults, failing the test when it is not
// valid.
func mustPolicy(tb testing.TB, p quota.Policy) quota.Policy {
	tb.Helper()
	p.Defaults()
	if err := p.Validate(); err != nil {
		tb.Fatalf("policy %s: %v", p.Name, err)
	}
	return p
}

// TestReaderListsTheTierPoliciesWithTheirState: Policies lists the
// policies of the tenant's tier in their order: tenant and global ones with
// their room as it stands (a global one's shared with every tenant), read
// without consuming anything, however many there are; those with one
// instance per request or per node with their configured limit and a null
// remaining and reset.
func TestReaderListsTheTierPoliciesWithTheirState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	rl := quotaredis.New(rdb, testenv.Prefix(t, rdb))
	r := NewReader(rl, billing.NewLedger(testenv.Postgres(t)), time.Now)
	tenant, other := quota.Tenant{ID: "a1b2c3d4-0000-4000-8000-" + testenv.RandomHex(6)}, "a1b2c3d4-0000-4000-8000-"+testenv.RandomHex(6)
	p := catalog.Principal{Tenant: tenant, Tier: quota.Tier{Slug: "pro"}}

	bucket := func(name string, capacity int64, scope quota.Scope, tiers ...string) quota.Policy {
		return mustPolicy(t, quota.Policy{Name: name, Algorithm: quota.AlgTokenBucket, Capacity: quota.Ptr(capacity),
			RefillPerSec: quota.Ptr(0.001), Scope: scope, Match: quota.PolicyMatch{Tiers: tiers}})
	}
	own := bucket("own", 5, quota.ScopeTenant, "free", "pro")
	shared := bucket("shared", 4, quota.ScopeGlobal)
	list := []quota.Policy{
		own,
		bucket("enterprise-only", 50, quota.ScopeTenant, "enterprise"),
		shared,
		bucket("per-key", 7, quota.ScopeKey),
		mustPolicy(t, quota.Policy{Name: "per-ip", Algorithm: quota.AlgGCRA, Rate: quota.Ptr(2.0), Burst: quota.Ptr(int64(3)),
			Scope: quota.ScopeIP}),
		mustPolicy(t, quota.Policy{Name: "per-region", Algorithm: quota.AlgTokenBucket, Capacity: quota.Ptr(int64(9)),
			RefillPerSec: quota.Ptr(1.0), Scope: quota.ScopeParam, Param: "header:X-Region", Exceptions: map[string]int64{"eu": 2}}),
		bucket("on-each-node", 11, quota.ScopeNode),
		mustPolicy(t, quota.Policy{Name: "shed", Algorithm: quota.AlgAdaptive, MaxConcurrency: quota.Ptr(int64(20)),
			TargetLatencyMS: quota.Ptr(int64(100)), Scope: quota.ScopeNode}),
		mustPolicy(t, quota.Policy{Name: "warm", Algorithm: quota.AlgWarmUp, Rate: quota.Ptr(5.0),
			WarmupSeconds: quota.Ptr(int64(10)), Scope: quota.ScopeKey}),
	}
	// more tenant policies than one request may carry
	for i := range quota.MaxPoliciesPerRequest + 1 {
		list = append(list, bucket(fmt.Sprintf("bulk-%d", i), int64(100+i), quota.ScopeTenant))
	}

	// The tenant used 2 of its own bucket; another tenant 1 of the shared one.
	use := func(tenantID string, pol *quota.Policy, value string) {
		t.Helper()
		limit, _ := pol.LimitFor(value)
		d, err := rl.Admit(ctx, quota.Request{TenantID: tenantID, Meter: "demo", Cost: 1, RequestID: "req-" + testenv.RandomHex(4),
			Policies: []quota.PolicyCall{{Policy: pol, Value: value, Limit: limit}}})
		if err != nil || !d.Allowed {
			t.Fatalf("admit under %s: %+v, %v; want allowed", pol.Name, d, err)
		}
	}
	use(tenant.ID, &own, tenant.ID)
	use(tenant.ID, &own, tenant.ID)
	use(other, &shared, "")

	ptr := func(n int64) *int64 { return &n }
	want := []Policy{
		{Name: "own", Algorithm: quota.AlgTokenBucket, Limit: 5, Remaining: ptr(3)},
		{Name: "shared", Algorithm: quota.AlgTokenBucket, Limit: 4, Remaining: ptr(3)},
		{Name: "per-key", Algorithm: quota.AlgTokenBucket, Limit: 7},
		{Name: "per-ip", Algorithm: quota.AlgGCRA, Limit: 3},
		{Name: "per-region", Algorithm: quota.AlgTokenBucket, Limit: 9},
		{Name: "on-each-node", Algorithm: quota.AlgTokenBucket, Limit: 11},
		{Name: "shed", Algorithm: quota.AlgAdaptive, Limit: 20},
		{Name: "warm", Algorithm: quota.AlgWarmUp, Limit: 5},
	}
	for i := range quota.MaxPoliciesPerRequest + 1 {
		want = append(want, Policy{Name: fmt.Sprintf("bulk-%d", i), Algorithm: quota.AlgTokenBucket, Limit: int64(100 + i),
			Remaining: ptr(int64(100 + i))})
	}
	before := time.Now().Truncate(time.Second)
	for range 2 { // reading consumes nothing
		got, err := r.Policies(ctx, p, TierPolicies(list, p.Tier.Slug))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("got %d policies %+v, want %d", len(got), got, len(want))
		}
		for i, g := range got {
			w := want[i]
			if g.Name != w.Name || g.Algorithm != w.Algorithm || g.Limit != w.Limit || (g.Remaining == nil) != (w.Remaining == nil) ||
				(w.Remaining != nil && *g.Remaining != *w.Remaining) || (g.Reset == nil) != (w.Remaining == nil) {
				t.Errorf("policy %d: got %s, want %s (reset set when remaining is)", i, show(g), show(w))
				continue
			}
			if g.Reset != nil {
				if at, err := time.Parse(time.RFC3339, *g.Reset); err != nil || at.Before(before) {
					t.Errorf("policy %s: reset %q, want an RFC 3339 time from now on", g.Name, *g.Reset)
				}
			}
		}
		b, _ := json.Marshal(got[2])
		if !strings.Contains(string(b), `"remaining":null,"reset":null`) {
			t.Errorf("a per-key policy as JSON: %s, want remaining and reset null", b)
		}
	}
	if got, err := r.Policies(ctx, p, nil); err != nil || got == nil || len(got) != 0 {
		t.Errorf("no policies: got %#v, %v; want an empty list", got, err)
	}
}

func show(p Policy) string {
	s := fmt.Sprintf("{%s %s limit %d", p.Name, p.Algorithm, p.Limit)
	if p.Remaining != nil {
		s += fmt.Sprintf(" remaining %d", *p.Remaining)
	}
	if p.Reset != nil {
		s += " reset " + *p.Reset
	}
	return s + "}"
}

// TestReaderDatesUsageInTheTenantsCalendar: a tenant 14 hours ahead of UTC
// sees its billing period's usage by its local dates: an hour recorded at
// its period's first instant (the day before, in UTC) is on the period's
// first local date, and the period's dates run from there.
func TestReaderDatesUsageInTheTenantsCalendar(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	rdb := testenv.Redis(t)
	rl := quotaredis.New(rdb, testenv.Prefix(t, rdb))
	store := catalogdb.NewStore(db)
	tenant, err := store.CreateTenantWith(ctx, "test", quota.Tenant{Name: "kiri", Tier: "free", TimeZone: "Pacific/Kiritimati"})
	if err != nil {
		t.Fatal(err)
	}
	cal := tenant.Calendar()
	start, end := cal.Period(time.Now())
	if _, err := db.Exec(ctx, `INSERT INTO usage (tenant_id, hour, meter, units, requests) VALUES ($1, $2, 'demo', 6, 2), ($1, $3, 'demo', 100, 1)`,
		tenant.ID, start, start.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	r := NewReader(rl, billing.NewLedger(db), time.Now)
	u, err := r.For(ctx, catalog.Principal{Tenant: tenant, Tier: quota.Tier{Slug: "free"}, Calendar: cal})
	if err != nil {
		t.Fatal(err)
	}
	first := start.In(cal.Zone).Format(time.DateOnly)
	if len(u.Daily) != 1 || u.Daily[0].Date != first || u.Daily[0].Units != 6 {
		t.Fatalf("daily %+v, want only %s with 6 units (the hour before the period is the last one's)", u.Daily, first)
	}
	dates := u.PeriodDates()
	if len(dates) < 28 || dates[0] != first || dates[len(dates)-1] != end.Add(-time.Hour).In(cal.Zone).Format(time.DateOnly) {
		t.Fatalf("period dates %v, want from %s to the period's last local date", dates, first)
	}
	if !strings.HasSuffix(first, "-01") {
		t.Fatalf("anchor 1: the period starts on the 1st, got %s", first)
	}
}
