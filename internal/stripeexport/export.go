// Package stripeexport exports final invoices to Stripe: each tenant a
// Customer (created once, its id kept in tenants.stripe_customer_id), each
// final invoice a Stripe Invoice with one InvoiceItem per line, then
// finalized. Every call carries an idempotency key derived from the invoice
// id (and line), and every Stripe id is stored as soon as Stripe returns
// it, so a worker stopped in the middle of an export, run again, makes each
// thing once.
//
// The invoice_exports table is the queue: a row per final invoice, pending
// until exported; a failed attempt is recorded (status failed, last_error)
// and retried with exponential backoff. A worker claims one export at a
// time with FOR UPDATE SKIP LOCKED, moving its next_attempt_at one Lease
// ahead, and writes progress only while it still holds that lease, so two
// workers never export the same invoice at once.
//
// It never changes an invoice: it reads final ones and writes only
// invoice_exports and tenants.stripe_customer_id. It owns no HTTP route;
// the console reads the exports through billing.Invoice.Export.
package stripeexport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v82"

	"github.com/tollgate/tollgate/internal/billing"
)

// Defaults of the Exporter's tunables.
const (
	DefaultBatch       = 20
	DefaultBudget      = 5 * time.Second
	DefaultLease       = 2 * time.Minute
	DefaultBackoffBase = 30 * time.Second
	DefaultBackoffMax  = time.Hour
	DefaultScanEvery   = time.Minute
	DefaultCallTimeout = 20 * time.Second
	// scanLimit bounds the final invoices one scan queues.
	scanLimit     = 1000
	maxLastError  = 500 // characters of last_error kept
	keyPrefix     = "tollgate-"
	metaInvoiceID = "tollgate_invoice_id"
	metaTenantID  = "tollgate_tenant_id"
)

// errLostLease: another worker took the export over (this one's lease
// passed); this one stops without recording anything.
var errLostLease = errors.New("stripe export: lease lost to another worker")

// Exporter is one idempotent worker step that exports final invoices to
// Stripe. Set its exported tunables before the first Run; the counters may
// be read at any time.
type Exporter struct {
	db     *pgxpool.Pool
	ledger *billing.Ledger
	sc     *stripe.Client
	now    func() time.Time
	log    *slog.Logger

	// Batch bounds the invoices one Run exports; Budget the time (on the
	// Exporter's clock) after which a Run starts no new export, so that
	// exporting never holds the worker's cycle for long.
	Batch  int
	Budget time.Duration
	// Lease is how long a claim keeps other workers off an export; a
	// worker that dies mid-export leaves it to be claimed again after it.
	Lease time.Duration
	// The n-th failed attempt in a row is retried BackoffBase × 2^(n-1)
	// later, at most BackoffMax: retried for ever, at most that far apart.
	BackoffBase, BackoffMax time.Duration
	// ScanEvery spaces the scans for final invoices that have no export
	// yet; zero scans on every Run.
	ScanEvery time.Duration

	// Counters since the Exporter was made, for metrics: invoices
	// exported, and failed attempts (each retried).
	Exported atomic.Int64
	Failed   atomic.Int64
	failing  atomic.Int64

	mu       sync.Mutex // one Run at a time; guards lastScan
	lastScan time.Time
}

// New returns an Exporter on db that calls the Stripe API at baseURL
// (https://api.stripe.com, or a stripe-mock) with key, through client (nil:
// one whose requests time out after DefaultCallTimeout). The Stripe client
// does not retry by itself: a failed call fails the attempt, which the
// Exporter retries with its backoff. now is the clock of leases, retry
// times and budgets.
func New(db *pgxpool.Pool, key, baseURL string, client *http.Client, now func() time.Time, log *slog.Logger) *Exporter {
	if client == nil {
		client = &http.Client{Timeout: DefaultCallTimeout}
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(baseURL),
		HTTPClient:        client,
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	sc := stripe.NewClient(key, stripe.WithBackends(&stripe.Backends{
		API: backend, Connect: backend, Uploads: backend, MeterEvents: backend,
	}))
	return &Exporter{
		db: db, ledger: billing.NewLedger(db), sc: sc, now: now, log: log,
		Batch: DefaultBatch, Budget: DefaultBudget, Lease: DefaultLease,
		BackoffBase: DefaultBackoffBase, BackoffMax: DefaultBackoffMax, ScanEvery: DefaultScanEvery,
	}
}

// Failing is the number of invoices whose last export attempt failed, as
// of the end of the last Run.
func (e *Exporter) Failing() int64 { return e.failing.Load() }

// Backoff is the delay before the attempt after the n-th failed one in a
// row (n ≥ 1).
func (e *Exporter) Backoff(n int) time.Duration {
	d := e.BackoffBase
	for i := 1; i < n && d < e.BackoffMax; i++ {
		d *= 2
	}
	return min(d, e.BackoffMax)
}

// Run is one idempotent worker step: it queues the final invoices that
// have no export yet (at most every ScanEvery), then exports due ones, one
// at a time, until none is due, Batch are done or Budget has passed. A
// failed export is recorded and counted, not returned: the step fails only
// when Postgres does, or when ctx ends.
func (e *Exporter) Run(ctx context.Context) error {
	if e.Batch < 1 || e.Lease <= 0 || e.BackoffBase <= 0 || e.BackoffMax < e.BackoffBase {
		return errors.New("stripe export: need Batch ≥ 1, Lease > 0 and BackoffMax ≥ BackoffBase > 0")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	start := e.now()
	if err := e.scan(ctx, start); err != nil {
		return err
	}
	defer e.countFailing(ctx)
	for n := 0; n < e.Batch; n++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if n > 0 && e.now().Sub(start) >= e.Budget {
			return nil
		}
		c, ok, err := e.claim(ctx)
		if err != nil || !ok {
			return err
		}
		if err := e.attempt(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// scan queues, oldest first, the final invoices without an export row.
func (e *Exporter) scan(ctx context.Context, now time.Time) error {
	if !e.lastScan.IsZero() && now.Sub(e.lastScan) < e.ScanEvery {
		return nil
	}
	tag, err := e.db.Exec(ctx, `
		INSERT INTO invoice_exports (invoice_id, next_attempt_at, created_at, updated_at)
		SELECT i.id, $1, $1, $1 FROM invoices i
		WHERE i.status = 'final' AND NOT EXISTS (SELECT 1 FROM invoice_exports x WHERE x.invoice_id = i.id)
		ORDER BY i.finalized_at, i.id LIMIT $2
		ON CONFLICT (invoice_id) DO NOTHING`, now, scanLimit)
	if err != nil {
		return fmt.Errorf("stripe export: queue final invoices: %w", err)
	}
	if tag.RowsAffected() < scanLimit { // else more are left: scan again next Run
		e.lastScan = now
	}
	return nil
}

// countFailing refreshes Failing.
func (e *Exporter) countFailing(ctx context.Context) {
	var n int64
	if err := e.db.QueryRow(context.WithoutCancel(ctx), `SELECT count(*) FROM invoice_exports WHERE status = 'failed'`).Scan(&n); err == nil {
		e.failing.Store(n)
	}
}

// claim is an export this worker holds until lease.
type claim struct {
	invoiceID       string
	stripeInvoiceID string
	linesDone       int
	attempts        int
	lease           time.Time
}

// claim takes the export due first, if any, for one Lease.
func (e *Exporter) claim(ctx context.Context) (claim, bool, error) {
	now := e.now()
	var c claim
	var sid *string
	err := e.db.QueryRow(ctx, `
		UPDATE invoice_exports x SET next_attempt_at = $2, updated_at = $1
		WHERE x.invoice_id = (SELECT invoice_id FROM invoice_exports
		                      WHERE status <> 'exported' AND next_attempt_at <= $1
		                      ORDER BY next_attempt_at, invoice_id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING x.invoice_id::text, x.stripe_invoice_id, x.lines_done, x.attempts, x.next_attempt_at`,
		now, now.Add(e.Lease)).Scan(&c.invoiceID, &sid, &c.linesDone, &c.attempts, &c.lease)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("stripe export: claim: %w", err)
	}
	if sid != nil {
		c.stripeInvoiceID = *sid
	}
	return c, true, nil
}

// attempt exports c and records the outcome. Only a Postgres failure while
// recording, or ctx ending, is returned. An export cut short because the
// worker is stopping (ctx cancelled) keeps what it stored and is taken up
// again when its lease has passed; one cut short by ctx's deadline (the
// step's time is up: Stripe is slow) is a failed attempt like any other.
func (e *Exporter) attempt(ctx context.Context, c claim) error {
	err := e.export(ctx, &c)
	switch {
	case err == nil:
		ok, err := e.record(ctx, c, `status = 'exported', exported_at = $3, last_error = ''`)
		if ok {
			e.Exported.Add(1)
		}
		return err
	case errors.Is(err, errLostLease):
		e.log.Warn("stripe export: lease lost; another worker goes on", "invoice_id", c.invoiceID)
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		return ctx.Err()
	}
	msg := errorText(err)
	delay := e.Backoff(c.attempts + 1)
	e.log.Error("stripe export failed", "invoice_id", c.invoiceID, "attempt", c.attempts+1, "retry_in", delay.String(), "err", msg)
	e.Failed.Add(1)
	if _, err := e.record(ctx, c, `status = 'failed', last_error = $4, next_attempt_at = $5`, msg, e.now().Add(delay)); err != nil {
		return err
	}
	return ctx.Err()
}

// record ends an attempt with set (whose $3 is now), counting it, while c
// still holds its lease; it reports whether c did.
func (e *Exporter) record(ctx context.Context, c claim, set string, args ...any) (bool, error) {
	tag, err := e.db.Exec(context.WithoutCancel(ctx), `UPDATE invoice_exports SET `+set+`, attempts = attempts + 1, updated_at = $3
		WHERE invoice_id = $1 AND next_attempt_at = $2`, append([]any{c.invoiceID, c.lease, e.now()}, args...)...)
	if err != nil {
		return false, fmt.Errorf("stripe export: record %s: %w", c.invoiceID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// progress stores one step of c's export while c holds its lease.
func (e *Exporter) progress(ctx context.Context, c *claim, set string, arg any) error {
	tag, err := e.db.Exec(context.WithoutCancel(ctx), `UPDATE invoice_exports SET `+set+`, updated_at = $3
		WHERE invoice_id = $1 AND next_attempt_at = $2`, c.invoiceID, c.lease, e.now(), arg)
	if err != nil {
		return fmt.Errorf("stripe export: store progress of %s: %w", c.invoiceID, err)
	}
	if tag.RowsAffected() != 1 {
		return errLostLease
	}
	return nil
}

// export makes what is missing of c's invoice in Stripe: the tenant's
// customer, the invoice, its items from line lines_done+1 on, then the
// finalization; each id and step is stored as soon as Stripe answers.
func (e *Exporter) export(ctx context.Context, c *claim) error {
	inv, err := e.ledger.Invoice(ctx, c.invoiceID)
	if err != nil {
		return err
	}
	if inv.Status != "final" {
		return fmt.Errorf("invoice %s is %s, not final", inv.ID, inv.Status)
	}
	customer, err := e.customer(ctx, inv.TenantID)
	if err != nil {
		return err
	}
	if c.stripeInvoiceID == "" {
		p := &stripe.InvoiceCreateParams{
			Customer:                    stripe.String(customer),
			Currency:                    stripe.String(inv.Currency),
			AutoAdvance:                 stripe.Bool(false), // finalized below, once every item is on it
			PendingInvoiceItemsBehavior: stripe.String("exclude"),
			Description:                 stripe.String("Tollgate usage, " + inv.Period),
			Metadata: map[string]string{metaInvoiceID: inv.ID, metaTenantID: inv.TenantID, "tollgate_period": inv.Period,
				"tollgate_total_cents": strconv.FormatInt(inv.TotalCents, 10)},
		}
		p.SetIdempotencyKey(InvoiceKey(inv.ID, "create"))
		si, err := e.sc.V1Invoices.Create(ctx, p)
		if err != nil {
			return fmt.Errorf("create invoice: %w", err)
		}
		if err := e.progress(ctx, c, `stripe_invoice_id = $4`, si.ID); err != nil {
			return err
		}
		c.stripeInvoiceID = si.ID
	}
	for n := c.linesDone + 1; n <= len(inv.Lines); n++ {
		l := inv.Lines[n-1]
		p := &stripe.InvoiceItemCreateParams{
			Customer:    stripe.String(customer),
			Invoice:     stripe.String(c.stripeInvoiceID),
			Amount:      stripe.Int64(l.AmountCents),
			Currency:    stripe.String(inv.Currency),
			Description: stripe.String(l.Description),
			Metadata: map[string]string{metaInvoiceID: inv.ID, "tollgate_line": strconv.Itoa(n),
				"tollgate_kind": l.Kind, "tollgate_quantity": strconv.FormatInt(l.Quantity, 10)},
		}
		p.SetIdempotencyKey(LineKey(inv.ID, n))
		if _, err := e.sc.V1InvoiceItems.Create(ctx, p); err != nil {
			return fmt.Errorf("create invoice item for line %d: %w", n, err)
		}
		if err := e.progress(ctx, c, `lines_done = $4`, n); err != nil {
			return err
		}
		c.linesDone = n
	}
	// Stripe collects from here on (auto_advance).
	p := &stripe.InvoiceFinalizeInvoiceParams{AutoAdvance: stripe.Bool(true)}
	p.SetIdempotencyKey(InvoiceKey(inv.ID, "finalize"))
	if _, err := e.sc.V1Invoices.FinalizeInvoice(ctx, c.stripeInvoiceID, p); err != nil {
		return fmt.Errorf("finalize invoice %s: %w", c.stripeInvoiceID, err)
	}
	return nil
}

// customer returns the tenant's Stripe customer id, creating the customer
// the first time (one per tenant, whatever the number of workers or
// attempts: the key is the tenant's).
func (e *Exporter) customer(ctx context.Context, tenantID string) (string, error) {
	var name string
	var id *string
	if err := e.db.QueryRow(ctx, `SELECT name, stripe_customer_id FROM tenants WHERE id = $1`, tenantID).Scan(&name, &id); err != nil {
		return "", fmt.Errorf("stripe export: tenant %s: %w", tenantID, err)
	}
	if id != nil {
		return *id, nil
	}
	p := &stripe.CustomerCreateParams{
		Name:     stripe.String(name),
		Metadata: map[string]string{metaTenantID: tenantID},
	}
	p.SetIdempotencyKey(CustomerKey(tenantID))
	cu, err := e.sc.V1Customers.Create(ctx, p)
	if err != nil {
		return "", fmt.Errorf("create customer: %w", err)
	}
	var stored string
	if err := e.db.QueryRow(context.WithoutCancel(ctx), `UPDATE tenants SET stripe_customer_id = coalesce(stripe_customer_id, $2)
		WHERE id = $1 RETURNING stripe_customer_id`, tenantID, cu.ID).Scan(&stored); err != nil {
		return "", fmt.Errorf("stripe export: store customer of %s: %w", tenantID, err)
	}
	return stored, nil
}

// CustomerKey is the idempotency key of the creation of a tenant's
// customer.
func CustomerKey(tenantID string) string { return keyPrefix + "cust-" + tenantID }

// InvoiceKey is the idempotency key of a step of an invoice's export
// ("create", "finalize").
func InvoiceKey(invoiceID, step string) string { return keyPrefix + "inv-" + invoiceID + "-" + step }

// LineKey is the idempotency key of the invoice item of line n (from 1).
func LineKey(invoiceID string, n int) string {
	return keyPrefix + "inv-" + invoiceID + "-line-" + strconv.Itoa(n)
}

// errorText is what last_error keeps of err: Stripe's status, type, code
// and message when Stripe answered, at most maxLastError characters.
func errorText(err error) string {
	msg := err.Error()
	var se *stripe.Error
	if errors.As(err, &se) {
		msg = fmt.Sprintf("HTTP %d", se.HTTPStatusCode)
		if se.Type != "" {
			msg += " " + string(se.Type)
		}
		if se.Code != "" {
			msg += " (" + string(se.Code) + ")"
		}
		if se.Msg != "" {
			msg += ": " + se.Msg
		}
		if se.RequestID != "" {
			msg += " [request " + se.RequestID + "]"
		}
		// the step that failed, from the wrapping ("create invoice: ")
		if step, ok := strings.CutSuffix(err.Error(), se.Error()); ok {
			msg = step + msg
		}
	}
	if utf8.RuneCountInString(msg) > maxLastError {
		r := []rune(msg)
		msg = string(r[:maxLastError-1]) + "…"
	}
	return msg
}
