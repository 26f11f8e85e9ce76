package billing

import (
	"context"
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

// DayUsage is one UTC day of a tenant's usage.
type DayUsage struct {
	Date     time.Time `json:"-"`
	Units    int64     `json:"units"`
	Requests int64     `json:"requests"`
	Rejected int64     `json:"rejected"`
}

// DailyUsage returns the tenant's flushed usage per UTC day in [from, to),
// days without usage left out.
func (l *Ledger) DailyUsage(ctx context.Context, tenantID string, from, to time.Time) ([]DayUsage, error) {
	rows, err := l.db.Query(ctx, `
		SELECT (date_trunc('day', hour AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') AS date,
		       sum(units)::bigint AS units, sum(requests)::bigint AS requests, sum(rejected)::bigint AS rejected
		FROM usage WHERE tenant_id = $1 AND hour >= $2 AND hour < $3
		GROUP BY 1 ORDER BY 1`, tenantID, from, to)
	if err != nil {
		return nil, fmt.Errorf("billing: daily usage: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByName[DayUsage])
}

// Invoice is a tenant's bill for one calendar month.
type Invoice struct {
	ID          string        `json:"id"`
	TenantID    string        `json:"tenant_id"`
	Period      string        `json:"period"` // YYYY-MM
	Status      string        `json:"status"` // draft or final
	Currency    string        `json:"currency"`
	TotalCents  int64         `json:"total_cents"`
	Lines       []InvoiceLine `json:"lines"`
	CreatedAt   time.Time     `json:"created_at"`
	UpdatedAt   time.Time     `json:"updated_at"`
	FinalizedAt *time.Time    `json:"finalized_at"`
}

// InvoiceLine is one line of an invoice.
type InvoiceLine struct {
	Kind        string `json:"kind"` // subscription, included, overage, grant
	Description string `json:"description"`
	Quantity    int64  `json:"quantity"`
	AmountCents int64  `json:"amount_cents"`
}

const invoiceSelect = `
	SELECT i.id, i.tenant_id, to_char(i.period, 'YYYY-MM'), i.status, i.currency, i.total_cents,
	       i.created_at, i.updated_at, i.finalized_at,
	       coalesce((SELECT json_agg(json_build_object('kind', kind, 'description', description,
	                   'quantity', quantity, 'amount_cents', amount_cents) ORDER BY line_no)
	                 FROM invoice_lines WHERE invoice_id = i.id), '[]')
	FROM invoices i`

func scanInvoice(row pgx.Row) (Invoice, error) {
	var inv Invoice
	err := row.Scan(&inv.ID, &inv.TenantID, &inv.Period, &inv.Status, &inv.Currency, &inv.TotalCents,
		&inv.CreatedAt, &inv.UpdatedAt, &inv.FinalizedAt, &inv.Lines)
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

// UsageRow is one period (hour or day) of one meter's usage.
type UsageRow struct {
	PeriodStart  time.Time `json:"period_start"`
	Meter        string    `json:"meter"`
	Units        int64     `json:"units"`
	Requests     int64     `json:"requests"`
	Rejected     int64     `json:"rejected"`
	OverageUnits int64     `json:"overage_units"`
}

// EachUsage calls fn for every row of the tenant's usage in [from, to), per
// hour or day ("hour", "day") and meter (all meters when meter is empty),
// oldest first. Rows are streamed from Postgres, never held all at once.
func (l *Ledger) EachUsage(ctx context.Context, tenantID string, from, to time.Time, granularity, meter string, fn func(UsageRow) error) error {
	rows, err := l.db.Query(ctx, `
		SELECT (date_trunc($4, hour AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') AS period_start, meter,
		       sum(units)::bigint, sum(requests)::bigint, sum(rejected)::bigint, sum(overage_units)::bigint
		FROM usage WHERE tenant_id = $1 AND hour >= $2 AND hour < $3 AND ($5 = '' OR meter = $5)
		GROUP BY 1, 2 ORDER BY 1, 2`, tenantID, from, to, granularity, meter)
	if err != nil {
		return fmt.Errorf("billing: usage: %w", err)
	}
	defer rows.Close()
	var r UsageRow
	for rows.Next() {
		if err := rows.Scan(&r.PeriodStart, &r.Meter, &r.Units, &r.Requests, &r.Rejected, &r.OverageUnits); err != nil {
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

// EachInvoice calls fn for every invoice of the month starting at period,
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
