package tollgate

import "context"

// TenantClient reads a tenant's own account (/v1/usage, /v1/invoices)
// with its API key. It is safe for concurrent use.
type TenantClient struct{ t *transport }

// NewTenantClient returns a client of the Tollgate at baseURL that
// authenticates with the tenant's apiKey.
func NewTenantClient(baseURL, apiKey string, opts ...Option) *TenantClient {
	return &TenantClient{t: newTransport(baseURL, apiKey, opts)}
}

// Usage is a tenant's limits as they stand and its usage in the current
// UTC month.
type Usage struct {
	TenantID string `json:"tenant_id"`
	Tier     string `json:"tier"`
	// Limits are the tier's limits and meter quotas, then spend_cap and
	// credit (in cents) when they apply.
	Limits   []Limit       `json:"limits"`
	Daily    []DayUsage    `json:"daily"`
	Meters   []MeterUsage  `json:"meters"`
	Policies []PolicyUsage `json:"policies"`
	Upgrade  *Upgrade      `json:"upgrade"`
}

// DayUsage is one day of the month with usage.
type DayUsage struct {
	Date          string `json:"date"`
	Units         int64  `json:"units"`
	Requests      int64  `json:"requests"`
	Rejected      int64  `json:"rejected"`
	ShadowRefused int64  `json:"shadow_refused"`
	Degraded      int64  `json:"degraded"`
}

// MeterUsage is one meter's usage in the month.
type MeterUsage struct {
	Meter         string `json:"meter"`
	Units         int64  `json:"units"`
	Requests      int64  `json:"requests"`
	Rejected      int64  `json:"rejected"`
	ShadowRefused int64  `json:"shadow_refused"`
	Degraded      int64  `json:"degraded"`
}

// PolicyUsage is one of the tenant's policies with its state; Remaining
// and Reset are nil for a policy with no single state of the tenant's.
type PolicyUsage struct {
	Name      string  `json:"name"`
	Algorithm string  `json:"algorithm"`
	Limit     int64   `json:"limit"`
	Remaining *int64  `json:"remaining"`
	Reset     *string `json:"reset"`
}

// Invoice is one billing period's invoice. Money is integer cents.
type Invoice struct {
	ID          string        `json:"id"`
	TenantID    string        `json:"tenant_id"`
	Period      string        `json:"period"`
	PeriodStart string        `json:"period_start"`
	PeriodEnd   string        `json:"period_end"`
	Status      string        `json:"status"` // draft or final
	Currency    string        `json:"currency"`
	TotalCents  int64         `json:"total_cents"`
	Lines       []InvoiceLine `json:"lines"`
	CreatedAt   string        `json:"created_at"`
	UpdatedAt   string        `json:"updated_at"`
	FinalizedAt *string       `json:"finalized_at"`
}

// InvoiceLine is one line of an Invoice.
type InvoiceLine struct {
	Kind        string `json:"kind"` // subscription, included, overage, grant or credit
	Description string `json:"description"`
	Quantity    int64  `json:"quantity"`
	AmountCents int64  `json:"amount_cents"`
}

// Usage returns the tenant's usage. Errors: a 401 *Problem for an unknown
// key, 403 for a suspended tenant; *OutageError when Tollgate is away.
func (c *TenantClient) Usage(ctx context.Context) (*Usage, error) {
	var out Usage
	if err := c.t.do(ctx, "usage", "GET", "/v1/usage", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Invoices returns the tenant's invoices, newest first.
func (c *TenantClient) Invoices(ctx context.Context) ([]Invoice, error) {
	var out struct {
		Items []Invoice `json:"items"`
	}
	if err := c.t.do(ctx, "invoices", "GET", "/v1/invoices", nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}
