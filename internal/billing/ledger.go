package billing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Ledger reads and writes the usage ledger and invoices in Postgres.
type Ledger struct {
	db *pgxpool.Pool
}

// NewLedger returns a Ledger on db.
func NewLedger(db *pgxpool.Pool) *Ledger { return &Ledger{db: db} }

// Totals are usage summed over a period: units, requests admitted and
// requests refused.
type Totals struct {
	Units    int64 `json:"units"`
	Requests int64 `json:"requests"`
	Rejected int64 `json:"rejected"`
}

// TenantTotals returns the flushed usage in [from, to) of each tenant of
// ids, summed over meters and hours; tenants without usage are absent. A
// month whose detail the retention dropped counts as at its first instant.
func (l *Ledger) TenantTotals(ctx context.Context, ids []string, from, to time.Time) (map[string]Totals, error) {
	rows, err := l.db.Query(ctx, `
		SELECT tenant_id::text, sum(units)::bigint, sum(requests)::bigint, sum(rejected)::bigint
		FROM usage_ledger WHERE tenant_id = ANY($1::uuid[]) AND hour >= $2 AND hour < $3
		GROUP BY tenant_id`, ids, from, to)
	if err != nil {
		return nil, fmt.Errorf("billing: tenant totals: %w", err)
	}
	defer rows.Close()
	out := make(map[string]Totals, len(ids))
	for rows.Next() {
		var id string
		var t Totals
		if err := rows.Scan(&id, &t.Units, &t.Requests, &t.Rejected); err != nil {
			return nil, fmt.Errorf("billing: tenant totals: %w", err)
		}
		out[id] = t
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("billing: tenant totals: %w", err)
	}
	return out, nil
}

// Invoice is a tenant's bill for one of its billing periods: a calendar
// month (UTC) for the default calendar, from the anchor day's local
// midnight to the next otherwise (see Invoicer).
type Invoice struct {
	ID       string `json:"id"`
	TenantID string `json:"tenant_id"`
	// Period labels the invoice, YYYY-MM: the month of the period's first
	// local date (the month the period is named after).
	Period string `json:"period"`
	// PeriodStart and PeriodEnd are the billing period the invoice covers,
	// [start, end), as UTC instants.
	PeriodStart time.Time     `json:"period_start"`
	PeriodEnd   time.Time     `json:"period_end"`
	Status      string        `json:"status"` // draft or final
	Currency    string        `json:"currency"`
	TotalCents  int64         `json:"total_cents"`
	Lines       []InvoiceLine `json:"lines"`
	CreatedAt   time.Time     `json:"created_at"`
	UpdatedAt   time.Time     `json:"updated_at"`
	FinalizedAt *time.Time    `json:"finalized_at"`
	// Export is the invoice's export to Stripe, nil while it has none (no
	// Stripe key, or not final yet); the console shows it, the API does not.
	Export *InvoiceExport `json:"-"`
}

// InvoiceExport is where a final invoice's export to Stripe stands: pending
// (not tried yet, or in progress), failed (the last attempt failed; retried
// at NextAttemptAt) or exported (for good, at ExportedAt).
type InvoiceExport struct {
	Status          string // pending, failed or exported
	StripeInvoiceID string // empty until Stripe has created the invoice
	Attempts        int
	LastError       string
	NextAttemptAt   time.Time
	ExportedAt      *time.Time
}

// InvoiceLine is one line of an invoice.
type InvoiceLine struct {
	Kind        string `json:"kind"` // subscription, included, overage, grant, credit (negative)
	Description string `json:"description"`
	Quantity    int64  `json:"quantity"`
	AmountCents int64  `json:"amount_cents"`
}

const invoiceSelect = `
	SELECT i.id, i.tenant_id, to_char(i.period, 'YYYY-MM'), i.period_start, i.period_end, i.status, i.currency, i.total_cents,
	       i.created_at, i.updated_at, i.finalized_at,
	       coalesce((SELECT json_agg(json_build_object('kind', kind, 'description', description,
	                   'quantity', quantity, 'amount_cents', amount_cents) ORDER BY line_no)
	                 FROM invoice_lines WHERE invoice_id = i.id), '[]'),
	       x.status, coalesce(x.stripe_invoice_id, ''), coalesce(x.attempts, 0), coalesce(x.last_error, ''),
	       coalesce(x.next_attempt_at, 'epoch'), x.exported_at
	FROM invoices i LEFT JOIN invoice_exports x ON x.invoice_id = i.id`

func scanInvoice(row pgx.Row) (Invoice, error) {
	var inv Invoice
	var status *string
	var x InvoiceExport
	err := row.Scan(&inv.ID, &inv.TenantID, &inv.Period, &inv.PeriodStart, &inv.PeriodEnd, &inv.Status, &inv.Currency, &inv.TotalCents,
		&inv.CreatedAt, &inv.UpdatedAt, &inv.FinalizedAt, &inv.Lines,
		&status, &x.StripeInvoiceID, &x.Attempts, &x.LastError, &x.NextAttemptAt, &x.ExportedAt)
	inv.PeriodStart, inv.PeriodEnd = inv.PeriodStart.UTC(), inv.PeriodEnd.UTC()
	if status != nil {
		x.Status = *status
		inv.Export = &x
	}
	return inv, err
}

// Invoice returns the invoice of that id with its lines and export, or
// pgx.ErrNoRows.
func (l *Ledger) Invoice(ctx context.Context, id string) (Invoice, error) {
	inv, err := scanInvoice(l.db.QueryRow(ctx, invoiceSelect+` WHERE i.id = $1`, id))
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return inv, fmt.Errorf("billing: invoice %s: %w", id, err)
	}
	return inv, err
}

// TenantInvoices returns the tenant's invoices, newest first, with lines.
func (l *Ledger) TenantInvoices(ctx context.Context, tenantID string) ([]Invoice, error) {
	rows, err := l.db.Query(ctx, invoiceSelect+` WHERE i.tenant_id = $1 ORDER BY i.period DESC`, tenantID)
	if err != nil {
		return nil, fmt.Errorf("billing: invoices: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Invoice, error) { return scanInvoice(row) })
}

// UsageRow is one period (hour or day) of one meter's usage. ShadowRefused
// counts the requests a shadow policy would have refused (admitted or not),
// Degraded those answered with a degrade policy's fallback (not in
// Rejected). The fields keep the order of the admin export's columns.
type UsageRow struct {
	PeriodStart   time.Time `json:"period_start"`
	Meter         string    `json:"meter"`
	Units         int64     `json:"units"`
	Requests      int64     `json:"requests"`
	Rejected      int64     `json:"rejected"`
	OverageUnits  int64     `json:"overage_units"`
	ShadowRefused int64     `json:"shadow_refused"`
	Degraded      int64     `json:"degraded"`
}

// EachUsage calls fn for every row of the tenant's usage in [from, to), per
// hour or day ("hour", "day") and meter (all meters when meter is empty),
// oldest first. Rows are streamed from Postgres, never held all at once.
// A month whose hourly detail the retention dropped (Partitions) reads as
// one row per meter at the month's first instant.
func (l *Ledger) EachUsage(ctx context.Context, tenantID string, from, to time.Time, granularity, meter string, fn func(UsageRow) error) error {
	rows, err := l.db.Query(ctx, `
		SELECT (date_trunc($4, hour AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') AS period_start, meter,
		       sum(units)::bigint, sum(requests)::bigint, sum(rejected)::bigint, sum(overage_units)::bigint,
		       sum(shadow_refused)::bigint, sum(degraded)::bigint
		FROM usage_ledger WHERE tenant_id = $1 AND hour >= $2 AND hour < $3 AND ($5 = '' OR meter = $5)
		GROUP BY 1, 2 ORDER BY 1, 2`, tenantID, from, to, granularity, meter)
	if err != nil {
		return fmt.Errorf("billing: usage: %w", err)
	}
	defer rows.Close()
	var r UsageRow
	for rows.Next() {
		if err := rows.Scan(&r.PeriodStart, &r.Meter, &r.Units, &r.Requests, &r.Rejected, &r.OverageUnits,
			&r.ShadowRefused, &r.Degraded); err != nil {
			return fmt.Errorf("billing: usage: %w", err)
		}
		r.PeriodStart = r.PeriodStart.UTC()
		if err := fn(r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("billing: usage: %w", err)
	}
	return nil
}

// InvoicePage returns at most limit invoices labelled with the month
// starting at period (see Invoice.Period), by tenant id, after the tenant id after ("" for the first page),
// and whether more follow.
func (l *Ledger) InvoicePage(ctx context.Context, period time.Time, after string, limit int) ([]Invoice, bool, error) {
	if after == "" {
		after = firstTenantID
	}
	rows, err := l.db.Query(ctx, invoiceSelect+` WHERE i.period = $1 AND i.tenant_id > $2::uuid ORDER BY i.tenant_id LIMIT $3`,
		period, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("billing: invoices: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Invoice, error) { return scanInvoice(row) })
	if err != nil {
		return nil, false, fmt.Errorf("billing: invoices: %w", err)
	}
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}

// InvoiceSummary returns the number of invoices labelled with the month
// starting at period and the sum of their totals, from the sums every write
// to invoices keeps (invoice_period_totals): a few rows, however many
// invoices the month has.
func (l *Ledger) InvoiceSummary(ctx context.Context, period time.Time) (count, totalCents int64, err error) {
	err = l.db.QueryRow(ctx, `
		SELECT coalesce(sum(invoices), 0)::bigint, coalesce(sum(total_cents), 0)::bigint
		FROM invoice_period_totals WHERE period = $1`, period).
		Scan(&count, &totalCents)
	if err != nil {
		return 0, 0, fmt.Errorf("billing: invoice summary: %w", err)
	}
	return count, totalCents, nil
}

// EachInvoice calls fn for every invoice labelled with the month starting
// at period,
// by tenant, with its lines, streamed from Postgres.
func (l *Ledger) EachInvoice(ctx context.Context, period time.Time, fn func(Invoice) error) error {
	rows, err := l.db.Query(ctx, invoiceSelect+` WHERE i.period = $1 ORDER BY i.tenant_id`, period)
	if err != nil {
		return fmt.Errorf("billing: invoices: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		inv, err := scanInvoice(rows)
		if err != nil {
			return fmt.Errorf("billing: invoices: %w", err)
		}
		if err := fn(inv); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("billing: invoices: %w", err)
	}
	return nil
}
