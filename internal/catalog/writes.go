package catalog

import (
	"context"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// writer is the store's admin writes of tiers, tenants, keys and policies
// (*catalogdb.Store): each one transaction with its audit entry.
type writer interface {
	CreateTier(ctx context.Context, actor string, t quota.Tier) (quota.Tier, error)
	UpdateTier(ctx context.Context, actor, slug string, change func(*quota.Tier) error) (quota.Tier, error)
	DeleteTier(ctx context.Context, actor, slug string) error
	CreateTenantWith(ctx context.Context, actor string, in quota.Tenant) (quota.Tenant, error)
	UpdateTenant(ctx context.Context, actor, id string, change func(*quota.Tenant) error) (quota.Tenant, error)
	DeleteTenant(ctx context.Context, actor, id string) error
	IssueKey(ctx context.Context, actor, tenantID, name string, expires ...time.Time) (quota.IssuedKey, error)
	RevokeKey(ctx context.Context, actor, id string) (quota.APIKey, error)
	RotateKey(ctx context.Context, actor, id, name string, grace time.Duration) (quota.IssuedKey, quota.APIKey, error)
	CreatePolicy(ctx context.Context, actor string, p quota.Policy) (quota.Policy, error)
	UpdatePolicy(ctx context.Context, actor, name string, change func(*quota.Policy) error) (quota.Policy, error)
	DeletePolicy(ctx context.Context, actor, name string) error
}

// Admin is the catalog's admin write path, the one door for changing tiers,
// tenants, keys and policies: each write goes to the store (one transaction
// with its audit entry), then invalidates what it changed in every node's
// cache, through the Catalog it is built on. A failed invalidation is
// logged, not returned: the write is done, and the periodic refresh corrects
// the caches within its interval. The Catalog itself only caches and reads.
type Admin struct {
	store writer
	cat   *Catalog
}

// NewAdmin returns the admin writes to store that invalidate cat (and,
// through its pub/sub, every node's cache).
func NewAdmin(store writer, cat *Catalog) *Admin {
	return &Admin{store: store, cat: cat}
}

// CreateTier creates t.
func (a *Admin) CreateTier(ctx context.Context, actor string, t quota.Tier) (quota.Tier, error) {
	t, err := a.store.CreateTier(ctx, actor, t)
	if err == nil {
		a.cat.invalidate(ctx, KindTier, t.Slug)
	}
	return t, err
}

// UpdateTier applies change to the tier slug.
func (a *Admin) UpdateTier(ctx context.Context, actor, slug string, change func(*quota.Tier) error) (quota.Tier, error) {
	t, err := a.store.UpdateTier(ctx, actor, slug, change)
	if err == nil {
		a.cat.invalidate(ctx, KindTier, t.Slug)
	}
	return t, err
}

// DeleteTier deletes the tier slug.
func (a *Admin) DeleteTier(ctx context.Context, actor, slug string) error {
	err := a.store.DeleteTier(ctx, actor, slug)
	if err == nil {
		a.cat.invalidate(ctx, KindTier, slug)
	}
	return err
}

// CreateTenant creates the tenant in. A new tenant is in no cache, so it
// invalidates nothing.
func (a *Admin) CreateTenant(ctx context.Context, actor string, in quota.Tenant) (quota.Tenant, error) {
	return a.store.CreateTenantWith(ctx, actor, in)
}

// UpdateTenant applies change to the tenant id.
func (a *Admin) UpdateTenant(ctx context.Context, actor, id string, change func(*quota.Tenant) error) (quota.Tenant, error) {
	t, err := a.store.UpdateTenant(ctx, actor, id, change)
	if err == nil {
		a.cat.invalidate(ctx, KindTenant, t.ID)
	}
	return t, err
}

// DeleteTenant deletes the tenant id.
func (a *Admin) DeleteTenant(ctx context.Context, actor, id string) error {
	err := a.store.DeleteTenant(ctx, actor, id)
	if err == nil {
		a.cat.invalidate(ctx, KindTenant, id)
	}
	return err
}

// IssueKey issues a key for the tenant; it forgets a cached "unknown" of
// its prefix.
func (a *Admin) IssueKey(ctx context.Context, actor, tenantID, name string, expires ...time.Time) (quota.IssuedKey, error) {
	k, err := a.store.IssueKey(ctx, actor, tenantID, name, expires...)
	if err == nil {
		a.cat.invalidate(ctx, KindKey, k.Prefix)
	}
	return k, err
}

// RevokeKey revokes the key id.
func (a *Admin) RevokeKey(ctx context.Context, actor, id string) (quota.APIKey, error) {
	k, err := a.store.RevokeKey(ctx, actor, id)
	if err == nil {
		a.cat.invalidate(ctx, KindKey, k.Prefix)
	}
	return k, err
}

// RotateKey issues a fresh key beside the key id, which expires after grace.
func (a *Admin) RotateKey(ctx context.Context, actor, id, name string, grace time.Duration) (quota.IssuedKey, quota.APIKey, error) {
	fresh, old, err := a.store.RotateKey(ctx, actor, id, name, grace)
	if err == nil {
		a.cat.invalidate(ctx, KindKey, old.Prefix)
		a.cat.invalidate(ctx, KindKey, fresh.Prefix)
	}
	return fresh, old, err
}

// invalidate is Invalidate for a write that is done: a failure is logged.
func (c *Catalog) invalidate(ctx context.Context, kind, id string) {
	if err := c.Invalidate(ctx, kind, id); err != nil {
		c.log.Warn("cache invalidation not published; the periodic refresh will carry it", "kind", kind, "id", id, "err", err)
	}
}
