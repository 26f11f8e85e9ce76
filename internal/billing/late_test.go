package billing

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
)

// lateRig is a tenant on Pro (overage at 50 cents per 1,000 units) whose
// November is admitted through Redis, flushed by a Reconciler and
// finalized by an Invoicer with no grace, on one injected clock.
type lateRig struct {
	*rig
	clock  *invClock
	rc     *Reconciler
	inv    *Invoicer
	tenant string
	log    *lockedBuffer
}

// lockedBuffer is a bytes.Buffer the logger and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var (
	lateAt    = invNov.Add(19*24*time.Hour + 12*time.Hour) // 2026-11-20 12:00
	lateFinal = invDec.Add(10 * time.Minute)
)

func newLateRig(t *testing.T, tier string) *lateRig {
	t.Helper()
	r := mustRig(t, nil)
	l := &lateRig{rig: r, clock: &invClock{t: invNov.Add(time.Hour)}, log: &lockedBuffer{}}
	l.tenant = invTenant(t, r.db, tier, invNov)
	l.rc = NewReconciler(r.db, r.rl, l.clock.Now, slog.New(slog.NewTextHandler(l.log, nil)))
	l.rc.SweepEvery = 0 // every flush sweeps: FlushedThrough follows the clock
	l.inv = NewInvoicer(r.db, l.clock.Now, 0)
	NewCycle(l.rc, l.inv)
	return l
}

// admit admits cost units of the tenant at the time at, against a monthly
// quota of 1,000 units past which it bills overage.
func (l *lateRig) admit(t *testing.T, at time.Time, cost int64) quota.Decision {
	t.Helper()
	ctx := context.Background()
	d, err := l.rl.Admit(ctx, quota.Request{TenantID: l.tenant, Meter: "demo", Cost: cost, Now: at,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(1000))}, Overage: quota.OverageBill})
	if err != nil || !d.Allowed {
		t.Fatalf("admit %d at %v: %+v, %v; want allowed", cost, at, d, err)
	}
	if err := l.rl.ReportActive(ctx); err != nil {
		t.Fatal(err)
	}
	return d
}

// refund gives back units (overage of them) of the request admitted by d,
// as POST /v1/refund does.
func (l *lateRig) refund(t *testing.T, d quota.Decision, units, overage int64) {
	t.Helper()
	ctx := context.Background()
	if err := l.rl.Refund(ctx, l.tenant, "demo", units, overage, d.Now); err != nil {
		t.Fatal(err)
	}
	if err := l.rl.ReportActive(ctx); err != nil {
		t.Fatal(err)
	}
}

// cycleAt flushes (and runs the invoices step, as a worker cycle does) at
// the time at.
func (l *lateRig) cycleAt(t *testing.T, at time.Time) {
	t.Helper()
	l.clock.Set(at)
	c := &Cycle{rec: l.rc, invoices: l.inv}
	if err := c.Flush(context.Background()); err != nil {
		t.Fatalf("flush at %v: %v", at, err)
	}
	if err := c.Invoices(context.Background()); err != nil {
		t.Fatalf("invoices at %v: %v", at, err)
	}
}

// invoice returns the tenant's invoice labelled period (YYYY-MM).
func (l *lateRig) invoice(t *testing.T, period string) Invoice {
	t.Helper()
	invs, err := NewLedger(l.db).TenantInvoices(context.Background(), l.tenant)
	if err != nil {
		t.Fatal(err)
	}
	for _, inv := range invs {
		if inv.Period == period {
			return inv
		}
	}
	t.Fatalf("no invoice %s", period)
	return Invoice{}
}

// finalNovember admits the usage, finalizes November and returns its
// invoice, checking its total.
func (l *lateRig) finalNovember(t *testing.T, wantTotal int64) Invoice {
	t.Helper()
	l.cycleAt(t, lateAt.Add(time.Hour))
	l.cycleAt(t, lateFinal)
	nov := l.invoice(t, "2026-11")
	if nov.Status != "final" || nov.TotalCents != wantTotal {
		t.Fatalf("November: %s, %d cents; want final, %d", nov.Status, nov.TotalCents, wantTotal)
	}
	return nov
}

// lateCredits returns the amounts of the tenant's credits that give back
// late usage of November, oldest first.
func (l *lateRig) lateCredits(t *testing.T) []int64 {
	t.Helper()
	rows, err := l.db.Query(context.Background(), `
		SELECT amount_cents FROM credits WHERE tenant_id = $1 AND reason = 'Late refund of 2026-11' ORDER BY created_at, id`, l.tenant)
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for rows.Next() {
		var c int64
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLateRefundBecomesACredit refunds part of a November request's
// overage after November's invoice is final: the flush that records it
// grants one credit of exactly what re-rating November gives back, the
// final invoice does not change, and December's invoice draws the credit.
func TestLateRefundBecomesACredit(t *testing.T) {
	t.Parallel()
	l := newLateRig(t, "pro")
	l.admit(t, lateAt.Add(-time.Hour), 1000)
	d := l.admit(t, lateAt, 3600) // all overage: 180 cents
	nov := l.finalNovember(t, 4900+180)

	l.refund(t, d, 600, 600) // 3,000 overage units: 150 cents
	l.cycleAt(t, lateFinal.Add(5*time.Minute))
	if got := l.lateCredits(t); !slices.Equal(got, []int64{30}) {
		t.Errorf("late credits: got %v, want [30]", got)
	}
	if got := l.invoice(t, "2026-11"); !reflect.DeepEqual(got, nov) {
		t.Errorf("the final invoice changed:\n got %+v\nwant %+v", got, nov)
	}
	if got, want := l.ledgerOf(t, l.tenant), (ledgerRow{units: 4000, overage: 3000, requests: 2}); got != want {
		t.Errorf("ledger: got %+v, want %+v", got, want)
	}
	if n, c := l.rc.LateCredits.Load(), l.rc.LateCreditCents.Load(); n != 1 || c != 30 {
		t.Errorf("metrics: %d late credits of %d cents, want 1 of 30", n, c)
	}
	if !strings.Contains(l.log.String(), "credit_cents=30") {
		t.Errorf("no log of the credit:\n%s", l.log.String())
	}
	var actor, forInvoice string
	var cents int64
	if err := l.db.QueryRow(context.Background(), `
		SELECT a.actor, a.after->>'late_refund_of_invoice_id', (a.after->>'amount_cents')::bigint
		FROM audit_log a JOIN credits c ON c.id::text = a.entity_id
		WHERE a.entity = 'credit' AND a.action = 'create' AND c.tenant_id = $1 AND c.reason = 'Late refund of 2026-11'`,
		l.tenant).Scan(&actor, &forInvoice, &cents); err != nil {
		t.Errorf("the late credit's audit entry: %v", err)
	} else if actor != "worker" || forInvoice != nov.ID || cents != 30 {
		t.Errorf("the late credit's audit entry: %s, invoice %s, %d cents; want worker, %s, 30", actor, forInvoice, cents, nov.ID)
	}

	// The next invoice draws it, once final.
	dec := crProLines(invDec, invJan)
	dec[1].Description = "Usage, included in Pro plan: 1,000,000 units per month"
	dec = append(dec, crLine("Late refund of 2026-11", 30))
	invCheckLines(t, l.invoice(t, "2026-12"), dec)
	l.cycleAt(t, invJan.Add(10*time.Minute))
	final := l.invoice(t, "2026-12")
	if final.Status != "final" {
		t.Fatalf("December: %s, want final", final.Status)
	}
	invCheckLines(t, final, dec)
	if n := crCount(t, l.db, `SELECT coalesce(sum(d.amount_cents), 0)::bigint FROM credit_draws d JOIN credits c ON c.id = d.credit_id
		WHERE c.tenant_id = $1 AND c.reason = 'Late refund of 2026-11' AND d.invoice_id = $2`, l.tenant, final.ID); n != 30 {
		t.Errorf("December drew %d cents of the late credit, want 30", n)
	}
	// November stayed as it was through all of it.
	if got := l.invoice(t, "2026-11"); !reflect.DeepEqual(got, nov) {
		t.Errorf("the final invoice changed:\n got %+v\nwant %+v", got, nov)
	}
}

// TestLateRefundRecordedTwiceCreditsOnce crashes the flush of a late
// refund after Postgres committed it, before Redis dropped the batch: the
// next flush records the same batch again, and there is still one credit.
// Recording the batch once more straight into the ledger adds none either.
func TestLateRefundRecordedTwiceCreditsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLateRig(t, "pro")
	l.admit(t, lateAt.Add(-time.Hour), 1000)
	d := l.admit(t, lateAt, 3600)
	l.finalNovember(t, 4900+180)

	l.refund(t, d, 600, 600)
	var claimed []quota.Batch
	l.clock.Set(lateFinal.Add(5 * time.Minute))
	l.rc.hook = func(step string) error {
		if step == "committed" {
			return errors.New("crash after the commit")
		}
		return nil
	}
	if err := l.rc.Flush(ctx); err == nil {
		t.Fatal("the crashing flush returned no error")
	}
	l.rc.hook = func(string) error { return nil }
	if got := l.lateCredits(t); !slices.Equal(got, []int64{30}) {
		t.Fatalf("late credits after the first record: got %v, want [30]", got)
	}
	// The batch is still in flight: a claim returns it.
	batches, err := l.rl.Claim(ctx, []string{l.tenant}, nil)
	if err != nil || len(batches) != 1 {
		t.Fatalf("claim: %v, %v; want the batch in flight", batches, err)
	}
	claimed = batches
	l.cycleAt(t, lateFinal.Add(6*time.Minute))
	if err := l.rc.recordTx(ctx, claimed); err != nil {
		t.Fatal(err)
	}
	if got := l.lateCredits(t); !slices.Equal(got, []int64{30}) {
		t.Errorf("late credits: got %v, want [30]", got)
	}
	if got, want := l.ledgerOf(t, l.tenant), (ledgerRow{units: 4000, overage: 3000, requests: 2}); got != want {
		t.Errorf("ledger: got %+v, want %+v", got, want)
	}
}

// TestLateRefundsCreditTheReratedDifference gives back three times 10
// overage units of 3,030 (152 cents: 151.5 rounded up): November re-rates
// to 151, 151 (150.5 rounded up), then 150 cents. The credits are 1, none,
// 1: two cents, the re-rated difference, where rating each give-back on
// its own would give back 3 cents (rounded up) or none (rounded down).
func TestLateRefundsCreditTheReratedDifference(t *testing.T) {
	t.Parallel()
	l := newLateRig(t, "pro")
	l.admit(t, lateAt.Add(-time.Hour), 1000)
	d := l.admit(t, lateAt, 3030)
	nov := l.finalNovember(t, 4900+152)
	for k := range 3 {
		l.refund(t, d, 10, 10)
		l.cycleAt(t, lateFinal.Add(time.Duration(k+1)*time.Minute))
	}
	if got := l.lateCredits(t); !slices.Equal(got, []int64{1, 1}) {
		t.Errorf("late credits: got %v, want [1 1]", got)
	}
	var base, rerated, credited int64
	if err := l.db.QueryRow(context.Background(), `
		SELECT base_cents, rerated_cents, credited_cents FROM invoice_late_adjustments WHERE invoice_id = $1`, nov.ID).
		Scan(&base, &rerated, &credited); err != nil {
		t.Fatal(err)
	}
	if base != 4900+152 || rerated != 4900+150 || credited != 2 {
		t.Errorf("adjustment: base %d, rerated %d, credited %d; want %d, %d, 2", base, rerated, credited, 4900+152, 4900+150)
	}
	if got := l.invoice(t, "2026-11"); !reflect.DeepEqual(got, nov) {
		t.Errorf("the final invoice changed:\n got %+v\nwant %+v", got, nov)
	}
}

// TestLateRefundWithinTheQuotaCreditsNothing refunds units of a November
// that stayed within its quota: the invoice charges the same without them,
// so there is no credit.
func TestLateRefundWithinTheQuotaCreditsNothing(t *testing.T) {
	t.Parallel()
	l := newLateRig(t, "pro")
	d := l.admit(t, lateAt, 800)
	nov := l.finalNovember(t, 4900)
	l.refund(t, d, 300, 0)
	l.cycleAt(t, lateFinal.Add(5*time.Minute))
	if got := l.lateCredits(t); len(got) != 0 {
		t.Errorf("late credits: got %v, want none", got)
	}
	if n := crCount(t, l.db, `SELECT count(*) FROM credits WHERE tenant_id = $1`, l.tenant); n != 0 {
		t.Errorf("%d credits, want none", n)
	}
	if got, want := l.ledgerOf(t, l.tenant), (ledgerRow{units: 500, requests: 1}); got != want {
		t.Errorf("ledger: got %+v, want %+v", got, want)
	}
	if got := l.invoice(t, "2026-11"); !reflect.DeepEqual(got, nov) {
		t.Errorf("the final invoice changed:\n got %+v\nwant %+v", got, nov)
	}
}

// TestLateRaiseIsNotBilled records usage of November that arrives after
// its invoice is final and raises it (a settlement above the estimate):
// it stays in the ledger, is not billed, is counted and logged; giving it
// back later credits nothing, and a refund beyond it credits only what
// goes below what the invoice charged.
func TestLateRaiseIsNotBilled(t *testing.T) {
	t.Parallel()
	l := newLateRig(t, "pro")
	l.admit(t, lateAt.Add(-time.Hour), 1000)
	d := l.admit(t, lateAt, 2000) // 100 cents of overage
	nov := l.finalNovember(t, 4900+100)

	up := l.admit(t, lateAt.Add(time.Minute), 1000) // late: +50 cents
	l.cycleAt(t, lateFinal.Add(time.Minute))
	if got := l.rc.LateRaises.Load(); got != 1 {
		t.Errorf("late raises: %d, want 1", got)
	}
	if !strings.Contains(l.log.String(), "not billed") {
		t.Errorf("no log of the raise:\n%s", l.log.String())
	}
	if got, want := l.ledgerOf(t, l.tenant), (ledgerRow{units: 4000, overage: 3000, requests: 3}); got != want {
		t.Errorf("ledger: got %+v, want %+v", got, want)
	}
	if got := l.invoice(t, "2026-11"); !reflect.DeepEqual(got, nov) {
		t.Errorf("the final invoice changed:\n got %+v\nwant %+v", got, nov)
	}

	l.refund(t, up, 1000, 1000) // back to what November charged
	l.cycleAt(t, lateFinal.Add(2*time.Minute))
	if got := l.lateCredits(t); len(got) != 0 {
		t.Errorf("late credits after giving back the raise: got %v, want none", got)
	}
	l.refund(t, d, 400, 400) // 20 cents below what November charged
	l.cycleAt(t, lateFinal.Add(3*time.Minute))
	if got := l.lateCredits(t); !slices.Equal(got, []int64{20}) {
		t.Errorf("late credits: got %v, want [20]", got)
	}
}

// TestLateRefundOfAPrepaidTenant refunds 10 units of a prepaid tenant's
// November (a cent a unit, paid by its credit at admission) after
// November's invoice is final: the 10 cents come back as a credit, which
// the balance its December admissions draw on counts.
func TestLateRefundOfAPrepaidTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	store := catalogdb.NewStore(r.db)
	tier, tn := payAsYouGo(t, store, nil)
	invExec(t, r.db, `UPDATE tenants SET created_at = $2 WHERE id = $1`, tn.ID, invNov)
	invExec(t, r.db, `UPDATE tenant_tier_history SET valid_from = $2 WHERE tenant_id = $1`, tn.ID, invNov)
	l := &lateRig{rig: r, clock: &invClock{t: invNov.Add(time.Hour)}, log: &lockedBuffer{}, tenant: tn.ID}
	l.rc = NewReconciler(r.db, r.rl, l.clock.Now, slog.New(slog.NewTextHandler(l.log, nil)))
	l.rc.SweepEvery = 0
	l.inv = NewInvoicer(r.db, l.clock.Now, 0)
	NewCycle(l.rc, l.inv)
	ledger := NewLedger(r.db)
	mustCredit(t, r.db, tn.ID, 100, "Prepayment", nil, invNov.Add(time.Minute))

	// admit admits up to n units at the time at, each with the balance as
	// the API reads it then, and returns the last decision and how many
	// passed.
	admit := func(at time.Time, n int) (last quota.Decision, got int) {
		t.Helper()
		for range n {
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
				break
			}
			last, got = d, got+1
		}
		if err := r.rl.ReportActive(ctx); err != nil {
			t.Fatal(err)
		}
		return last, got
	}
	d, got := admit(lateAt, 60)
	if got != 60 {
		t.Fatalf("November admitted %d of 60", got)
	}
	nov := l.finalNovember(t, 0)
	if n := len(nov.Lines); n != 4 || nov.Lines[2].Kind != "overage" || nov.Lines[2].AmountCents != 60 ||
		nov.Lines[3] != crLine("Prepayment", 60) {
		t.Fatalf("November's lines: %+v; want 60 cents of overage paid by the prepayment", nov.Lines)
	}

	l.refund(t, d, 10, 10)
	l.cycleAt(t, lateFinal.Add(5*time.Minute))
	if got := l.lateCredits(t); !slices.Equal(got, []int64{10}) {
		t.Errorf("late credits: got %v, want [10]", got)
	}
	if got := l.invoice(t, "2026-11"); !reflect.DeepEqual(got, nov) {
		t.Errorf("the final invoice changed:\n got %+v\nwant %+v", got, nov)
	}
	pp, err := ledger.Prepaid(ctx, tn.ID, tier, quota.Calendar{}, l.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if pp.CreditCents != 40+10 {
		t.Errorf("December's prepaid credit: %d cents, want the 40 left and the 10 given back", pp.CreditCents)
	}
	// December spends it all, a cent a unit.
	if _, got := admit(lateFinal.Add(10*time.Minute), 100); got != 50 {
		t.Errorf("December admitted %d units, want 50", got)
	}
}

// TestLateRefundWhileNovemberIsFinalized flushes a refund of November
// while November's invoice is being finalized without it, in a
// transaction not committed yet: the flush waits for that transaction,
// then finds the invoice final and credits what the refund gives back.
// (Had it recorded the refund meanwhile, seeing a draft, the final invoice
// would charge for the refunded units and nothing would give them back.)
func TestLateRefundWhileNovemberIsFinalized(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLateRig(t, "pro")
	l.admit(t, lateAt.Add(-time.Hour), 1000)
	d := l.admit(t, lateAt, 3600)
	l.cycleAt(t, lateAt.Add(time.Hour)) // November's draft
	l.clock.Set(invDec.Add(5 * time.Minute))
	mustFlush(t, l.rc) // swept past November's end: it may be finalized
	if got := l.invoice(t, "2026-11"); got.Status != "draft" {
		t.Fatalf("November: %s, want a draft still", got.Status)
	}
	l.refund(t, d, 600, 600)

	l.clock.Set(lateFinal)
	tx, err := l.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := l.inv.generateTx(ctx, tx, lateFinal, invNov, []string{l.tenant}); err != nil {
		t.Fatal(err)
	}
	flushed := make(chan error, 1)
	go func() { flushed <- l.rc.Flush(ctx) }()
	// The flush waits on the invoice's lock (or, without one, is done).
	for deadline := time.Now().Add(30 * time.Second); ; {
		var waiting int
		if err := l.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 || len(flushed) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	nov := l.invoice(t, "2026-11")
	if nov.Status != "final" || nov.TotalCents != 4900+180 {
		t.Errorf("November: %s, %d cents; want final, %d (finalized without the refund)", nov.Status, nov.TotalCents, 4900+180)
	}
	if got := l.lateCredits(t); !slices.Equal(got, []int64{30}) {
		t.Errorf("late credits: got %v, want [30]", got)
	}
}

// TestLateBatchOfTwoFinalPeriods records one batch that gives back units
// of both October and November once both invoices are final (the Postgres
// side of a flush): each period gets its own credit, of what it gives
// back.
func TestLateBatchOfTwoFinalPeriods(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	clock := &invClock{t: invDec.Add(time.Hour)}
	id := invTenant(t, r.db, "pro", invOct)
	octHour, novHour := invOct.Add(100*time.Hour), invNov.Add(100*time.Hour)
	invUsage(t, r.db, id, octHour, 2000, 2000) // 100 cents of overage
	invUsage(t, r.db, id, novHour, 3000, 3000) // 150 cents
	inv := NewInvoicer(r.db, clock.Now, 0)
	for _, m := range []time.Time{invOct, invNov} {
		if got := invGenerate(t, inv, id, m); got.Status != "final" {
			t.Fatalf("%s: %s, want final", got.Period, got.Status)
		}
	}
	rc := NewReconciler(r.db, nil, clock.Now, quiet)
	b := quota.Batch{ID: "late-both", TenantID: id, Rows: []quota.PendingRow{
		{Hour: octHour, Meter: "demo", Units: -1000, Overage: -1000}, // 50 cents
		{Hour: novHour, Meter: "demo", Units: -400, Overage: -400},   // 20 cents
	}}
	if err := rc.recordTx(ctx, []quota.Batch{b}); err != nil {
		t.Fatal(err)
	}
	got := crLeft(t, r.db, id)
	if want := map[string]int64{"Late refund of 2026-10": 50, "Late refund of 2026-11": 20}; !reflect.DeepEqual(got, want) {
		t.Errorf("credits: got %v, want %v", got, want)
	}
	if n, c := rc.LateCredits.Load(), rc.LateCreditCents.Load(); n != 2 || c != 70 {
		t.Errorf("metrics: %d late credits of %d cents, want 2 of 70", n, c)
	}
}
