package quota

import "time"

// TenantStatus says whether a tenant may call metered routes.
type TenantStatus string

// The statuses of a tenant: an active one may call metered routes, a
// suspended one may not.
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
	// BillingAnchorDay (1..28) and TimeZone (an IANA name) are the
	// tenant's billing calendar: stored and shown; see plan.go.
	BillingAnchorDay int    `json:"billing_anchor_day"`
	TimeZone         string `json:"time_zone"`
	// PendingChange is a tier change asked for the next billing period,
	// nil when there is none.
	PendingChange *PendingChange `json:"pending_change"`
	CreatedAt     time.Time      `json:"created_at"`
	UpdatedAt     time.Time      `json:"updated_at"`
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

// ValidID reports whether s has the form of Tollgate's ids (tenants, keys,
// alerts, invoices: Postgres uuid columns): a UUID in its canonical 8-4-4-4-12
// form, 36 bytes, hex digits of either case. Checking the form before a
// query keeps a malformed id a CodeInvalid (or a dropped row) instead of a
// Postgres error; it says nothing of whether the id names anything.
func ValidID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') && (c < 'A' || c > 'F') {
				return false
			}
		}
	}
	return true
}
