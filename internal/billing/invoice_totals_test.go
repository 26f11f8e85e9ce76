package billing

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

// totalsCheck compares, for every label that has invoices or sums,
// Ledger.InvoiceSummary with the count and sum of total_cents over the
// invoices themselves, and returns how many labels it compared.
func totalsCheck(tb testing.TB, db *pgxpool.Pool, when string) int {
	tb.Helper()
	ctx := context.Background()
	rows, err := db.Query(ctx, `
		SELECT p.period, count(i.id), coalesce(sum(i.total_cents), 0)::bigint
		FROM (SELECT period FROM invoices UNION SELECT period FROM invoice_period_totals) p
		LEFT JOIN invoices i ON i.period = p.period
		GROUP BY p.period ORDER BY p.period`)
	if err != nil {
		tb.Fatal(err)
	}
	type want struct {
		period       time.Time
		count, total int64
	}
	var wants []want
	for rows.Next() {
		var w want
		if err := rows.Scan(&w.period, &w.count, &w.total); err != nil {
			tb.Fatal(err)
		}
		wants = append(wants, w)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	led := NewLedger(db)
	for _, w := range wants {
		count, total, err := led.InvoiceSummary(ctx, w.period)
		if err != nil {
			tb.Fatal(err)
		}
		if count != w.count || total != w.total {
			tb.Errorf("%s: summary of %s: %d invoices, %d cents; the invoices: %d, %d cents",
				when, w.period.Format("2006-01"), count, total, w.count, w.total)
		}
	}
	return len(wants)
}

// totalsRows returns the rows invoice_period_totals holds for the label.
func totalsRows(tb testing.TB, db *pgxpool.Pool, label time.Time) int64 {
	tb.Helper()
	var n int64
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM invoice_period_totals WHERE period = $1`, label).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestInvoiceSummaryStaysExact changes invoices in every way the product
// does (drafts created and refreshed by the sweep, Refresh and Generate; a
// draft deleted with its tenant; a month closed, its invoices finalized
// drawing credits; a late refund credited onto the next draft) and, after
// each change, compares the console's month summary with the invoices.
func TestInvoiceSummaryStaysExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLateRig(t, "pro")
	db := l.db
	free := invTenant(t, db, "free", invNov)
	gone := invTenant(t, db, "pro", invNov)
	credited := invTenant(t, db, "pro", invNov)
	mustCredit(t, db, credited, 1000, "Welcome", nil, invNov)

	l.admit(t, lateAt.Add(-time.Hour), 1000)
	d := l.admit(t, lateAt, 3600)       // all overage: 180 cents
	l.cycleAt(t, lateAt.Add(time.Hour)) // the sweep creates November's drafts
	if n := totalsCheck(t, db, "November's drafts"); n != 1 {
		t.Fatalf("%d labels compared, want November's", n)
	}
	count, total, err := NewLedger(db).InvoiceSummary(ctx, invNov)
	if err != nil || count != 4 || total != (4900+180)+0+4900+(4900-1000) {
		t.Fatalf("November: %d invoices, %d cents (%v); want 4, %d", count, total, err, (4900+180)+0+4900+(4900-1000))
	}

	// A draft refreshed by Refresh and by Generate, a tier change.
	invUsage(t, db, free, invNov.Add(48*time.Hour), 10, 0)
	invChangeTier(t, db, free, "pro", invNov.Add(20*24*time.Hour))
	if err := l.inv.Refresh(ctx, []string{free, l.tenant}); err != nil {
		t.Fatal(err)
	}
	totalsCheck(t, db, "after Refresh")
	invChangeTier(t, db, gone, "free", invNov.Add(21*24*time.Hour))
	invGenerate(t, l.inv, gone, invNov)
	totalsCheck(t, db, "after Generate")

	// A tenant deleted with its draft.
	if err := catalogdb.NewStore(db).DeleteTenant(ctx, "test", gone); err != nil {
		t.Fatal(err)
	}
	totalsCheck(t, db, "after a tenant's deletion")

	// November closed: final, the credit drawn; December's drafts.
	nov := l.finalNovember(t, 4900+180)
	if n := totalsCheck(t, db, "November closed"); n != 2 {
		t.Fatalf("%d labels compared, want November and December", n)
	}
	var finals int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM invoices WHERE period = $1 AND status = 'final'`, invNov).Scan(&finals); err != nil || finals != 3 {
		t.Fatalf("%d final invoices of November (%v), want 3", finals, err)
	}

	// A late refund of November: a credit on December's draft.
	l.refund(t, d, 600, 600)
	l.cycleAt(t, lateFinal.Add(5*time.Minute))
	if got := l.lateCredits(t); len(got) != 1 || got[0] != 30 {
		t.Fatalf("late credits: %v, want [30]", got)
	}
	if got := l.invoice(t, "2026-11"); got.TotalCents != nov.TotalCents {
		t.Fatalf("the final invoice changed: %d cents, want %d", got.TotalCents, nov.TotalCents)
	}
	totalsCheck(t, db, "after a late refund")
	// Sums written around the product (an operator's fix in SQL) count too.
	invExec(t, db, `UPDATE invoices SET total_cents = total_cents + 7 WHERE tenant_id = $1 AND period = $2`, free, invDec)
	totalsCheck(t, db, "after an update in SQL")

	// December closed: every label folded into one row by the Run.
	l.cycleAt(t, invJan.Add(10*time.Minute))
	totalsCheck(t, db, "December closed")
	for _, label := range []time.Time{invNov, invDec} {
		if n := totalsRows(t, db, label); n != 1 {
			t.Errorf("%s: %d rows of sums after a Run, want 1", label.Format("2006-01"), n)
		}
	}
}

// TestInvoiceSummaryConcurrentWriters runs sweeps, refreshes and single
// invoices at once over the same tenants while their usage changes, with
// compactions in between: the summary equals the invoices' sums after.
func TestInvoiceSummaryConcurrentWriters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	const n = 300
	invExec(t, db, `INSERT INTO tenants (name, tier, webhook_secret, created_at)
		SELECT 'tenant ' || g, CASE WHEN g % 2 = 0 THEN 'pro' ELSE 'free' END, decode(repeat('ab', 32), 'hex'), $2
		FROM generate_series(1, $1) g`, n, invNov)
	invExec(t, db, `INSERT INTO tenant_tier_history (tenant_id, tier, valid_from) SELECT id, tier, created_at FROM tenants`)
	rows, err := db.Query(ctx, `SELECT id::text FROM tenants ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if len(ids) != n {
		t.Fatalf("%d tenants, want %d", len(ids), n)
	}
	clock := &invClock{t: invNov.Add(10 * 24 * time.Hour)}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inv := NewInvoicer(db, clock.Now, time.Hour)
			inv.batch = 37 // many transactions
			for k := range 5 {
				if _, err := db.Exec(ctx, `
					INSERT INTO usage (tenant_id, hour, meter, units, requests, overage_units)
					SELECT id, $2, 'demo', 5000 + $3, 1, 5000 + $3 FROM tenants WHERE id::text = ANY($1)
					ON CONFLICT (tenant_id, hour, meter) DO UPDATE SET units = usage.units + 1, overage_units = usage.overage_units + 1`,
					ids[w*50:w*50+50], invNov.Add(time.Duration(k)*time.Hour), k); err != nil {
					errs <- err
					return
				}
				var err error
				switch (w + k) % 3 {
				case 0:
					err = inv.Run(ctx)
				case 1:
					err = inv.Refresh(ctx, ids[k*40:k*40+120])
				default:
					_, err = inv.Generate(ctx, ids[w*7+k], invNov)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := totalsCheck(t, db, "after concurrent writers"); got != 1 {
		t.Fatalf("%d labels compared, want November's", got)
	}
	count, total, err := NewLedger(db).InvoiceSummary(ctx, invNov)
	if err != nil || count != n || total <= 0 {
		t.Fatalf("November: %d invoices, %d cents (%v); want %d, some cents", count, total, err, n)
	}
	if err := compactInvoiceTotals(ctx, db); err != nil {
		t.Fatal(err)
	}
	if got := totalsRows(t, db, invNov); got != 1 {
		t.Errorf("%d rows of November's sums after a compaction, want 1", got)
	}
	totalsCheck(t, db, "after a compaction")
}

// TestInvoicePeriodTotalsMigration: down from 000017 drops the sums and
// their triggers and keeps the invoices; up again fills the sums from the
// invoices written meanwhile, and keeps them from then on.
func TestInvoicePeriodTotalsMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, m := migratablePool(t)
	clock := &invClock{t: invDec.Add(2 * time.Hour)}
	inv := NewInvoicer(db, clock.Now, time.Hour)
	a := invTenant(t, db, "pro", invNov)
	b := invTenant(t, db, "free", invNov)
	invGenerate(t, inv, a, invNov) // final
	invGenerate(t, inv, b, invDec) // draft
	totalsCheck(t, db, "before down")

	if err := m.Migrate(16); err != nil {
		t.Fatalf("down to 16: %v", err)
	}
	var tables, triggers int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_name = 'invoice_period_totals'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'invoice_period_totals%'`).Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	if tables != 0 || triggers != 0 {
		t.Fatalf("after down: %d tables and %d triggers of the sums, want none", tables, triggers)
	}
	// Written at 16: a new invoice, a changed total, a deleted draft.
	c := invTenant(t, db, "pro", invNov)
	invExec(t, db, `INSERT INTO invoices (tenant_id, period, total_cents) VALUES ($1, $2, 1234)`, c, invDec)
	invExec(t, db, `UPDATE invoices SET total_cents = total_cents + 11 WHERE tenant_id = $1`, a)
	invExec(t, db, `DELETE FROM invoices WHERE tenant_id = $1`, b)

	for range 2 { // up, then up again: no change
		if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
			t.Fatalf("up again: %v", err)
		}
	}
	if err := pgdb.SchemaCurrent(ctx, db); err != nil {
		t.Fatal(err)
	}
	if n := totalsCheck(t, db, "after down and up"); n != 2 {
		t.Fatalf("%d labels compared, want November and December", n)
	}
	count, total, err := NewLedger(db).InvoiceSummary(ctx, invDec)
	if err != nil || count != 1 || total != 1234 {
		t.Fatalf("December after down and up: %d invoices, %d cents (%v); want 1, 1234", count, total, err)
	}
	invGenerate(t, inv, b, invDec)
	totalsCheck(t, db, "a draft generated after up")
	if err := inv.Run(ctx); err != nil {
		t.Fatal(err)
	}
	totalsCheck(t, db, "a Run after up")
}
