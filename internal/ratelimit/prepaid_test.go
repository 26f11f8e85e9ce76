package ratelimit

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// prepaidRequest is a request of a prepaid tenant on a tier that includes
// no units (every unit is paid: 1 cent per unit of demo, 3 of search) with
// balance bal millicents for now's period.
func prepaidRequest(tenant, meter string, now time.Time, bal int64, prev int) quota.Request {
	return quota.Request{TenantID: tenant, Meter: meter, Cost: 1, Now: now,
		Limits: quota.Limits{MonthlyQuota: i64(0)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
		MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(0), Overage: quota.OverageBill, OveragePriceCentsPer1K: 3000}},
		Prepaid:     &quota.Prepaid{BalanceMillicents: bal, PeriodID: quota.Calendar{}.PeriodID(now), PrevID: prev}}
}

// TestPrepaidDrawsDownExactlyUnderConcurrency: 64 clients of their own (as
// many API nodes) spend one prepaid balance at once, on two meters of
// different prices; the credit is drawn down exactly, never past the
// balance, and every refusal is the credit's, for good.
func TestPrepaidDrawsDownExactlyUnderConcurrency(t *testing.T) {
	t.Parallel()
	for name, newClient := range map[string]func(testing.TB) redis.UniversalClient{
		"single": testenv.Redis, "cluster": testenv.Cluster,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const workers, bal = 64, 500_000 // $5.00
			c := newClient(t)
			r0, prefix := mustRunner(t, c)
			tenant := newTenant()
			now := at(t, "2031-05-15T12:00:00Z")
			meter := func(w int) string { return []string{"demo", "search"}[w%2] }
			ok, refused := untilRefused(t, workers, newClient, prefix, func(w int) quota.Request {
				return prepaidRequest(tenant, meter(w), now, bal, 0)
			})
			var demo, search int64
			for w, ds := range ok {
				if meter(w) == "demo" {
					demo += int64(len(ds))
				} else {
					search += int64(len(ds))
				}
			}
			for _, d := range refused {
				if !slices.Equal(d.Violated, []quota.LimitName{quota.LimitCredit}) || d.RetryAfter >= 0 {
					t.Errorf("refusal: %s, want [credit] for good", fmtDecision(d))
				}
			}
			// what is left (less than a search) still buys demo units
			for {
				d := mustAdmit(t, r0, prepaidRequest(tenant, "demo", now, bal, 0))
				if !d.Allowed {
					break
				}
				demo++
			}
			spent := demo*1000 + search*3000
			if spent != bal {
				t.Errorf("admitted %d demo and %d search units: %d millicents, want the balance, %d, exactly", demo, search, spent, bal)
			}
			drawn, err := r0.PrepaidDrawn(context.Background(), tenant, *prepaidRequest(tenant, "demo", now, bal, 0).Prepaid)
			if err != nil {
				t.Fatal(err)
			}
			if drawn != spent {
				t.Errorf("Redis holds %d millicents drawn, the admissions %d", drawn, spent)
			}
			// pending usage bills exactly those units
			rows, err := r0.Pending(context.Background(), tenant)
			if err != nil {
				t.Fatal(err)
			}
			var over, meterOver int64
			for _, row := range rows {
				over += row.Overage
				meterOver += row.MeterOverage
			}
			if over != demo || meterOver != search {
				t.Errorf("pending overage %d (tier) and %d (search), want %d and %d", over, meterOver, demo, search)
			}
		})
	}
}

// TestPrepaidCountsThePreviousPeriodUntilItsInvoiceIsFinal: the draws of
// the period before count against the balance while its invoice is not
// final (PrevID), with a line's rounding kept back, and no more once it
// is (the balance then is what the invoice left); a new period starts its
// own count.
func TestPrepaidCountsThePreviousPeriodUntilItsInvoiceIsFinal(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	april, may := at(t, "2031-04-30T23:59:00Z"), at(t, "2031-05-01T00:01:00Z")
	aprilID := quota.Calendar{}.PeriodID(april)
	admitN := func(tenant string, now time.Time, bal int64, prev int) int {
		n := 0
		for ; n < 100; n++ {
			d := mustAdmit(t, r, prepaidRequest(tenant, "demo", now, bal, prev))
			if !d.Allowed {
				if !slices.Equal(d.Violated, []quota.LimitName{quota.LimitCredit}) {
					t.Fatalf("refusal: %s", fmtDecision(d))
				}
				break
			}
		}
		return n
	}
	for _, tc := range []struct {
		name string
		prev int
		want int
	}{
		// 50 cents of April's and 19 of May's: each invoice's line may
		// round up by a cent, so 999 millicents are kept back
		{"april's invoice a draft", aprilID, 19},
		{"april's invoice final", 0, 70},
	} {
		tenant := newTenant()
		if n := admitN(tenant, april, 50_000, 0); n != 50 {
			t.Fatalf("april: %d units for 50 cents at 1 cent each", n)
		}
		if n := admitN(tenant, may, 70_000, tc.prev); n != tc.want {
			t.Errorf("%s: may admitted %d units on a balance of 70 cents, want %d", tc.name, n, tc.want)
		}
	}
}

// TestPrepaidBalanceOfAnotherPeriod: a balance computed for another
// period than the script's clock is refused with PrepaidStaleError,
// deciding and writing nothing.
func TestPrepaidBalanceOfAnotherPeriod(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, prefix := mustRunner(t, c)
	tenant := newTenant()
	now := at(t, "2031-06-01T00:00:00Z")
	req := prepaidRequest(tenant, "demo", now, 10_000, 0)
	req.Prepaid.PeriodID = quota.Calendar{}.PeriodID(now.Add(-time.Second)) // May's
	_, err := r.Admit(context.Background(), req)
	var stale *quota.PrepaidStaleError
	if !errors.As(err, &stale) || !stale.Now.Equal(now) {
		t.Fatalf("err = %v, want a PrepaidStaleError at %s", err, now)
	}
	if keys := mustKeys(t, c, prefix); len(keys) != 0 {
		t.Errorf("a stale balance wrote %v", keys)
	}
}

// TestPrepaidWithSpendCap: a prepaid tenant's spend cap still holds, in
// millicents, before its balance runs out.
func TestPrepaidWithSpendCap(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	now := at(t, "2031-05-15T12:00:00Z")
	n := 0
	for ; n < 100; n++ {
		req := prepaidRequest(tenant, "demo", now, 100_000, 0)
		req.Limits.MaxOverageCents = i64(7)
		d := mustAdmit(t, r, req)
		if !d.Allowed {
			if !slices.Equal(d.Violated, []quota.LimitName{quota.LimitSpendCap}) {
				t.Fatalf("refusal: %s, want the spend cap's", fmtDecision(d))
			}
			break
		}
	}
	if n != 7 {
		t.Errorf("admitted %d units at 1 cent under a 7 cent cap", n)
	}
}

// TestPrepaidRefundAndSettle: a refund gives a prepaid request's overage
// back to the credit draws, a settlement charges or gives back the
// difference's overage (the tier's at its price, the meter's at its own),
// each once: a repeated settle changes nothing.
func TestPrepaidRefundAndSettle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	now := time.Now()
	req := func(meter string, cost int64) quota.Request {
		q := prepaidRequest(tenant, meter, now, 1_000_000, 0)
		q.Now, q.Cost = time.Time{}, cost // Redis's clock: settle and refund use it
		return q
	}
	drawn := func() int64 {
		t.Helper()
		n, err := r.PrepaidDrawn(ctx, tenant, *req("demo", 1).Prepaid)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var ds []quota.Decision
	for range 5 {
		ds = append(ds, mustAdmit(t, r, req("demo", 1)))
	}
	if got := drawn(); got != 5000 {
		t.Fatalf("5 units at a cent: %d millicents drawn", got)
	}
	if err := r.RefundRequest(ctx, req("demo", 1), ds[0]); err != nil {
		t.Fatal(err)
	}
	if got := drawn(); got != 4000 {
		t.Fatalf("after a refund: %d millicents drawn, want 4000", got)
	}
	// a search admitted at 1 unit (3 cents), settled to 4: 9 cents more
	d := mustAdmit(t, r, req("search", 1))
	if err := r.Reserve(ctx, "req-a", req("search", 1), d); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := r.Settle(ctx, tenant, "req-a", 4); err != nil {
			t.Fatal(err)
		}
	}
	if got := drawn(); got != 4000+12000 {
		t.Fatalf("after settling a search to 4 units: %d millicents drawn, want 16000", got)
	}
	// a demo unit settled to 0: its cent back
	d = mustAdmit(t, r, req("demo", 1))
	if err := r.Reserve(ctx, "req-b", req("demo", 1), d); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Settle(ctx, tenant, "req-b", 0); err != nil {
		t.Fatal(err)
	}
	if got := drawn(); got != 16000 {
		t.Fatalf("after settling a demo unit to 0: %d millicents drawn, want 16000", got)
	}
}

// TestPrepaidAfterAMoveMidPeriod: a tenant moved onto a prepaid tier in
// the middle of a period draws, with its first prepaid unit, the tier's
// overage it was admitted before the move (its invoice will bill it).
func TestPrepaidAfterAMoveMidPeriod(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	now := at(t, "2031-05-15T12:00:00Z")
	postpaid := prepaidRequest(tenant, "demo", now, 0, 0)
	postpaid.Prepaid = nil
	for range 5 {
		if d := mustAdmit(t, r, postpaid); !d.Allowed || d.OverageUnits != 1 {
			t.Fatalf("postpaid: %s", fmtDecision(d))
		}
	}
	n := 0
	for ; n < 100; n++ {
		if d := mustAdmit(t, r, prepaidRequest(tenant, "demo", now, 8_000, 0)); !d.Allowed {
			break
		}
	}
	if n != 3 {
		t.Errorf("prepaid with 8 cents after 5 cents of postpaid overage: admitted %d, want 3", n)
	}
}
