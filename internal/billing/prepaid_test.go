package billing

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
)

// payAsYouGo creates a prepaid tier "payg" that includes no units, at a
// cent a unit (and the meter quotas qs), and a tenant on it.
func payAsYouGo(tb testing.TB, store *catalogdb.Store, qs []quota.MeterQuota) (quota.Tier, quota.Tenant) {
	tb.Helper()
	ctx := context.Background()
	tier, err := store.CreateTier(ctx, "test", quota.Tier{Slug: "payg", Name: "Pay as you go", Rank: 4321,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(0))}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
		MeterQuotas: qs, Billing: quota.BillingPrepaid, TopUpURL: "https://example.com/top-up"})
	if err != nil {
		tb.Fatal(err)
	}
	tn, err := store.CreateTenant(ctx, "test", "acme", "payg")
	if err != nil {
		tb.Fatal(err)
	}
	return tier, tn
}

// TestPrepaidInvoicesToTheCent follows a prepaid tenant through two
// billing periods with the worker's cycle on a test clock: its admissions
// draw on its credit at admission (the balance read as the API reads it),
// its invoices bill what they drew and draw the credits that paid it,
// oldest expiring first, each invoice netting to zero, to the cent. A
// credit that expires in the second period pays the first one's invoice,
// and while that invoice waits for its grace the second period may spend
// only what that invoice will leave of the rest.
func TestPrepaidInvoicesToTheCent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	store := catalogdb.NewStore(r.db)
	tier, tn := payAsYouGo(t, store, nil)
	april := time.Date(2031, 4, 1, 0, 0, 0, 0, time.UTC)
	for _, sql := range []string{`UPDATE tenants SET created_at = $2 WHERE id = $1`, `UPDATE tenant_tier_history SET valid_from = $2 WHERE tenant_id = $1`} {
		if _, err := r.db.Exec(ctx, sql, tn.ID, april); err != nil {
			t.Fatal(err)
		}
	}
	may20 := time.Date(2031, 5, 20, 0, 0, 0, 0, time.UTC)
	ledger := NewLedger(r.db)
	for _, c := range []NewCredit{{AmountCents: 30, Reason: "expires May 20", ExpiresAt: &may20}, {AmountCents: 50, Reason: "for good"}} {
		if _, _, err := ledger.CreateCredit(ctx, "test", tn.ID, "", c, april.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	clock := april.Add(time.Hour)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	set := func(t time.Time) { mu.Lock(); clock = t; mu.Unlock() }
	inv := NewInvoicer(r.db, now, time.Hour)
	cycle := NewCycle(NewReconciler(r.db, r.rl, now, quiet), inv)
	step := func() {
		t.Helper()
		if err := cycle.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := cycle.Invoices(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// admit admits up to n units at the clock's time, each with the
	// balance as the API reads it then, and returns how many passed.
	admit := func(n int) int {
		t.Helper()
		got := 0
		for range n {
			at := now()
			pp, err := ledger.Prepaid(ctx, tn.ID, tier, quota.Calendar{}, at)
			if err != nil {
				t.Fatal(err)
			}
			d, err := r.rl.Admit(ctx, quota.Request{TenantID: tn.ID, Meter: "demo", Cost: 1, Now: at, Limits: tier.Limits,
				Overage: tier.Overage, OveragePriceCentsPer1K: tier.OveragePriceCentsPer1K, Prepaid: &pp})
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				if !slices.Equal(d.Violated, []quota.LimitName{quota.LimitCredit}) {
					t.Fatalf("refusal %v, want [credit]", d.Violated)
				}
				break
			}
			got++
		}
		return got
	}
	lines := func(period time.Time) ([]string, string) {
		t.Helper()
		invs, err := ledger.TenantInvoices(ctx, tn.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range invs {
			if in.Period == period.Format("2006-01") {
				var out []string
				for _, l := range in.Lines {
					if l.AmountCents != 0 {
						out = append(out, fmt.Sprintf("%s: %d", l.Description, l.AmountCents))
					}
				}
				return out, fmt.Sprintf("%s %d", in.Status, in.TotalCents)
			}
		}
		t.Fatalf("no invoice of %s in %+v", period.Format("2006-01"), invs)
		return nil, ""
	}

	// April: 60 of the 80 cents (both credits are good at April's end)
	if got := admit(60); got != 60 {
		t.Fatalf("april admitted %d of 60", got)
	}
	step()
	// May, in April's grace: April's invoice will draw the 30 expiring
	// May 20 first, then 30 of the 50; with a cent kept back for its
	// line's rounding, May may spend 19
	may := time.Date(2031, 5, 1, 0, 30, 0, 0, time.UTC)
	set(may)
	step()
	if _, status := lines(april); status != "draft 0" {
		t.Fatalf("april's invoice in its grace: %s", status)
	}
	if got := admit(100); got != 19 {
		t.Fatalf("may, april's invoice a draft: admitted %d, want 19", got)
	}
	// April final: 60 units at a cent, paid by both credits
	set(may.Add(2 * time.Hour))
	step()
	got, status := lines(april)
	want := []string{"Overage: 60 units at $10.00 per 1,000 (Pay as you go plan): 60",
		"Credit: expires May 20: -30", "Credit: for good: -30"}
	if !slices.Equal(got, want) || status != "final 0" {
		t.Fatalf("april's invoice: %q (%s), want %q (final 0)", got, status, want)
	}
	// what April left: 20 of the second credit, 19 of them drawn: one more
	if got := admit(100); got != 1 {
		t.Fatalf("may, april's invoice final: admitted %d more, want 1", got)
	}
	// May final: 20 units, paid by what is left of the credit for good
	set(time.Date(2031, 6, 1, 2, 0, 0, 0, time.UTC))
	step()
	got, status = lines(time.Date(2031, 5, 1, 0, 0, 0, 0, time.UTC))
	want = []string{"Overage: 20 units at $10.00 per 1,000 (Pay as you go plan): 20", "Credit: for good: -20"}
	if !slices.Equal(got, want) || status != "final 0" {
		t.Fatalf("may's invoice: %q (%s), want %q (final 0)", got, status, want)
	}
	page, err := ledger.Credits(ctx, tn.ID, now(), quota.Page{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if page.BalanceCents != 0 {
		t.Fatalf("balance after both invoices: %d cents, want 0", page.BalanceCents)
	}
	// June: nothing left, so the first unit past the quota is refused
	if got := admit(1); got != 0 {
		t.Fatalf("june admitted %d without credit", got)
	}
}

// TestRepairRestoresPrepaidDraws: after Redis lost data, the worker's
// repair gives a prepaid tenant's credit draws back from the ledger (the
// tier's overage and a meter's, at their prices), so the credit already
// spent is not spent again; without it the whole balance would be free.
func TestRepairRestoresPrepaidDraws(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	store := catalogdb.NewStore(r.db)
	tier, tn := payAsYouGo(t, store, []quota.MeterQuota{
		{Meter: "search", MonthlyQuota: quota.Ptr(int64(0)), Overage: quota.OverageBill, OveragePriceCentsPer1K: 3000}})
	rc := r.reconciler()
	if err := rc.Repair(ctx); err != nil { // first start
		t.Fatal(err)
	}
	// a dollar of credit (the balance as the API reads it, with no
	// previous period to wait for)
	admit := func(meter string, n int) int {
		t.Helper()
		got := 0
		for range n {
			pp, err := NewLedger(r.db).Prepaid(ctx, tn.ID, tier, quota.Calendar{}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			pp.BalanceMillicents, pp.PrevID = 100_000, 0
			d, err := r.rl.Admit(ctx, quota.Request{TenantID: tn.ID, Meter: meter, Cost: 1, Limits: tier.Limits,
				Overage: tier.Overage, OveragePriceCentsPer1K: tier.OveragePriceCentsPer1K, MeterQuotas: tier.MeterQuotas, Prepaid: &pp})
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				break
			}
			got++
		}
		return got
	}
	if admit("demo", 40) != 40 || admit("search", 10) != 10 { // 40 + 30 cents
		t.Fatal("admissions refused within the credit")
	}
	r.loseAndRepair(t, rc)
	// 70 of the 100 cents are spent; of the 30 left, a cent is kept back
	// for the rounding of the invoice's second overage line: 9 searches
	// (without the repair, 33)
	if got := admit("search", 100); got != 9 {
		t.Fatalf("after the repair: %d searches at 3 cents on 30 cents left, want 9", got)
	}
}
