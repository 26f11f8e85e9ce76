package api

import (
	"context"
	"html"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/stripeexport"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestConsoleShowsStripeExports exports two final invoices to stripe-mock
// through a recording proxy that fails one tenant's customer: the
// console's invoice list and tenant page show the failed export with
// Stripe's error and its next attempt, and the other exported with its
// Stripe invoice id; the tenants' own dashboard shows neither.
func TestConsoleShowsStripeExports(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustStack(t)
	proxy := testenv.NewStripeProxy(t, testenv.StripeMockURL(t))
	good, _ := s.tenant("free")
	broken, brokenKey := s.tenant("free")
	invoice := func(tenant string) string {
		var id string
		if err := s.pool.QueryRow(ctx, `INSERT INTO invoices (tenant_id, period, status, finalized_at, total_cents)
			VALUES ($1, '2026-11-01', 'final', '2026-12-01T00:00:00Z', 2900) RETURNING id::text`, tenant).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if _, err := s.pool.Exec(ctx, `INSERT INTO invoice_lines (invoice_id, line_no, kind, description, quantity, amount_cents)
			VALUES ($1, 1, 'subscription', 'Pro plan', 1, 2900)`, id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	goodInv, brokenInv := invoice(good.ID), invoice(broken.ID)
	proxy.FailWith(func(_ int, c testenv.StripeCall) int {
		if c.IdempotencyKey == stripeexport.CustomerKey(broken.ID) {
			return 500
		}
		return 0
	})
	now := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	exp := stripeexport.New(s.pool, "sk_test_tollgate", proxy.URL, nil, func() time.Time { return now },
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := exp.Run(ctx); err != nil {
		t.Fatal(err)
	}
	var stripeID string
	for _, c := range proxy.Calls() {
		if c.IdempotencyKey == stripeexport.InvoiceKey(goodInv, "create") {
			stripeID = c.ID
		}
	}
	if stripeID == "" {
		t.Fatal("the good tenant's invoice was not created in Stripe")
	}

	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	list := c.get("/console/invoices?period=2026-11")
	if list.status != 200 {
		t.Fatalf("GET /console/invoices: %d", list.status)
	}
	row := func(body []byte, id string) string {
		page := string(body)
		i := strings.Index(page, `data-invoice="`+id+`"`)
		if i < 0 {
			t.Fatalf("no row of invoice %s in the page", id)
		}
		// to the next invoice's, or the end of the page
		end := strings.Index(page[i+1:], `data-invoice="`) + 1
		if end <= 0 {
			end = len(page) - i
		}
		return html.UnescapeString(page[i : i+end])
	}
	failed := row(list.body, brokenInv)
	for _, want := range []string{"export failed", "after 1 attempt,", "create customer: HTTP 500 api_error: the test's proxy failed this call"} {
		if !strings.Contains(failed, want) {
			t.Errorf("the failed export's row lacks %q:\n%s", want, failed)
		}
	}
	if exported := row(list.body, goodInv); !strings.Contains(exported, "exported to Stripe") || !strings.Contains(exported, stripeID) {
		t.Errorf("the exported invoice's row lacks its export and Stripe id %s:\n%s", stripeID, exported)
	}

	tenantPage := c.get("/console/tenants/" + broken.ID)
	if tenantPage.status != 200 {
		t.Fatalf("GET /console/tenants/%s: %d", broken.ID, tenantPage.status)
	}
	if r := row(tenantPage.body, brokenInv); !strings.Contains(r, "export failed") || !strings.Contains(r, "HTTP 500") {
		t.Errorf("the tenant page's invoice lacks the failed export:\n%s", r)
	}

	d := newWebClient(t, base)
	d.mustSignIn("dashboard", brokenKey)
	if r := d.get("/dashboard"); r.status != 200 || strings.Contains(string(r.body), "export failed") || strings.Contains(string(r.body), "HTTP 500") {
		t.Errorf("the tenant's dashboard (%d) shows the Stripe export", r.status)
	}
}
