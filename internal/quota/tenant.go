package quota

import "time"

// TenantStatus says whether a tenant may call metered routes.
type TenantStatus string

const (
	StatusActive    TenantStatus = "active"
	StatusSuspended TenantStatus = "suspended"
)

// Tenant is a customer of the SaaS that runs Tollgate.
type Tenant struct {
	ID         string       `json:"id"`
	Name       string       `json:"name"`
	Tier       string       `json:"tier"`
	Status     TenantStatus `json:"status"`
	Overrides  Overrides    `json:"overrides"`
	WebhookURL string       `json:"webhook_url"`
	CreatedAt  time.Time    `json:"created_at"`
	UpdatedAt  time.Time    `json:"updated_at"`
}

// APIKey is an issued key as listed: never its secret.
type APIKey struct {
	ID         string     `json:"id"`
	TenantID   string     `json:"tenant_id"`
	Prefix     string     `json:"prefix"`
	Name       string     `json:"name"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
	ExpiresAt  *time.Time `json:"expires_at"`
}

// IssuedKey is an APIKey with its secret, returned once at creation.
type IssuedKey struct {
	APIKey
	Secret string `json:"secret"`
}
