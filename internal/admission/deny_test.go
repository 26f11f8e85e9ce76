package admission

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// withMeterQuota is a tenant with a tier-wide daily quota of tierDaily and
// a daily quota of meterDaily on meter "demo" (nil: none).
func withMeterQuota(tierDaily int64, meterDaily int64) quota.Request {
	return quota.Request{TenantID: "tn-" + testenv.RandomHex(6), Meter: "demo", Cost: 1, Overage: quota.OverageBlock,
		Limits:      quota.Limits{DailyQuota: quota.Ptr(tierDaily)},
		MeterQuotas: []quota.MeterQuota{{Meter: "demo", DailyQuota: quota.Ptr(meterDaily), Overage: quota.OverageBlock}}}
}

// TestDenyCacheHoldsOnlyForTheLimitThatRefused: a refusal by one meter's
// quota is remembered for that meter only; another meter of the tenant is
// decided by Redis (and admitted), while the refused meter's later
// requests are still answered in-process.
func TestDenyCacheHoldsOnlyForTheLimitThatRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, inner, _ := mustLiveGate(t)
	echo := withMeterQuota(1000, 1)
	if d, err := g.Admit(ctx, echo); err != nil || !d.Allowed {
		t.Fatalf("first echo: %+v, %v; want admitted", d, err)
	}
	if d, err := g.Admit(ctx, echo); err != nil || d.Allowed || len(d.Violated) != 1 || d.Violated[0] != "demo.daily" {
		t.Fatalf("second echo: %+v, %v; want refused by demo.daily", d, err)
	}
	report := echo
	report.Meter, report.Cost = "report", 10
	d, err := g.Admit(ctx, report)
	if err != nil || !d.Allowed {
		t.Fatalf("report after demo.daily refused echo: allowed %t violated %v (%v); want admitted: demo.daily does not limit report",
			d.Allowed, d.Violated, err)
	}
	calls := inner.calls.Load()
	if d, err := g.Admit(ctx, echo); err != nil || d.Allowed || d.Violated[0] != "demo.daily" {
		t.Fatalf("third echo: %+v, %v; want refused by demo.daily", d, err)
	}
	if got := inner.calls.Load() - calls; got != 0 {
		t.Fatalf("echo refused by demo.daily again made %d Redis calls, want 0 (the deny cache answers)", got)
	}
}

// TestDenyCacheTenantWideRefusalBlocksEveryMeter: a tier-wide limit's
// refusal holds for every meter, and the answer another meter gets from
// the cache carries no item of the refused request's meter quota.
func TestDenyCacheTenantWideRefusalBlocksEveryMeter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, inner, _ := mustLiveGate(t)
	echo := withMeterQuota(1, 5)
	if d, err := g.Admit(ctx, echo); err != nil || !d.Allowed {
		t.Fatalf("first echo: %+v, %v; want admitted", d, err)
	}
	if d, err := g.Admit(ctx, echo); err != nil || d.Allowed || d.Violated[0] != quota.LimitDaily {
		t.Fatalf("second echo: %+v, %v; want refused by daily", d, err)
	}
	calls := inner.calls.Load()
	other := echo
	other.Meter = "other"
	d, err := g.Admit(ctx, other)
	if err != nil || d.Allowed || d.Violated[0] != quota.LimitDaily {
		t.Fatalf("another meter: %+v, %v; want refused by daily", d, err)
	}
	if got := inner.calls.Load() - calls; got != 0 {
		t.Fatalf("another meter made %d Redis calls, want 0 (daily holds for every meter)", got)
	}
	for _, l := range d.Limits {
		if l.Name == "demo.daily" || l.Name == "demo.monthly" {
			t.Fatalf("meter other answered with %s of meter demo: %+v", l.Name, d.Limits)
		}
	}
	if _, ok := d.Limit(quota.LimitDaily); !ok {
		t.Fatalf("meter other answered without the daily item: %+v", d.Limits)
	}
}

// TestDenyCacheSmallerCostAsksRedis: a quota refusal of one cost does not
// refuse a cheaper request that fits.
func TestDenyCacheSmallerCostAsksRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, _, _ := mustLiveGate(t)
	req := dailyOf(5)
	req.Cost = 3
	if d, err := g.Admit(ctx, req); err != nil || !d.Allowed {
		t.Fatalf("first: %+v, %v", d, err)
	}
	if d, err := g.Admit(ctx, req); err != nil || d.Allowed {
		t.Fatalf("second of cost 3 (6 > 5): %+v, %v; want refused", d, err)
	}
	req.Cost = 2
	if d, err := g.Admit(ctx, req); err != nil || !d.Allowed {
		t.Fatalf("cost 2 (5 of 5): %+v, %v; want admitted", d, err)
	}
}

// TestDenyCacheSpendCapWithBilledMeterQuotasIsPerMeter: with meter quotas
// that bill, a spend cap refusal depends on the meter's price and overage:
// another meter, with no overage of its own, is admitted.
func TestDenyCacheSpendCapWithBilledMeterQuotasIsPerMeter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, _, _ := mustLiveGate(t)
	req := quota.Request{TenantID: "tn-" + testenv.RandomHex(6), Meter: "demo", Cost: 1, Overage: quota.OverageBill,
		OveragePriceCentsPer1K: 1000, Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(1000)), MaxOverageCents: quota.Ptr(int64(1))},
		MeterQuotas: []quota.MeterQuota{{Meter: "demo", MonthlyQuota: quota.Ptr(int64(0)), Overage: quota.OverageBill,
			OveragePriceCentsPer1K: 1000}}}
	if d, err := g.Admit(ctx, req); err != nil || !d.Allowed {
		t.Fatalf("first demo (1 cent of meter overage): %+v, %v; want admitted", d, err)
	}
	if d, err := g.Admit(ctx, req); err != nil || d.Allowed || d.Violated[0] != quota.LimitSpendCap {
		t.Fatalf("second demo: %+v, %v; want refused by the spend cap", d, err)
	}
	other := req
	other.Meter = "other"
	if d, err := g.Admit(ctx, other); err != nil || !d.Allowed {
		t.Fatalf("meter other, within the tier's monthly quota: allowed %t violated %v (%v); want admitted", d.Allowed, d.Violated, err)
	}
}

// TestDenyCacheAndDryRuns: a dry run (/v1/check) of another meter is not
// refused by a meter quota's refusal; one of the refused meter is, from
// the cache, and counts no refusal.
func TestDenyCacheAndDryRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, inner, _ := mustLiveGate(t)
	echo := withMeterQuota(1000, 1)
	if _, err := g.Admit(ctx, echo); err != nil {
		t.Fatal(err)
	}
	if d, _ := g.Admit(ctx, echo); d.Allowed {
		t.Fatal("second echo admitted")
	}
	dry := echo
	dry.DryRun, dry.Meter = true, "report"
	if d, err := g.Admit(ctx, dry); err != nil || !d.Allowed {
		t.Fatalf("dry run of meter report: allowed %t violated %v (%v); want allowed", d.Allowed, d.Violated, err)
	}
	calls := inner.calls.Load()
	dry.Meter = "demo"
	if d, err := g.Admit(ctx, dry); err != nil || d.Allowed || d.Violated[0] != "demo.daily" {
		t.Fatalf("dry run of meter demo: %+v, %v; want refused by demo.daily", d, err)
	}
	if got := inner.calls.Load() - calls; got != 0 {
		t.Fatalf("dry run of the refused meter made %d Redis calls, want 0", got)
	}
	if err := g.FlushRefusals(ctx); err != nil {
		t.Fatal(err)
	}
	if got := pendingRefused(t, inner, echo.TenantID); got != 1 {
		t.Fatalf("pending refusals %d, want 1 (dry runs count none)", got)
	}
}

// TestPolicyRefusalIsNotRemembered: a Redis policy's refusal (one route's,
// one key's) refuses neither another route of the tenant nor another key.
func TestPolicyRefusalIsNotRemembered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, _, _ := mustLiveGate(t)
	tenant := "tn-" + testenv.RandomHex(6)
	pol := &quota.Policy{Name: "per-key", Algorithm: quota.AlgFixedWindow, Scope: quota.ScopeKey,
		Limit: quota.Ptr(int64(1)), WindowSeconds: quota.Ptr(int64(3600))}
	pol.Defaults()
	if err := pol.Validate(); err != nil {
		t.Fatal(err)
	}
	call := func(n int, key string, with bool) quota.Decision {
		t.Helper()
		req := withPolicies(tenant, 100, n)
		if with {
			req.Policies = []quota.PolicyCall{{Policy: pol, Limit: *pol.Limit, Value: key}}
		}
		d, err := g.Admit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := call(0, "k1", true); !d.Allowed {
		t.Fatalf("first of key k1: %+v", d)
	}
	if d := call(1, "k1", true); d.Allowed || d.Violated[0] != "per-key" {
		t.Fatalf("second of key k1: %+v, want refused by per-key", d)
	}
	if d := call(2, "k2", true); !d.Allowed {
		t.Fatalf("key k2 after k1's refusal: violated %v, want admitted", d.Violated)
	}
	if d := call(3, "", false); !d.Allowed {
		t.Fatalf("a route without the policy after its refusal: violated %v, want admitted", d.Violated)
	}
}

// BenchmarkDenyCacheHit measures a refusal answered by the deny cache (the
// refused row of make bench, without HTTP): it must not allocate.
//
//	go test -run '^$' -bench BenchmarkDenyCacheHit -benchmem ./internal/admission
func BenchmarkDenyCacheHit(b *testing.B) {
	ctx := context.Background()
	g, _, _ := mustLiveGate(b)
	for _, meterDaily := range []int64{1000, 1} { // refused by the tier's daily quota, by demo.daily
		req := withMeterQuota(1, meterDaily)
		if meterDaily == 1 {
			req.Limits.DailyQuota = quota.Ptr(int64(1000))
		}
		name := map[int64]string{1000: "tier", 1: "meter"}[meterDaily]
		b.Run(name, func(b *testing.B) {
			if _, err := g.Admit(ctx, req); err != nil {
				b.Fatal(err)
			}
			if d, _ := g.Admit(ctx, req); d.Allowed {
				b.Fatal("not refused")
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if d, _ := g.Admit(ctx, req); d.Allowed {
					b.Fatal("admitted")
				}
			}
		})
	}
}
