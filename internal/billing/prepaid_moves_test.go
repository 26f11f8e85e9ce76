package billing

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
)

// prepaidWorld follows one tenant of a test's own database through billing
// periods on a test clock: plan moves between tiers (the tier history the
// invoices read), credits, admissions with the balance read as the API
// reads it at each one, and the worker's cycle (flush, then invoices).
type prepaidWorld struct {
	tb     testing.TB
	r      *rig
	store  *catalogdb.Store
	ledger *Ledger
	cycle  *Cycle
	tenant string
	tiers  map[string]quota.Tier
	cal    quota.Calendar
	clock  *invClock
	tier   string // the tenant's tier now
}

// newPrepaidWorld creates tiers and a tenant on the first one, created at
// start (the clock's time), finalizing a period an hour after its end.
func newPrepaidWorld(tb testing.TB, start time.Time, tiers ...quota.Tier) *prepaidWorld {
	tb.Helper()
	ctx := context.Background()
	r := mustRig(tb, nil)
	w := &prepaidWorld{tb: tb, r: r, store: catalogdb.NewStore(r.db), ledger: NewLedger(r.db), tiers: map[string]quota.Tier{}, clock: &invClock{t: start}}
	for _, t := range tiers {
		t, err := w.store.CreateTier(ctx, "test", t)
		if err != nil {
			tb.Fatal(err)
		}
		w.tiers[t.Slug] = t
	}
	w.tier = tiers[0].Slug
	w.tenant = invTenant(tb, r.db, w.tier, start)
	w.cycle = NewCycle(NewReconciler(r.db, r.rl, w.now, quiet), NewInvoicer(r.db, w.now, time.Hour))
	return w
}

func (w *prepaidWorld) now() time.Time  { return w.clock.Now() }
func (w *prepaidWorld) set(t time.Time) { w.clock.Set(t) }

// move puts the tenant on tier from now on, as a plan change at once does.
func (w *prepaidWorld) move(tier string) {
	w.tb.Helper()
	at := w.now()
	invExec(w.tb, w.r.db, `UPDATE tenant_tier_history SET valid_to = $2 WHERE tenant_id = $1 AND valid_to IS NULL`, w.tenant, at)
	invExec(w.tb, w.r.db, `INSERT INTO tenant_tier_history (tenant_id, tier, valid_from) VALUES ($1, $2, $3)`, w.tenant, tier, at)
	invExec(w.tb, w.r.db, `UPDATE tenants SET tier = $2 WHERE id = $1`, w.tenant, tier)
	w.tier = tier
}

// credit grants cents of credit now, expiring at expires (nil: never).
func (w *prepaidWorld) credit(cents int64, expires *time.Time) {
	w.tb.Helper()
	if _, _, err := w.ledger.CreateCredit(context.Background(), "test", w.tenant, "", NewCredit{AmountCents: cents, Reason: "top-up", ExpiresAt: expires}, w.now()); err != nil {
		w.tb.Fatal(err)
	}
}

// step runs the worker's cycle once at the clock's time.
func (w *prepaidWorld) step() {
	w.tb.Helper()
	ctx := context.Background()
	if err := w.cycle.Flush(ctx); err != nil {
		w.tb.Fatal(err)
	}
	if err := w.cycle.Invoices(ctx); err != nil {
		w.tb.Fatal(err)
	}
}

// balance is the prepaid balance the API reads for an admission at at.
func (w *prepaidWorld) balance(at time.Time) quota.Prepaid {
	w.tb.Helper()
	pp, err := w.ledger.Prepaid(context.Background(), w.tenant, w.tiers[w.tier], w.cal, at)
	if err != nil {
		w.tb.Fatal(err)
	}
	return pp
}

// admit admits up to n requests of one unit of meter at the clock's time,
// each with the balance read then when the tier is prepaid, and returns
// how many passed before the first refusal.
func (w *prepaidWorld) admit(meter string, n int) int {
	w.tb.Helper()
	got, _ := w.admitDrawing(meter, n)
	return got
}

// admitDrawing is admit, and says whether an admission drew credit (what
// Redis counts grew).
func (w *prepaidWorld) admitDrawing(meter string, n int) (got int, drew bool) {
	w.tb.Helper()
	ctx := context.Background()
	tier := w.tiers[w.tier]
	for range n {
		at := w.now()
		req := quota.Request{TenantID: w.tenant, Meter: meter, Cost: 1, Now: at, Limits: tier.Limits, Overage: tier.Overage,
			OveragePriceCentsPer1K: tier.OveragePriceCentsPer1K, MeterQuotas: tier.MeterQuotas, Calendar: w.cal}
		var before int64
		if tier.IsPrepaid() {
			pp := w.balance(at)
			req.Prepaid = &pp
			var err error
			if before, err = w.r.rl.PrepaidDrawn(ctx, w.tenant, pp); err != nil {
				w.tb.Fatal(err)
			}
		}
		d, err := w.r.rl.Admit(ctx, req)
		if err != nil {
			w.tb.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		got++
		if req.Prepaid != nil {
			after, err := w.r.rl.PrepaidDrawn(ctx, w.tenant, *req.Prepaid)
			if err != nil {
				w.tb.Fatal(err)
			}
			drew = drew || after > before
		}
	}
	if err := w.r.rl.ReportActive(ctx); err != nil {
		w.tb.Fatal(err)
	}
	return got, drew
}

// invoice returns the tenant's invoice labelled period (YYYY-MM).
func (w *prepaidWorld) invoice(period string) Invoice {
	w.tb.Helper()
	invs, err := w.ledger.TenantInvoices(context.Background(), w.tenant)
	if err != nil {
		w.tb.Fatal(err)
	}
	for _, in := range invs {
		if in.Period == period {
			return in
		}
	}
	w.tb.Fatalf("no invoice of %s in %+v", period, invs)
	return Invoice{}
}

// mustFinal fails the test unless the invoice of period is final and
// owes nothing, its credit lines paying all its charges.
func (w *prepaidWorld) mustFinal(period string) Invoice {
	w.tb.Helper()
	in := w.invoice(period)
	if in.Status != "final" || in.TotalCents != 0 {
		w.tb.Fatalf("%s's invoice: %s, owes %d cents, want final owing nothing; lines %+v", period, in.Status, in.TotalCents, in.Lines)
	}
	return in
}

// payAsYouGoTier is a prepaid tier of no included units at a cent a unit;
// postpaidTier a postpaid one of 30 cents a month that includes plenty.
var (
	payAsYouGoTier = quota.Tier{Slug: "payg", Name: "Pay as you go", Rank: 4321,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(0))}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
		Billing: quota.BillingPrepaid, TopUpURL: "https://example.com/top-up"}
	postpaidTier = quota.Tier{Slug: "basic", Name: "Basic", Rank: 4322, PriceCents: 30,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(1000))}, Overage: quota.OverageBlock}
)

// TestPrepaidHoldsThePostpaidChargesNotInvoiced: a tenant on a 30-cent
// postpaid plan with a 50-cent credit, moved onto a prepaid tier, may
// draw only what its postpaid charges not yet invoiced leave of the
// credit: moved at a period's start, 20 cents while the previous
// period's invoice waits for its grace; moved in the middle of a period,
// what the prorated price of the first half leaves. Every final invoice
// owes nothing.
func TestPrepaidHoldsThePostpaidChargesNotInvoiced(t *testing.T) {
	t.Parallel()
	april := time.Date(2031, 4, 1, 0, 0, 0, 0, time.UTC)
	may := april.AddDate(0, 1, 0)
	for _, tc := range []struct {
		name     string
		move     time.Time
		admitted int // in the move's period
	}{
		{"moved at the period's start", may, 20},
		{"moved in the middle of a period", time.Date(2031, 4, 16, 0, 0, 0, 0, time.UTC), 35},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newPrepaidWorld(t, april, postpaidTier, payAsYouGoTier)
			w.credit(50, nil)
			w.step()
			w.set(tc.move)
			w.move("payg")
			w.set(tc.move.Add(30 * time.Minute))
			w.step()
			if got := w.admit("demo", 100); got != tc.admitted {
				t.Fatalf("admitted %d units at a cent on a 50-cent credit after 30 cents a month of postpaid plan, want %d", got, tc.admitted)
			}
			w.step()
			w.set(may.Add(2 * time.Hour)) // April's invoice final
			w.step()
			w.mustFinal("2031-04")
			if got := w.admit("demo", 100); got != 0 {
				t.Fatalf("after April's invoice: %d more units, want none", got)
			}
			w.set(may.AddDate(0, 1, 0).Add(2 * time.Hour)) // May's final
			w.step()
			w.mustFinal("2031-05")
		})
	}
}

// TestPrepaidCreditGrantedAfterAPeriodPaysNotIt: a credit granted after a
// period ended does not pay that period's invoice, so the balance does not
// count it for it: April spends its whole 50-cent credit; on May 1 at
// 00:10, in April's grace, a 100-cent credit expiring on May 20 is
// granted, which no invoice may draw (May's is for credit valid at its
// end); May may spend nothing, and its invoice owes nothing.
func TestPrepaidCreditGrantedAfterAPeriodPaysNotIt(t *testing.T) {
	t.Parallel()
	april := time.Date(2031, 4, 1, 0, 0, 0, 0, time.UTC)
	may := april.AddDate(0, 1, 0)
	w := newPrepaidWorld(t, april, payAsYouGoTier)
	w.credit(50, nil)
	w.set(april.Add(time.Hour))
	if got := w.admit("demo", 100); got != 50 {
		t.Fatalf("april admitted %d units on 50 cents, want 50", got)
	}
	w.step()
	w.set(may.Add(10 * time.Minute))
	may20 := time.Date(2031, 5, 20, 0, 0, 0, 0, time.UTC)
	w.credit(100, &may20)
	w.set(may.Add(30 * time.Minute))
	w.step()
	if got := w.admit("demo", 100); got != 0 {
		t.Fatalf("may admitted %d units: April's invoice takes the 50 cents, and the 100 granted after April expires before May's end; want 0", got)
	}
	w.set(may.Add(2 * time.Hour))
	w.step()
	apr := w.mustFinal("2031-04")
	if want := []string{"Credit: top-up"}; !slices.Equal(creditLines(apr), want) {
		t.Fatalf("april's credit lines %q, want %q", creditLines(apr), want)
	}
	w.set(may.AddDate(0, 1, 0).Add(2 * time.Hour))
	w.step()
	w.mustFinal("2031-05")
}

// creditLines returns the descriptions of in's credit lines.
func creditLines(in Invoice) []string {
	var out []string
	for _, l := range in.Lines {
		if l.Kind == "credit" {
			out = append(out, l.Description)
		}
	}
	return out
}

// TestPrepaidHoldsAMetersOverageFromBeforeTheMove: a meter's overage that
// a postpaid plan billed in a period is on the period's invoice, and no
// prepaid draw counted it (admission draws the tier's overage from before
// a move, not a meter's): a tenant with 30 cents of it and a 50-cent
// credit, moved onto a prepaid tier, may draw 20 cents.
func TestPrepaidHoldsAMetersOverageFromBeforeTheMove(t *testing.T) {
	t.Parallel()
	april := time.Date(2031, 4, 1, 0, 0, 0, 0, time.UTC)
	metered := quota.Tier{Slug: "metered", Name: "Metered", Rank: 4323, Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(1000))},
		Overage: quota.OverageBlock, MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: quota.Ptr(int64(0)),
			Overage: quota.OverageBill, OveragePriceCentsPer1K: 10_000}}}
	w := newPrepaidWorld(t, april, metered, payAsYouGoTier)
	w.credit(50, nil)
	w.set(april.AddDate(0, 0, 9))
	if got := w.admit("search", 3); got != 3 {
		t.Fatalf("postpaid searches: %d of 3", got)
	}
	w.set(april.AddDate(0, 0, 9).Add(12 * time.Hour))
	w.move("payg")
	w.step()
	if got := w.admit("demo", 100); got != 20 {
		t.Fatalf("admitted %d units at a cent on a 50-cent credit after 30 cents of a meter's postpaid overage, want 20", got)
	}
	w.set(april.AddDate(0, 1, 0).Add(2 * time.Hour))
	w.step()
	w.mustFinal("2031-04")
}

// TestPrepaidHoldsAPriceRiseOnTheUnitsDrawnBefore: an invoice rates the
// period's overage at the price in force at its end, and admission drew
// each unit at the price then: a tenant that drew 40 cents at a cent a
// unit, moved in the middle of the period to a prepaid tier at 2 cents,
// will be charged 80 cents for them, so of a dollar of credit it may
// draw 20 cents more: 10 units.
func TestPrepaidHoldsAPriceRiseOnTheUnitsDrawnBefore(t *testing.T) {
	t.Parallel()
	april := time.Date(2031, 4, 1, 0, 0, 0, 0, time.UTC)
	dear := payAsYouGoTier
	dear.Slug, dear.Name, dear.Rank, dear.OveragePriceCentsPer1K = "dear", "Dear", 4324, 2000
	w := newPrepaidWorld(t, april, payAsYouGoTier, dear)
	w.credit(100, nil)
	w.set(april.AddDate(0, 0, 4))
	if got := w.admit("demo", 40); got != 40 {
		t.Fatalf("at a cent: %d of 40", got)
	}
	w.set(april.AddDate(0, 0, 14))
	w.move("dear")
	w.step()
	if got := w.admit("demo", 100); got != 10 {
		t.Fatalf("admitted %d units at 2 cents after 40 drawn at a cent, which the invoice rates at 2, on a dollar; want 10", got)
	}
	w.set(april.AddDate(0, 1, 0).Add(2 * time.Hour))
	w.step()
	w.mustFinal("2031-04")
}

// TestPrepaidCreditGrantedInTheGraceIsNotHeldForThePeriodBefore: a credit
// granted after a period ended cannot pay that period's invoice, so what
// that invoice owes beyond its own credits takes nothing of it: a tenant
// that owes its 30-cent postpaid April (no credit then), moved onto a
// prepaid tier on May 1 and granted 50 cents at 00:10, may draw all 50 in
// May while April's invoice waits for its grace.
func TestPrepaidCreditGrantedInTheGraceIsNotHeldForThePeriodBefore(t *testing.T) {
	t.Parallel()
	april := time.Date(2031, 4, 1, 0, 0, 0, 0, time.UTC)
	may := april.AddDate(0, 1, 0)
	w := newPrepaidWorld(t, april, postpaidTier, payAsYouGoTier)
	w.step()
	w.set(may)
	w.move("payg")
	w.set(may.Add(10 * time.Minute))
	w.credit(50, nil)
	w.set(may.Add(30 * time.Minute))
	w.step()
	if got := w.admit("demo", 100); got != 50 {
		t.Fatalf("may admitted %d units on a 50-cent credit granted in May, want 50: April's invoice cannot draw it", got)
	}
	w.set(may.Add(2 * time.Hour))
	w.step()
	if in := w.invoice("2031-04"); in.Status != "final" || in.TotalCents != 30 {
		t.Fatalf("april's invoice: %s owing %d, want final owing its 30 cents", in.Status, in.TotalCents)
	}
	w.set(may.AddDate(0, 1, 0).Add(2 * time.Hour))
	w.step()
	w.mustFinal("2031-05")
}
