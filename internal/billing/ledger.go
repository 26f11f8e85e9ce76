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

// TenantInvoices returns the tenant's invoices, newest first, with lines.
func (l *Ledger) TenantInvoices(ctx context.Context, tenantID string) ([]Invoice, error) {
	rows, err := l.db.Query(ctx, `
		SELECT i.id, i.tenant_id, to_char(i.period, 'YYYY-MM'), i.status, i.currency, i.total_cents,
		       i.created_at, i.updated_at, i.finalized_at,
		       coalesce((SELECT json_agg(json_build_object('kind', kind, 'description', description,
		                   'quantity', quantity, 'amount_cents', amount_cents) ORDER BY line_no)
		                 FROM invoice_lines WHERE invoice_id = i.id), '[]')
		FROM invoices i WHERE i.tenant_id = $1 ORDER BY i.period DESC`, tenantID)
	if err != nil {
		return nil, fmt.Errorf("billing: invoices: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Invoice, error) {
		var inv Invoice
		err := row.Scan(&inv.ID, &inv.TenantID, &inv.Period, &inv.Status, &inv.Currency, &inv.TotalCents,
			&inv.CreatedAt, &inv.UpdatedAt, &inv.FinalizedAt, &inv.Lines)
		return inv, err
	})
}
