package stripeexport_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/stripeexport"
	"github.com/tollgate/tollgate/internal/testenv"
)

// clock is the Exporter's injected clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// rig is a test's database, Stripe (stripe-mock behind a recording
// proxy), clock and Exporter.
type rig struct {
	db    *pgxpool.Pool
	proxy *testenv.StripeProxy
	clock *clock
	exp   *stripeexport.Exporter
}

var start = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)

func newRig(t *testing.T) *rig {
	t.Helper()
	mock := testenv.StripeMockURL(t)
	r := &rig{db: testenv.Postgres(t), proxy: testenv.NewStripeProxy(t, mock), clock: &clock{t: start}}
	r.exp = r.exporter()
	return r
}

// exporter returns another Exporter on the rig (another worker).
func (r *rig) exporter() *stripeexport.Exporter {
	return stripeexport.New(r.db, "sk_test_tollgate", r.proxy.URL, nil, r.clock.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func (r *rig) tenant(t *testing.T, name string) string {
	t.Helper()
	tn, err := catalogdb.NewStore(r.db).CreateTenant(context.Background(), "test", name, "free")
	if err != nil {
		t.Fatal(err)
	}
	return tn.ID
}

// invoice writes an invoice of the tenant for period (YYYY-MM) with lines,
// final unless draft, and returns its id.
func (r *rig) invoice(t *testing.T, tenant, period string, final bool, lines ...billing.InvoiceLine) string {
	t.Helper()
	ctx := context.Background()
	status, finalized := "draft", (*time.Time)(nil)
	if final {
		f := r.clock.Now().Add(-time.Hour)
		status, finalized = "final", &f
	}
	var id string
	err := r.db.QueryRow(ctx, `INSERT INTO invoices (tenant_id, period, status, finalized_at, total_cents)
		VALUES ($1, ($2 || '-01')::date, $3, $4, $5) RETURNING id::text`,
		tenant, period, status, finalized, max(billing.TotalCents(lines), 0)).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	for n, l := range lines {
		if _, err := r.db.Exec(ctx, `INSERT INTO invoice_lines (invoice_id, line_no, kind, description, quantity, amount_cents)
			VALUES ($1, $2, $3, $4, $5, $6)`, id, n+1, l.Kind, l.Description, l.Quantity, l.AmountCents); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

// export is the state of an invoice's export row.
type export struct {
	Status, StripeID, LastError string
	LinesDone, Attempts         int
	Next                        time.Time
	Exported                    bool
}

func (r *rig) export(t *testing.T, invoiceID string) export {
	t.Helper()
	var x export
	var sid *string
	err := r.db.QueryRow(context.Background(), `SELECT status, stripe_invoice_id, last_error, lines_done, attempts, next_attempt_at,
		exported_at IS NOT NULL FROM invoice_exports WHERE invoice_id = $1`, invoiceID).
		Scan(&x.Status, &sid, &x.LastError, &x.LinesDone, &x.Attempts, &x.Next, &x.Exported)
	if err != nil {
		t.Fatalf("export of %s: %v", invoiceID, err)
	}
	if sid != nil {
		x.StripeID = *sid
	}
	return x
}

func (r *rig) customerID(t *testing.T, tenant string) string {
	t.Helper()
	var id *string
	if err := r.db.QueryRow(context.Background(), `SELECT stripe_customer_id FROM tenants WHERE id = $1`, tenant).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if id == nil {
		return ""
	}
	return *id
}

func (r *rig) run(t *testing.T) {
	t.Helper()
	if err := r.exp.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

var threeLines = []billing.InvoiceLine{
	{Kind: "subscription", Description: "Pro plan, Nov 1 – Dec 1", Quantity: 1, AmountCents: 2900},
	{Kind: "overage", Description: "Overage: 12,340 units", Quantity: 12340, AmountCents: 1234},
	{Kind: "credit", Description: "Credit: goodwill", Quantity: 1, AmountCents: -500},
}

// keys returns the idempotency keys of calls, in order.
func keys(calls []testenv.StripeCall) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = c.IdempotencyKey
	}
	return out
}

// wantKeys is the keys of a whole export of an invoice of n lines, with
// the customer's first when it is made.
func wantKeys(tenant, invoice string, n int, customer bool) []string {
	var out []string
	if customer {
		out = append(out, stripeexport.CustomerKey(tenant))
	}
	out = append(out, stripeexport.InvoiceKey(invoice, "create"))
	for i := 1; i <= n; i++ {
		out = append(out, stripeexport.LineKey(invoice, i))
	}
	return append(out, stripeexport.InvoiceKey(invoice, "finalize"))
}

// TestExportMakesEachThingOnceWithItsKey exports a final invoice through
// the recording proxy: a customer for the tenant, a draft invoice, an
// invoice item per line with its amount, the finalization, each with its
// idempotency key, and the ids Stripe answered stored. Nothing is sent
// again on the next Run, the tenant's next invoice reuses its customer,
// and a draft is never exported.
func TestExportMakesEachThingOnceWithItsKey(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	tenant := r.tenant(t, "Acme Rockets")
	inv := r.invoice(t, tenant, "2026-11", true, threeLines...)
	draft := r.invoice(t, tenant, "2026-12", false, threeLines[:1]...)
	r.run(t)

	calls := r.proxy.Calls()
	if got, want := keys(calls), wantKeys(tenant, inv, 3, true); !reflect.DeepEqual(got, want) {
		t.Fatalf("idempotency keys = %q, want %q", got, want)
	}
	for _, c := range calls {
		if c.Method != "POST" || c.Status != 200 {
			t.Errorf("%s %s (%s) answered %d, want a POST answered 200", c.Method, c.Path, c.IdempotencyKey, c.Status)
		}
	}
	cust, create, fin := calls[0], calls[1], calls[5]
	if cust.Path != "/v1/customers" || cust.Form.Get("name") != "Acme Rockets" || cust.Form.Get("metadata[tollgate_tenant_id]") != tenant {
		t.Errorf("customer call %s %v, want POST /v1/customers named Acme Rockets with the tenant id", cust.Path, cust.Form)
	}
	if cust.ID == "" || r.customerID(t, tenant) != cust.ID {
		t.Errorf("stored customer id %q, want %q, the id Stripe answered", r.customerID(t, tenant), cust.ID)
	}
	for k, want := range map[string]string{"customer": cust.ID, "currency": "usd", "auto_advance": "false",
		"pending_invoice_items_behavior": "exclude", "metadata[tollgate_invoice_id]": inv, "metadata[tollgate_period]": "2026-11"} {
		if got := create.Form.Get(k); create.Path != "/v1/invoices" || got != want {
			t.Errorf("invoice create %s: %s = %q, want %q", create.Path, k, got, want)
		}
	}
	for i, l := range threeLines {
		c := calls[2+i]
		for k, want := range map[string]string{"amount": fmt.Sprint(l.AmountCents), "currency": "usd", "customer": cust.ID,
			"invoice": create.ID, "description": l.Description, "metadata[tollgate_line]": fmt.Sprint(i + 1)} {
			if got := c.Form.Get(k); c.Path != "/v1/invoiceitems" || got != want {
				t.Errorf("line %d: %s %s = %q, want %q", i+1, c.Path, k, got, want)
			}
		}
	}
	if fin.Path != "/v1/invoices/"+create.ID+"/finalize" || fin.Form.Get("auto_advance") != "true" {
		t.Errorf("finalize call %s %v, want POST /v1/invoices/%s/finalize with auto_advance", fin.Path, fin.Form, create.ID)
	}
	x := r.export(t, inv)
	if want := (export{Status: "exported", StripeID: create.ID, LinesDone: 3, Attempts: 1, Next: x.Next, Exported: true}); x != want {
		t.Errorf("export row %+v, want %+v", x, want)
	}
	if r.exp.Exported.Load() != 1 || r.exp.Failed.Load() != 0 || r.exp.Failing() != 0 {
		t.Errorf("counters exported %d failed %d failing %d, want 1 0 0", r.exp.Exported.Load(), r.exp.Failed.Load(), r.exp.Failing())
	}

	r.clock.Advance(time.Hour)
	r.run(t)
	if calls := r.proxy.Calls(); len(calls) != 0 {
		t.Fatalf("a second Run made %d calls (%q), want none", len(calls), keys(calls))
	}
	var n int
	if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM invoice_exports WHERE invoice_id = $1`, draft).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the draft has %d export rows (%v), want none", n, err)
	}

	next := r.invoice(t, tenant, "2026-10", true, threeLines[:2]...)
	r.clock.Advance(time.Hour)
	r.run(t)
	calls = r.proxy.Calls()
	if got, want := keys(calls), wantKeys(tenant, next, 2, false); !reflect.DeepEqual(got, want) {
		t.Fatalf("the tenant's next invoice: keys %q, want %q (no second customer)", got, want)
	}
	if got := calls[0].Form.Get("customer"); got != cust.ID {
		t.Errorf("the next invoice's customer %q, want the stored %q", got, cust.ID)
	}
}

// TestExportStoppedMidwayResumesWithTheSameKeys stops the worker (its
// context ends) right after each call of an export in turn, before the
// answer reaches it, then runs it again once the stopped attempt's lease
// has passed: every call is made with the same key and the same
// parameters as before, so Stripe makes each thing once, and the invoice
// ends exported once.
func TestExportStoppedMidwayResumesWithTheSameKeys(t *testing.T) {
	t.Parallel()
	for stopAfter := 1; stopAfter <= 6; stopAfter++ {
		t.Run(fmt.Sprintf("after call %d", stopAfter), func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			tenant := r.tenant(t, "Stopped Co")
			inv := r.invoice(t, tenant, "2026-11", true, threeLines...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r.proxy.AfterForward(func(n int, _ testenv.StripeCall) bool {
				if n == stopAfter {
					cancel()
					return true
				}
				return false
			})
			if err := r.exp.Run(ctx); err == nil {
				t.Fatal("Run stopped by its context returned nil, want the context's error")
			}
			first := r.proxy.Calls()
			if len(first) != stopAfter {
				t.Fatalf("the stopped Run made %d calls (%q), want %d", len(first), keys(first), stopAfter)
			}
			r.proxy.AfterForward(nil)

			// Another worker finds it held until the lease passes.
			r.clock.Advance(stripeexport.DefaultLease - time.Second)
			r.run(t)
			if calls := r.proxy.Calls(); len(calls) != 0 {
				t.Fatalf("a Run within the stopped one's lease made calls %q, want none", keys(calls))
			}
			r.clock.Advance(2 * time.Second)
			if err := r.exporter().Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			second := r.proxy.Calls()

			all := append(first, second...)
			byKey := map[string]testenv.StripeCall{}
			var distinct []string
			for _, c := range all {
				if prev, ok := byKey[c.IdempotencyKey]; ok {
					if prev.Path != c.Path || !reflect.DeepEqual(prev.Form, c.Form) {
						t.Errorf("key %s sent again with %s %v, first with %s %v", c.IdempotencyKey, c.Path, c.Form, prev.Path, prev.Form)
					}
					// Stripe answers a key's repeat with the first answer;
					// stripe-mock with a new id, which the worker keeps.
					byKey[c.IdempotencyKey] = c
					continue
				}
				byKey[c.IdempotencyKey] = c
				distinct = append(distinct, c.IdempotencyKey)
			}
			if want := wantKeys(tenant, inv, 3, true); !reflect.DeepEqual(distinct, want) {
				t.Fatalf("keys across both runs %q, want %q", distinct, want)
			}
			// Only the call whose answer was lost is made again.
			if len(all) != len(distinct)+1 || all[stopAfter].IdempotencyKey != all[stopAfter-1].IdempotencyKey {
				t.Errorf("calls %q: want only call %d repeated", keys(all), stopAfter)
			}
			x := r.export(t, inv)
			if x.Status != "exported" || !x.Exported || x.LinesDone != 3 || x.StripeID != byKey[stripeexport.InvoiceKey(inv, "create")].ID {
				t.Errorf("export row %+v, want exported with 3 lines and Stripe's invoice id", x)
			}
			if got, want := r.customerID(t, tenant), byKey[stripeexport.CustomerKey(tenant)].ID; got != want {
				t.Errorf("customer id %q, want %q", got, want)
			}
			var rows int
			if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM invoice_exports`).Scan(&rows); err != nil || rows != 1 {
				t.Errorf("%d export rows (%v), want 1", rows, err)
			}
		})
	}
}

// TestFailedExportIsRetriedWithBackoff fails a call of an export (Stripe
// answers 500): the attempt is recorded failed with Stripe's error, the
// ids obtained so far kept, and retried only after the backoff, which
// doubles with each failure up to its bound; the retry goes on from the
// failed call, with the same keys.
func TestFailedExportIsRetriedWithBackoff(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	tenant := r.tenant(t, "Flaky Inc")
	inv := r.invoice(t, tenant, "2026-11", true, threeLines...)
	failing := true
	var mu sync.Mutex
	r.proxy.FailWith(func(_ int, c testenv.StripeCall) int {
		mu.Lock()
		defer mu.Unlock()
		if failing && c.IdempotencyKey == stripeexport.LineKey(inv, 2) {
			return 500
		}
		return 0
	})
	r.run(t)
	calls := r.proxy.Calls()
	if got, want := keys(calls), wantKeys(tenant, inv, 3, true)[:4]; !reflect.DeepEqual(got, want) {
		t.Fatalf("keys %q, want %q (stopped at the failed line)", got, want)
	}
	x := r.export(t, inv)
	if x.Status != "failed" || x.Attempts != 1 || x.LinesDone != 1 || x.StripeID != calls[1].ID || x.Exported ||
		!x.Next.Equal(start.Add(30*time.Second)) {
		t.Errorf("after a failed attempt: %+v, want failed, 1 attempt, 1 line done, Stripe's invoice id, retried at %s", x, start.Add(30*time.Second))
	}
	for _, want := range []string{"create invoice item for line 2", "HTTP 500", "api_error", "the test's proxy failed this call", "req_proxy_failed"} {
		if !strings.Contains(x.LastError, want) {
			t.Errorf("last_error %q lacks %q", x.LastError, want)
		}
	}
	if r.exp.Failed.Load() != 1 || r.exp.Failing() != 1 || r.exp.Exported.Load() != 0 {
		t.Errorf("counters failed %d failing %d exported %d, want 1 1 0", r.exp.Failed.Load(), r.exp.Failing(), r.exp.Exported.Load())
	}

	r.clock.Advance(29 * time.Second)
	r.run(t)
	if calls := r.proxy.Calls(); len(calls) != 0 {
		t.Fatalf("a Run before the backoff made calls %q, want none", keys(calls))
	}
	r.clock.Advance(time.Second) // 30 s: the second attempt, failing again
	r.run(t)
	if got, want := keys(r.proxy.Calls()), []string{stripeexport.LineKey(inv, 2)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("second attempt keys %q, want %q: it goes on from the failed line", got, want)
	}
	if x := r.export(t, inv); x.Attempts != 2 || !x.Next.Equal(r.clock.Now().Add(time.Minute)) {
		t.Errorf("after two failures: %+v, want 2 attempts, retried a minute later", x)
	}

	mu.Lock()
	failing = false
	mu.Unlock()
	r.clock.Advance(time.Minute)
	r.run(t)
	if got, want := keys(r.proxy.Calls()), wantKeys(tenant, inv, 3, true)[3:]; !reflect.DeepEqual(got, want) {
		t.Fatalf("third attempt keys %q, want %q", got, want)
	}
	if x := r.export(t, inv); x.Status != "exported" || x.Attempts != 3 || x.LastError != "" || !x.Exported {
		t.Errorf("after the retry: %+v, want exported after 3 attempts, no error left", x)
	}
	if r.exp.Failing() != 0 || r.exp.Exported.Load() != 1 || r.exp.Failed.Load() != 2 {
		t.Errorf("counters failing %d exported %d failed %d, want 0 1 2", r.exp.Failing(), r.exp.Exported.Load(), r.exp.Failed.Load())
	}

	for n, want := range map[int]time.Duration{1: 30 * time.Second, 2: time.Minute, 3: 2 * time.Minute, 8: time.Hour, 1000: time.Hour} {
		if got := r.exp.Backoff(n); got != want {
			t.Errorf("Backoff(%d) = %s, want %s", n, got, want)
		}
	}
}

// TestExportBoundedPerRun: one Run exports at most Batch invoices, and
// starts none once its Budget has passed; the rest wait for the next Runs.
func TestExportBoundedPerRun(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	tenant := r.tenant(t, "Many Months")
	for m := 1; m <= 5; m++ {
		r.invoice(t, tenant, fmt.Sprintf("2026-%02d", m), true, threeLines[:1]...)
	}
	r.exp.Batch = 2
	r.run(t)
	if got := r.exp.Exported.Load(); got != 2 {
		t.Fatalf("one Run with Batch 2 exported %d, want 2", got)
	}
	r.exp.Batch = 10
	r.exp.Budget = time.Second
	// Each call takes a second of the Exporter's clock: the budget is
	// spent within the first export.
	r.proxy.AfterForward(func(int, testenv.StripeCall) bool { r.clock.Advance(time.Second); return false })
	r.run(t)
	if got := r.exp.Exported.Load(); got != 3 {
		t.Fatalf("a Run whose budget passed during its first export: %d exported in all, want 3", got)
	}
	r.proxy.AfterForward(nil)
	r.run(t)
	if got := r.exp.Exported.Load(); got != 5 {
		t.Fatalf("after a third Run: %d exported, want 5", got)
	}
}

// TestTwoWorkersExportEachInvoiceOnce runs two Exporters (two workers) at
// once over invoices of several tenants: each call is made once.
func TestTwoWorkersExportEachInvoiceOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var invoices []string
	for i := range 6 {
		invoices = append(invoices, r.invoice(t, r.tenant(t, fmt.Sprintf("Tenant %d", i)), "2026-11", true, threeLines[:2]...))
	}
	a, b := r.exporter(), r.exporter()
	var wg sync.WaitGroup
	for _, e := range []*stripeexport.Exporter{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.Run(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	seen := map[string]int{}
	for _, c := range r.proxy.Calls() {
		seen[c.IdempotencyKey]++
	}
	if len(seen) != 6*5 {
		t.Errorf("%d distinct keys, want %d (6 invoices of 5 calls)", len(seen), 6*5)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("key %s sent %d times, want once", k, n)
		}
	}
	if got := a.Exported.Load() + b.Exported.Load(); got != 6 {
		t.Errorf("%d exported by both, want 6", got)
	}
	for _, inv := range invoices {
		if x := r.export(t, inv); x.Status != "exported" || x.Attempts != 1 {
			t.Errorf("%s: %+v, want exported in one attempt", inv, x)
		}
	}
}

// TestStripeRefusalIsRecorded: stripe-mock itself refuses a key that is not
// a test key, as Stripe refuses a revoked one; the export is recorded failed
// with Stripe's status, type and message, and nothing is stored.
func TestStripeRefusalIsRecorded(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	tenant := r.tenant(t, "Revoked Key Ltd")
	inv := r.invoice(t, tenant, "2026-11", true, threeLines...)
	r.exp = stripeexport.New(r.db, "sk_live_revoked", r.proxy.URL, nil, r.clock.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	r.run(t)
	calls := r.proxy.Calls()
	if len(calls) != 1 || calls[0].Status != 401 {
		t.Fatalf("calls %+v, want one, answered 401 by stripe-mock", calls)
	}
	x := r.export(t, inv)
	if x.Status != "failed" || x.Attempts != 1 || x.StripeID != "" || r.customerID(t, tenant) != "" ||
		!strings.HasPrefix(x.LastError, "create customer: HTTP 401 invalid_request_error: ") || !strings.Contains(x.LastError, "API key") {
		t.Errorf("export %+v, customer %q; want failed with stripe-mock's 401 and nothing stored", x, r.customerID(t, tenant))
	}
	if r.exp.Failing() != 1 {
		t.Errorf("Failing() = %d, want 1", r.exp.Failing())
	}
}

// TestSlowStripeIsAFailedAttempt: a call still unanswered when the step's
// time is up (its context's deadline) fails the attempt, recorded and
// retried with backoff like an error, unlike a worker that stops.
func TestSlowStripeIsAFailedAttempt(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	tenant := r.tenant(t, "Slow Lane")
	inv := r.invoice(t, tenant, "2026-11", true, threeLines...)
	short, cancelShort := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancelShort()
	r.proxy.AfterForward(func(n int, _ testenv.StripeCall) bool {
		if n == 2 { // Stripe answers only after the step's time is up
			<-short.Done()
			return true
		}
		return false
	})
	if err := r.exp.Run(short); err == nil {
		t.Fatal("Run past its deadline returned nil, want the context's error")
	}
	x := r.export(t, inv)
	if x.Status != "failed" || x.Attempts != 1 || !strings.Contains(x.LastError, "create invoice") ||
		!strings.Contains(x.LastError, "deadline") || !x.Next.Equal(start.Add(30*time.Second)) {
		t.Errorf("export %+v, want failed by the deadline while creating the invoice, retried in 30 s", x)
	}
	if r.exp.Failed.Load() != 1 || r.exp.Failing() != 1 {
		t.Errorf("counters failed %d failing %d, want 1 1", r.exp.Failed.Load(), r.exp.Failing())
	}
}
