// Package pages is the web part of the HTTP layer: the tenants' dashboard
// and the admins' console, server-rendered from the embedded templates in
// web/, with their sign-in sessions kept behind a small store. Its handlers
// are registered, with every other route, in internal/httpapi.
//
// It renders and reads forms: what a change does is the catalog's and the
// domain's, decoded as the admin API decodes it (httpx.TierFields).
package pages

import (
	"context"
	"log/slog"
	"time"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/usage"
)

// Records is what the console reads of the store of tiers, tenants, keys,
// grants and policies (*catalogdb.Store), read through to Postgres, never
// cached. Writes go through the catalog's Admin.
type Records interface {
	ListTiers(ctx context.Context, p quota.Page) ([]quota.Tier, *string, error)
	Tier(ctx context.Context, slug string) (quota.Tier, error)
	Tiers(ctx context.Context) ([]quota.Tier, error)
	ListTenants(ctx context.Context, f quota.TenantFilter, p quota.Page) ([]quota.Tenant, *string, error)
	TenantsByID(ctx context.Context, ids []string) ([]quota.Tenant, error)
	ListKeys(ctx context.Context, tenantID string, p quota.Page) ([]quota.APIKey, *string, error)
	ListGrants(ctx context.Context, tenantID string, p quota.Page) ([]quota.Grant, *string, error)
	ListPolicies(ctx context.Context, p quota.Page) ([]quota.Policy, *string, error)
	Policy(ctx context.Context, name string) (quota.Policy, error)
}

// SessionStore keeps sign-in sessions by key until their TTL
// (*redisdb.Sessions), a bounded number per owner (Put ends the owner's
// oldest past the bound); Get reports found false for a missing or expired
// one.
type SessionStore interface {
	Put(ctx context.Context, owner, key string, value []byte, ttl time.Duration) error
	Get(ctx context.Context, key string) (value []byte, found bool, err error)
	Delete(ctx context.Context, key string) error
}

// Deps are what the pages use; internal/app (RunAPI) builds them.
type Deps struct {
	Store    Records
	Catalog  *catalog.Catalog // cached reads
	Admin    *catalog.Admin   // writes of tiers, tenants, keys and policies, which invalidate the catalog
	Grants   *catalog.Grants
	Plans    *catalog.Plans // tier changes, now or at the next period
	Ledger   *billing.Ledger
	Alerts   *billing.Deliverer
	Usage    *usage.Reader
	Sessions SessionStore
	Guard    *httpx.Guard
	Log      *slog.Logger
	Now      func() time.Time

	AdminToken string
	// SessionTTL is the lifetime of a dashboard or console sign-in (default 8h).
	SessionTTL time.Duration
}

// Pages serves the dashboard and the console.
type Pages struct {
	store    Records
	catalog  *catalog.Catalog
	admin    *catalog.Admin
	grants   *catalog.Grants
	plans    *catalog.Plans
	ledger   *billing.Ledger
	alerts   *billing.Deliverer
	reports  *usage.Reader
	sessions SessionStore
	guard    *httpx.Guard
	log      *slog.Logger
	now      func() time.Time
	opts     Deps
	views    *views
	assets   map[string]asset
}

// New returns the pages over d. It fails only when the embedded templates
// or files do not load: a bug of the build, which any test catches.
func New(d Deps) (*Pages, error) {
	if d.SessionTTL <= 0 {
		d.SessionTTL = 8 * time.Hour
	}
	v, err := loadViews()
	if err != nil {
		return nil, err
	}
	a, err := loadAssets()
	if err != nil {
		return nil, err
	}
	return &Pages{plans: d.Plans, store: d.Store, catalog: d.Catalog, admin: d.Admin, grants: d.Grants, ledger: d.Ledger, alerts: d.Alerts,
		reports: d.Usage, sessions: d.Sessions, guard: d.Guard, log: d.Log, now: d.Now, opts: d,
		views: v, assets: a}, nil
}
