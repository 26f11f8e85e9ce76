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

// The admin writes below are the one door for changing tiers, tenants and
// keys: each writes through the store, then invalidates what it changed on
// every node. A failed invalidation is logged, not returned: the write is
// done, and the periodic refresh corrects the caches within its interval.

// CreateTier creates t.
func (c *Catalog) CreateTier(ctx context.Context, actor string, t quota.Tier) (quota.Tier, error) {
	t, err := c.src.CreateTier(ctx, actor, t)
	if err == nil {
		c.invalidate(ctx, KindTier, t.Slug)
	}
	return t, err
}

// UpdateTier applies change to the tier slug.
func (c *Catalog) UpdateTier(ctx context.Context, actor, slug string, change func(*quota.Tier) error) (quota.Tier, error) {
	t, err := c.src.UpdateTier(ctx, actor, slug, change)
	if err == nil {
		c.invalidate(ctx, KindTier, t.Slug)
	}
	return t, err
}

// DeleteTier deletes the tier slug.
func (c *Catalog) DeleteTier(ctx context.Context, actor, slug string) error {
	err := c.src.DeleteTier(ctx, actor, slug)
	if err == nil {
		c.invalidate(ctx, KindTier, slug)
	}
	return err
}

// CreateTenant creates the tenant in. A new tenant is in no cache, so it
// invalidates nothing.
func (c *Catalog) CreateTenant(ctx context.Context, actor string, in quota.Tenant) (quota.Tenant, error) {
	return c.src.CreateTenantWith(ctx, actor, in)
}

// UpdateTenant applies change to the tenant id.
func (c *Catalog) UpdateTenant(ctx context.Context, actor, id string, change func(*quota.Tenant) error) (quota.Tenant, error) {
	t, err := c.src.UpdateTenant(ctx, actor, id, change)
	if err == nil {
		c.invalidate(ctx, KindTenant, t.ID)
	}
	return t, err
}

// DeleteTenant deletes the tenant id.
func (c *Catalog) DeleteTenant(ctx context.Context, actor, id string) error {
	err := c.src.DeleteTenant(ctx, actor, id)
	if err == nil {
		c.invalidate(ctx, KindTenant, id)
	}
	return err
}

// IssueKey issues a key for the tenant; it forgets a cached "unknown" of
// its prefix.
func (c *Catalog) IssueKey(ctx context.Context, actor, tenantID, name string, expires ...time.Time) (quota.IssuedKey, error) {
	k, err := c.src.IssueKey(ctx, actor, tenantID, name, expires...)
	if err == nil {
		c.invalidate(ctx, KindKey, k.Prefix)
	}
	return k, err
}

// RevokeKey revokes the key id.
func (c *Catalog) RevokeKey(ctx context.Context, actor, id string) (quota.APIKey, error) {
	k, err := c.src.RevokeKey(ctx, actor, id)
	if err == nil {
		c.invalidate(ctx, KindKey, k.Prefix)
	}
	return k, err
}

// RotateKey issues a fresh key beside the key id, which expires after grace.
func (c *Catalog) RotateKey(ctx context.Context, actor, id, name string, grace time.Duration) (quota.IssuedKey, quota.APIKey, error) {
	fresh, old, err := c.src.RotateKey(ctx, actor, id, name, grace)
	if err == nil {
		c.invalidate(ctx, KindKey, old.Prefix)
		c.invalidate(ctx, KindKey, fresh.Prefix)
	}
	return fresh, old, err
}

// invalidate is Invalidate for a write that is done: a failure is logged.
func (c *Catalog) invalidate(ctx context.Context, kind, id string) {
	if err := c.Invalidate(ctx, kind, id); err != nil {
		c.log.Warn("cache invalidation not published; the periodic refresh will carry it", "kind", kind, "id", id, "err", err)
	}
}
