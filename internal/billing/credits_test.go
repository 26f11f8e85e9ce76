package billing

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers pgx5://
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

var (
	invOct    = time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	invJan    = time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	crGrace   = time.Hour
	crFinalAt = invDec.Add(2 * time.Hour) // November's end + grace has passed
)

// crProLines are the lines of a full month of Pro without usage, rated over
// [start, end).
func crProLines(start, end time.Time) []InvoiceLine {
	secs := end.Unix() - start.Unix()
	return []InvoiceLine{
		{Kind: "subscription", Quantity: secs, AmountCents: 4900, Description: fmt.Sprintf("Pro plan, %s – %s (%s of %d days)",
			start.Format("2006-01-02"), end.Format("2006-01-02"), lineDays(secs), secs/86400)},
		{Kind: "included", Description: "Usage, included in Pro plan: 1,000,000 units per month"},
	}
}

func crLine(reason string, cents int64) InvoiceLine {
	return InvoiceLine{Kind: "credit", Description: "Credit: " + reason, Quantity: 1, AmountCents: -cents}
}

// mustCredit grants a credit to the tenant as an admin would at the time at.
func mustCredit(tb testing.TB, db *pgxpool.Pool, tenantID string, cents int64, reason string, expires *time.Time, at time.Time) string {
	tb.Helper()
	e, created, err := NewLedger(db).CreateCredit(context.Background(), "test", tenantID, "",
		NewCredit{AmountCents: cents, Reason: reason, ExpiresAt: expires}, at)
	if err != nil || !created {
		tb.Fatalf("CreateCredit(%d, %q): created %t, %v", cents, reason, created, err)
	}
	return e.ID
}

// crLedger returns the tenant's whole credit ledger and balance at now.
func crLedger(tb testing.TB, db *pgxpool.Pool, tenantID string, now time.Time) CreditPage {
	tb.Helper()
	p, err := NewLedger(db).Credits(context.Background(), tenantID, now, quota.Page{Limit: 200})
	if err != nil {
		tb.Fatalf("Credits: %v", err)
	}
	return p
}

// crLeft returns what is left of each of the tenant's credits, by reason.
func crLeft(tb testing.TB, db *pgxpool.Pool, tenantID string) map[string]int64 {
	tb.Helper()
	out := map[string]int64{}
	for _, e := range crLedger(tb, db, tenantID, crFinalAt).Items {
		if e.Kind == CreditGrant {
			out[e.Reason] = *e.RemainingCents
		}
	}
	return out
}

func crCount(tb testing.TB, db *pgxpool.Pool, sql string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestCreditsDrawnOnTheInvoice runs fixed Novembers to the cent: a draft
// shows the draws it would make and records none; finalization makes the
// same draws and records them in the ledger against the invoice; running the
// finalization again (this Invoicer, a fresh one, Generate) changes nothing.
func TestCreditsDrawnOnTheInvoice(t *testing.T) {
	t.Parallel()
	nov := func(day int) time.Time { return invNov.AddDate(0, 0, day-1) }
	pro := crProLines(invNov, invDec)
	type credit struct {
		cents   int64
		reason  string
		expires *time.Time
		created time.Time
	}
	tests := []struct {
		name    string
		usage   [2]int64 // units, overage units
		credits []credit
		want    []InvoiceLine
		total   int64
		left    map[string]int64 // what is left of each credit once final
		balance int64            // at crFinalAt
	}{
		{
			name:    "a credit covering part of the invoice",
			usage:   [2]int64{1_012_345, 12_345},
			credits: []credit{{2000, "Welcome credit", nil, nov(5)}},
			want: append(append([]InvoiceLine{pro[0]},
				InvoiceLine{Kind: "included", Description: pro[1].Description, Quantity: 1_012_345},
				InvoiceLine{Kind: "overage", Description: "Overage: 12,345 units at $0.50 per 1,000 (Pro plan)", Quantity: 12_345, AmountCents: 618}),
				crLine("Welcome credit", 2000)),
			total:   4900 + 618 - 2000,
			left:    map[string]int64{"Welcome credit": 0},
			balance: 0,
		},
		{
			name: "credits drawn oldest-expiring first, those without expiry last",
			credits: []credit{
				{5000, "Prepaid, no expiry", nil, nov(1)},
				{3000, "Spring promotion", quota.Ptr(time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)), nov(2)},
				{1000, "Black Friday", quota.Ptr(time.Date(2026, 12, 15, 0, 0, 0, 0, time.UTC)), nov(10)},
			},
			want: append(slicesClone(pro),
				crLine("Black Friday", 1000), crLine("Spring promotion", 3000), crLine("Prepaid, no expiry", 900)),
			total:   0,
			left:    map[string]int64{"Black Friday": 0, "Spring promotion": 0, "Prepaid, no expiry": 4100},
			balance: 4100,
		},
		{
			name: "a credit expired before the month's end is not drawn",
			credits: []credit{
				{1000, "Trial credit", quota.Ptr(nov(20)), nov(5)},
				{500, "Through November", quota.Ptr(invDec), nov(5)}, // valid to the end: drawn
				{700, "Granted in the grace", nil, invDec.Add(30 * time.Minute)},
			},
			want:    append(slicesClone(pro), crLine("Through November", 500)),
			total:   4400,
			left:    map[string]int64{"Trial credit": 1000, "Through November": 0, "Granted in the grace": 700},
			balance: 700, // the trial credit expired
		},
		{
			name:    "a credit larger than the invoice pays it all and keeps the rest",
			credits: []credit{{10_000, "Annual prepayment", nil, nov(1)}},
			want:    append(slicesClone(pro), crLine("Annual prepayment", 4900)),
			total:   0,
			left:    map[string]int64{"Annual prepayment": 5100},
			balance: 5100,
		},
		{
			name:    "no credit",
			want:    pro,
			total:   4900,
			left:    map[string]int64{},
			balance: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testenv.Postgres(t)
			id := invTenant(t, db, "pro", invNov)
			if tt.usage[0] > 0 {
				invUsage(t, db, id, nov(2), tt.usage[0], tt.usage[1])
			}
			for _, c := range tt.credits {
				mustCredit(t, db, id, c.cents, c.reason, c.expires, c.created)
			}
			clock := &invClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
			inv := NewInvoicer(db, clock.Now, crGrace)

			draft := invGenerate(t, inv, id, invNov)
			if draft.Status != "draft" {
				t.Fatalf("status on November 30: %s, want draft", draft.Status)
			}
			invCheckLines(t, draft, tt.want)
			if n := crCount(t, db, `SELECT count(*) FROM credit_draws`); n != 0 {
				t.Fatalf("a draft recorded %d draws, want none", n)
			}

			clock.Set(crFinalAt)
			if err := inv.Run(ctx); err != nil {
				t.Fatal(err)
			}
			final := invGenerate(t, inv, id, invNov)
			if final.Status != "final" {
				t.Fatalf("status after the grace: %s, want final", final.Status)
			}
			invCheckLines(t, final, tt.want)
			if final.TotalCents != tt.total {
				t.Errorf("total_cents: got %d, want %d", final.TotalCents, tt.total)
			}
			if got := crLeft(t, db, id); !reflect.DeepEqual(got, tt.left) {
				t.Errorf("left of each credit: got %v, want %v", got, tt.left)
			}
			ledger := crLedger(t, db, id, crFinalAt)
			if ledger.BalanceCents != tt.balance {
				t.Errorf("balance at %v: got %d, want %d", crFinalAt, ledger.BalanceCents, tt.balance)
			}
			// The ledger's draws are the invoice's credit lines.
			var drawn, lines []InvoiceLine
			for _, e := range ledger.Items {
				if e.Kind != CreditDraw {
					continue
				}
				if e.InvoiceID == nil || *e.InvoiceID != final.ID || e.CreditID == nil || !e.CreatedAt.Equal(crFinalAt) {
					t.Errorf("draw %+v: want invoice %s, a credit id, created at %v", e, final.ID, crFinalAt)
				}
				drawn = append(drawn, crLine(e.Reason, -e.AmountCents))
			}
			for _, l := range final.Lines {
				if l.Kind == "credit" {
					lines = append(lines, l)
				}
			}
			if !sameLines(drawn, lines) {
				t.Errorf("ledger draws %v, want the invoice's credit lines %v", drawn, lines)
			}

			// Finalizing again draws nothing more and changes nothing.
			draws := crCount(t, db, `SELECT count(*) FROM credit_draws`)
			clock.Set(crFinalAt.Add(time.Hour))
			if err := inv.Run(ctx); err != nil {
				t.Fatal(err)
			}
			if err := NewInvoicer(db, clock.Now, crGrace).Run(ctx); err != nil {
				t.Fatal(err)
			}
			if got := invGenerate(t, NewInvoicer(db, clock.Now, crGrace), id, invNov); !reflect.DeepEqual(got, final) {
				t.Errorf("final invoice after a rerun:\n got %+v\nwant %+v", got, final)
			}
			if got := crCount(t, db, `SELECT count(*) FROM credit_draws`); got != draws {
				t.Errorf("draws after a rerun: %d, want %d", got, draws)
			}
			if got := crLeft(t, db, id); !reflect.DeepEqual(got, tt.left) {
				t.Errorf("left of each credit after a rerun: got %v, want %v", got, tt.left)
			}
		})
	}
}

func slicesClone(l []InvoiceLine) []InvoiceLine { return append([]InvoiceLine(nil), l...) }

// sameLines compares lines as multisets (the ledger lists newest first).
func sameLines(a, b []InvoiceLine) bool {
	if len(a) != len(b) {
		return false
	}
	left := map[InvoiceLine]int{}
	for _, l := range a {
		left[l]++
	}
	for _, l := range b {
		if left[l]--; left[l] < 0 {
			return false
		}
	}
	return true
}

// TestCreditLeftOverPaysTheNextMonth: what November does not draw of a
// credit pays December, and what December leaves is the balance.
func TestCreditLeftOverPaysTheNextMonth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	id := invTenant(t, db, "pro", invNov)
	mustCredit(t, db, id, 10_000, "Annual prepayment", nil, invNov.Add(time.Hour))
	clock := &invClock{t: crFinalAt}
	inv := NewInvoicer(db, clock.Now, crGrace)
	if err := inv.Run(ctx); err != nil {
		t.Fatal(err)
	}
	// December's draft, while November is final, shows what is left.
	invCheckLines(t, invGenerate(t, inv, id, invDec), append(crProLines(invDec, invJan), crLine("Annual prepayment", 4900)))
	if got := crLedger(t, db, id, clock.Now()).BalanceCents; got != 5100 {
		t.Fatalf("balance after November: %d, want 5100", got)
	}

	clock.Set(invJan.Add(2 * time.Hour))
	if err := inv.Run(ctx); err != nil {
		t.Fatal(err)
	}
	dec := invGenerate(t, inv, id, invDec)
	if dec.Status != "final" {
		t.Fatalf("December: %s, want final", dec.Status)
	}
	invCheckLines(t, dec, append(crProLines(invDec, invJan), crLine("Annual prepayment", 4900)))
	ledger := crLedger(t, db, id, clock.Now())
	if ledger.BalanceCents != 200 {
		t.Errorf("balance after December: %d, want 200", ledger.BalanceCents)
	}
	var amounts []int64
	for _, e := range ledger.Items {
		amounts = append(amounts, e.AmountCents)
	}
	if want := []int64{-4900, -4900, 10_000}; !reflect.DeepEqual(amounts, want) {
		t.Errorf("ledger amounts, newest first: %v, want %v", amounts, want)
	}
	// January's draft shows the last 200 cents.
	invCheckLines(t, invGenerate(t, inv, id, invJan), append(crProLines(invJan, invJan.AddDate(0, 1, 0)), crLine("Annual prepayment", 200)))
}

// TestConcurrentFinalizersDrawOnce finalizes the same invoices from several
// workers at once: each credit is drawn once, never past its amount, and the
// months of one tenant take turns on its credit.
func TestConcurrentFinalizersDrawOnce(t *testing.T) {
	t.Parallel()
	const n = 40
	setup := func(t *testing.T) (*pgxpool.Pool, []string) {
		db := testenv.Postgres(t)
		ids := make([]string, n)
		for k := range ids {
			ids[k] = invTenant(t, db, "pro", invOct)
			mustCredit(t, db, ids[k], 6000, "Prepaid", nil, invOct)
		}
		// October is still a draft, as a worker that was down leaves it.
		octClock := &invClock{t: time.Date(2026, 10, 20, 0, 0, 0, 0, time.UTC)}
		if err := NewInvoicer(db, octClock.Now, crGrace).Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		return db, ids
	}
	// check verifies every tenant's ledger and invoices, and returns the
	// credit lines of October and November of the first tenant.
	check := func(t *testing.T, db *pgxpool.Pool, ids []string) (oct, nov int64) {
		t.Helper()
		for k, id := range ids {
			var drawn, draws, lines, totals int64
			err := db.QueryRow(context.Background(), `
				SELECT (SELECT drawn_cents FROM credits WHERE tenant_id = $1),
				       (SELECT coalesce(sum(d.amount_cents), 0)::bigint FROM credit_draws d JOIN credits c ON c.id = d.credit_id WHERE c.tenant_id = $1),
				       (SELECT coalesce(sum(l.amount_cents), 0)::bigint FROM invoice_lines l JOIN invoices i ON i.id = l.invoice_id
				         WHERE i.tenant_id = $1 AND l.kind = 'credit'),
				       (SELECT sum(total_cents)::bigint FROM invoices WHERE tenant_id = $1 AND period < $2 AND status = 'final')`,
				id, invDec).Scan(&drawn, &draws, &lines, &totals)
			if err != nil {
				t.Fatal(err)
			}
			if drawn != 6000 || draws != 6000 || lines != -6000 || totals != 2*4900-6000 {
				t.Errorf("tenant %d: drawn %d, draws %d, credit lines %d, October and November owe %d; want 6000, 6000, -6000, %d",
					k, drawn, draws, lines, totals, 2*4900-6000)
			}
		}
		for _, month := range []time.Time{invOct, invNov} {
			var cents int64
			err := db.QueryRow(context.Background(), `SELECT coalesce(sum(-l.amount_cents), 0)::bigint FROM invoice_lines l
				JOIN invoices i ON i.id = l.invoice_id WHERE i.tenant_id = $1 AND i.period = $2 AND i.status = 'final' AND l.kind = 'credit'`,
				ids[0], month).Scan(&cents)
			if err != nil {
				t.Fatal(err)
			}
			if month.Equal(invOct) {
				oct = cents
			} else {
				nov = cents
			}
		}
		return oct, nov
	}

	t.Run("two workers close the months at once", func(t *testing.T) {
		t.Parallel()
		db, ids := setup(t)
		clock := &invClock{t: crFinalAt}
		a, b := NewInvoicer(db, clock.Now, crGrace), NewInvoicer(db, clock.Now, crGrace)
		a.batch, b.batch = 7, 11
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for k, inv := range []*Invoicer{a, b} {
			wg.Go(func() { errs[k] = inv.Run(context.Background()) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		// Months close in order: October draws first.
		if oct, nov := check(t, db, ids); oct != 4900 || nov != 1100 {
			t.Errorf("first tenant: October drew %d, November %d; want 4900 and 1100", oct, nov)
		}
		if got := crCount(t, db, `SELECT count(*) FROM credit_draws`); got != 2*n {
			t.Errorf("draws: %d, want %d (one per tenant and month)", got, 2*n)
		}
	})

	t.Run("both months of every tenant finalized at once, in any order", func(t *testing.T) {
		t.Parallel()
		db, ids := setup(t)
		clock := &invClock{t: crFinalAt}
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 4*n+2)
		for _, id := range ids {
			for _, month := range []time.Time{invNov, invOct, invNov, invOct} {
				wg.Go(func() {
					<-start
					_, err := NewInvoicer(db, clock.Now, crGrace).Generate(context.Background(), id, month)
					errs <- err
				})
			}
		}
		for range 2 {
			wg.Go(func() {
				<-start
				errs <- NewInvoicer(db, clock.Now, crGrace).Run(context.Background())
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if oct, nov := check(t, db, ids); oct+nov != 6000 {
			t.Errorf("first tenant: October drew %d, November %d; want 6000 in all", oct, nov)
		}
	})
}

// TestDrawCredits: an invoice draws the credits that pay it in order, each
// for at most what is left of it, together at most its total; what it
// drew is no longer left for the next one.
func TestDrawCredits(t *testing.T) {
	t.Parallel()
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	pool := func() creditPool {
		return newCreditPool([]availableCredit{{id: "c", reason: "C", leftCents: 500}, {id: "a", reason: "A", leftCents: 300}, {id: "b", reason: "B"}})
	}
	for _, tt := range []struct {
		total int64
		want  []creditDraw
	}{
		{0, nil},
		{-5, nil},
		{1, []creditDraw{{"a", "A", 1}}},
		{300, []creditDraw{{"a", "A", 300}}},
		{301, []creditDraw{{"a", "A", 300}, {"c", "C", 1}}},
		{800, []creditDraw{{"a", "A", 300}, {"c", "C", 500}}},
		{10_000, []creditDraw{{"a", "A", 300}, {"c", "C", 500}}},
	} {
		p := pool()
		if got := p.draw(tt.total, end); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("draw(%d): got %v, want %v", tt.total, got, tt.want)
		}
		var drawn int64
		for _, d := range tt.want {
			drawn += d.cents
		}
		if left := p.left(end, time.Time{}); left != 800-drawn {
			t.Errorf("after draw(%d): %d cents left, want %d", tt.total, left, 800-drawn)
		}
	}
}

// TestCreditPaysAndDrawOrder: a credit pays the invoice of a period it was
// granted before the end of and had not expired before (expiring at the
// very end is in time); the soonest expiring is drawn first, those that
// never expire last, then the oldest granted.
func TestCreditPaysAndDrawOrder(t *testing.T) {
	t.Parallel()
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { x := end.Add(d); return &x }
	for _, tt := range []struct {
		name string
		c    availableCredit
		want bool
	}{
		{"granted before, never expires", availableCredit{createdAt: end.Add(-time.Hour)}, true},
		{"granted at the end", availableCredit{createdAt: end}, false},
		{"granted after, in the grace", availableCredit{createdAt: end.Add(10 * time.Minute)}, false},
		{"expires at the end", availableCredit{createdAt: end.Add(-time.Hour), expiresAt: at(0)}, true},
		{"expired just before the end", availableCredit{createdAt: end.Add(-time.Hour), expiresAt: at(-time.Microsecond)}, false},
		{"expires after the end", availableCredit{createdAt: end.Add(-time.Hour), expiresAt: at(time.Hour)}, true},
	} {
		if got := tt.c.pays(end); got != tt.want {
			t.Errorf("%s: pays = %v, want %v", tt.name, got, tt.want)
		}
	}
	old, young := end.Add(-48*time.Hour), end.Add(-time.Hour)
	p := newCreditPool([]availableCredit{
		{id: "never-young", createdAt: young, leftCents: 1}, {id: "never-old", createdAt: old, leftCents: 1},
		{id: "late", createdAt: young, expiresAt: at(2 * time.Hour), leftCents: 1},
		{id: "soon-young", createdAt: young, expiresAt: at(time.Hour), leftCents: 1}, {id: "soon-old", createdAt: old, expiresAt: at(time.Hour), leftCents: 1},
		{id: "too-late", createdAt: end.Add(time.Minute), leftCents: 1}, {id: "expired", createdAt: old, expiresAt: at(-time.Hour), leftCents: 1},
	})
	var got []string
	for _, d := range p.draw(100, end) {
		got = append(got, d.creditID)
	}
	if want := []string{"soon-old", "soon-young", "late", "never-old", "never-young"}; !slices.Equal(got, want) {
		t.Errorf("drawn %q, want %q", got, want)
	}
	if left := p.left(end.AddDate(0, 1, 0), end); left != 1 {
		t.Errorf("left for the next period only: %d cents, want 1 (the credit granted after the end)", left)
	}
}

// TestCreditLedger checks CreateCredit's checks, its idempotency and audit,
// and the listing's order, pages and balance.
func TestCreditLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	l := NewLedger(db)
	id := invTenant(t, db, "pro", invNov)
	now := time.Date(2026, 11, 10, 9, 30, 0, 123456789, time.UTC)

	for _, tt := range []struct {
		name, field string
		c           NewCredit
	}{
		{"no amount", "amount_cents", NewCredit{Reason: "x"}},
		{"negative", "amount_cents", NewCredit{AmountCents: -1, Reason: "x"}},
		{"above 2^40", "amount_cents", NewCredit{AmountCents: quota.MaxPrice + 1, Reason: "x"}},
		{"no reason", "reason", NewCredit{AmountCents: 1}},
		{"201 characters", "reason", NewCredit{AmountCents: 1, Reason: strings.Repeat("é", 201)}},
		{"blank", "reason", NewCredit{AmountCents: 1, Reason: " \u00a0 "}},
		{"a line break", "reason", NewCredit{AmountCents: 1, Reason: "a\nb"}},
		{"expired", "expires_at", NewCredit{AmountCents: 1, Reason: "x", ExpiresAt: quota.Ptr(now.Add(-time.Second))}},
		{"expiring now", "expires_at", NewCredit{AmountCents: 1, Reason: "x", ExpiresAt: quota.Ptr(now)}},
	} {
		_, _, err := l.CreateCredit(ctx, "test", id, "", tt.c, now)
		var qe *quota.Error
		if !errors.As(err, &qe) || qe.Code != quota.CodeInvalid || qe.Field != tt.field {
			t.Errorf("%s: %v, want an invalid error naming %s", tt.name, err, tt.field)
		}
	}
	for _, tenant := range []string{"0b4e8d1a-57c6-4b5f-9a4e-5bb1a3f1c2d7", "acme"} {
		if _, _, err := l.CreateCredit(ctx, "test", tenant, "", NewCredit{AmountCents: 1, Reason: "x"}, now); quota.ErrorCode(err) != quota.CodeNotFound {
			t.Errorf("CreateCredit for tenant %q: %v, want not found", tenant, err)
		}
		if _, err := l.Credits(ctx, tenant, now, quota.Page{Limit: 10}); quota.ErrorCode(err) != quota.CodeNotFound {
			t.Errorf("Credits of tenant %q: %v, want not found", tenant, err)
		}
	}

	exp := now.Add(30 * 24 * time.Hour)
	in := NewCredit{AmountCents: quota.MaxPrice, Reason: strings.Repeat("é", 200), ExpiresAt: &exp}
	first, created, err := l.CreateCredit(ctx, "admin", id, "ticket-1", in, now)
	if err != nil || !created {
		t.Fatalf("CreateCredit: created %t, %v", created, err)
	}
	want := CreditEntry{ID: first.ID, TenantID: id, Kind: CreditGrant, AmountCents: quota.MaxPrice, Reason: in.Reason,
		ExpiresAt: quota.Ptr(exp.Truncate(time.Microsecond)), CreatedAt: now.Truncate(time.Microsecond),
		RemainingCents: quota.Ptr(quota.MaxPrice)}
	first.CreatedAt, first.ExpiresAt = first.CreatedAt.UTC(), quota.Ptr(first.ExpiresAt.UTC())
	if !reflect.DeepEqual(first, want) {
		t.Errorf("created:\n got %+v\nwant %+v", first, want)
	}
	// A retry, even after the expiry, answers the same credit.
	again, created, err := l.CreateCredit(ctx, "admin", id, "ticket-1", in, exp.Add(time.Hour))
	if err != nil || created || again.ID != first.ID {
		t.Errorf("retry: %s created %t, %v; want %s, not created", again.ID, created, err, first.ID)
	}
	other := in
	other.AmountCents--
	if _, _, err := l.CreateCredit(ctx, "admin", id, "ticket-1", other, now); quota.ErrorCode(err) != quota.CodeMismatch {
		t.Errorf("the key with another amount: %v, want a mismatch", err)
	}
	var audits int64
	var after map[string]any
	if err := db.QueryRow(ctx, `SELECT count(*) OVER (), after FROM audit_log WHERE entity = 'credit' AND entity_id = $1 AND action = 'create' AND actor = 'admin'`,
		first.ID).Scan(&audits, &after); err != nil || audits != 1 || after["amount_cents"] != float64(quota.MaxPrice) {
		t.Errorf("audit of the credit: %d entries, after %v, %v; want one with its amount", audits, after, err)
	}

	// More credits, one expiring soon, and November's draws.
	mustCredit(t, db, id, 700, "soon", quota.Ptr(now.Add(time.Hour)), now.Add(time.Minute))
	mustCredit(t, db, id, 300, "later", nil, now.Add(2*time.Minute))
	if got := crLedger(t, db, id, now.Add(3*time.Minute)).BalanceCents; got != quota.MaxPrice+1000 {
		t.Errorf("balance: %d, want %d", got, quota.MaxPrice+1000)
	}
	if got := crLedger(t, db, id, now.Add(time.Hour)).BalanceCents; got != quota.MaxPrice+300 {
		t.Errorf("balance once one expired: %d, want %d", got, quota.MaxPrice+300)
	}
	if _, err := NewInvoicer(db, (&invClock{t: crFinalAt}).Now, crGrace).Generate(ctx, id, invNov); err != nil {
		t.Fatal(err)
	}
	all := crLedger(t, db, id, crFinalAt)
	if got := all.BalanceCents; got != quota.MaxPrice-4900+300 {
		t.Errorf("balance after November: %d, want %d", got, quota.MaxPrice-4900+300)
	}
	var kinds []string
	for _, e := range all.Items {
		kinds = append(kinds, e.Kind+" "+e.Reason)
	}
	if want := []string{"draw " + in.Reason, "grant later", "grant soon", "grant " + in.Reason}; !reflect.DeepEqual(kinds, want) {
		t.Errorf("ledger, newest first: %q, want %q", kinds, want)
	}
	if d := all.Items[0]; d.AmountCents != -4900 || d.CreditID == nil || *d.CreditID != first.ID || d.InvoiceID == nil || d.RemainingCents != nil {
		t.Errorf("the draw: %+v, want -4900 cents of credit %s onto an invoice", d, first.ID)
	}

	// Pages of one follow the same order.
	var paged []CreditEntry
	p := quota.Page{Limit: 1}
	for range 10 {
		page, err := l.Credits(ctx, id, crFinalAt, p)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, page.Items...)
		if page.NextCursor == nil {
			break
		}
		p.Cursor = *page.NextCursor
	}
	if !reflect.DeepEqual(paged, all.Items) {
		t.Errorf("pages of one:\n got %+v\nwant %+v", paged, all.Items)
	}
	if _, err := l.Credits(ctx, id, crFinalAt, quota.Page{Limit: 1, Cursor: "nope"}); quota.ErrorCode(err) != quota.CodeInvalid {
		t.Errorf("a bad cursor: %v, want invalid", err)
	}
}

// TestCreditsMigrationDown reverts migration 7 with credits drawn on a final
// invoice: the invoice owes its full total again, and migrating up is green.
func TestCreditsMigrationDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, m := migratablePool(t)
	id := invTenant(t, db, "pro", invNov)
	mustCredit(t, db, id, 1000, "Welcome credit", nil, invNov)
	final := invGenerate(t, NewInvoicer(db, (&invClock{t: crFinalAt}).Now, crGrace), id, invNov)
	if final.TotalCents != 3900 {
		t.Fatalf("final total: %d, want 3900", final.TotalCents)
	}

	if err := m.Migrate(6); err != nil { // down to before the credits (000007)
		t.Fatalf("down to 6: %v", err)
	}
	var total, credits int64
	if err := db.QueryRow(ctx, `SELECT total_cents, (SELECT count(*) FROM invoice_lines WHERE invoice_id = $1 AND kind = 'credit')
		FROM invoices WHERE id = $1`, final.ID).Scan(&total, &credits); err != nil || total != 4900 || credits != 0 {
		t.Errorf("after down: total %d with %d credit lines (%v), want 4900 and none", total, credits, err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO invoice_lines (invoice_id, line_no, kind, description, quantity, amount_cents)
		VALUES ($1, 9, 'grant', 'x', 0, -1)`, final.ID); err == nil {
		t.Error("after down: a negative line was accepted")
	}
	for range 2 { // up, then up again: no change
		if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
			t.Fatalf("up again: %v", err)
		}
	}
	if err := pgdb.SchemaCurrent(ctx, db); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, sql string }{
		{"a negative line that is no credit", `INSERT INTO invoice_lines (invoice_id, line_no, kind, description, quantity, amount_cents) VALUES ('` + final.ID + `', 9, 'grant', 'x', 0, -1)`},
		{"a credit line that is not negative", `INSERT INTO invoice_lines (invoice_id, line_no, kind, description, quantity, amount_cents) VALUES ('` + final.ID + `', 9, 'credit', 'x', 1, 0)`},
		{"a credit overdrawn", `INSERT INTO credits (tenant_id, amount_cents, drawn_cents, reason, created_at) VALUES ('` + id + `', 5, 6, 'x', now())`},
		{"a credit expiring before it exists", `INSERT INTO credits (tenant_id, amount_cents, reason, created_at, expires_at) VALUES ('` + id + `', 5, 'x', now(), now() - interval '1 second')`},
	} {
		if _, err := db.Exec(ctx, tc.sql); err == nil {
			t.Errorf("%s: accepted, want a constraint violation", tc.name)
		}
	}
}
