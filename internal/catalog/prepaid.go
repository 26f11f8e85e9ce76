package catalog

import (
	"context"
	"sync"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// prepaidTTL bounds how long a node keeps a prepaid tenant's balance
// before reading it again. A stale balance never over-spends: it only
// grows by a credit grant (which invalidates it on every node, KindRoom)
// and shrinks by an invoice's draws of what the script already counts
// (see quota.Prepaid); reading it again only lets go what an older view
// holds back (a draft that became final).
const prepaidTTL = 30 * time.Second

type prepaidEntry struct {
	p      quota.Prepaid
	loaded time.Time
}

// prepaidCache holds the balances of the prepaid tenants this node served.
type prepaidCache struct {
	mu sync.Mutex
	m  map[string]prepaidEntry
}

func (c *prepaidCache) drop(id string) {
	c.mu.Lock()
	if id == "" {
		c.m = nil
	} else {
		delete(c.m, id)
	}
	c.mu.Unlock()
}

// Prepaid returns the balance p's admissions at now draw on (nil when its
// tier is postpaid), from the cache while it is fresh and of now's
// billing period; else read from the source.
func (c *Catalog) Prepaid(ctx context.Context, p Principal, now time.Time) (*quota.Prepaid, error) {
	if !p.Tier.IsPrepaid() {
		return nil, nil
	}
	c.prepaid.mu.Lock()
	e, ok := c.prepaid.m[p.Tenant.ID]
	c.prepaid.mu.Unlock()
	if ok && now.Before(e.p.Until) && now.Sub(e.loaded) < prepaidTTL && !now.Before(e.loaded) {
		return &e.p, nil
	}
	return c.PrepaidAt(ctx, p, now)
}

// PrepaidAt reads p's balance for the billing period containing at (the
// admission script's clock, when it found the cached one stale) and
// caches it. Concurrent misses of one tenant share one read.
func (c *Catalog) PrepaidAt(ctx context.Context, p Principal, at time.Time) (*quota.Prepaid, error) {
	var got *quota.Prepaid
	err := c.shared(ctx, "pp:"+p.Tenant.ID, func(ctx context.Context) error {
		pp, err := c.src.Prepaid(ctx, p.Tenant.ID, p.Tier, p.Calendar, at)
		if err != nil {
			return err
		}
		c.prepaid.mu.Lock()
		if c.prepaid.m == nil {
			c.prepaid.m = map[string]prepaidEntry{}
		}
		c.prepaid.m[p.Tenant.ID] = prepaidEntry{p: pp, loaded: at}
		c.prepaid.mu.Unlock()
		got = &pp
		return nil
	})
	if err != nil || got != nil {
		return got, err
	}
	// another caller's read: its balance, when it is of at's period
	c.prepaid.mu.Lock()
	e, ok := c.prepaid.m[p.Tenant.ID]
	c.prepaid.mu.Unlock()
	if ok && at.Before(e.p.Until) && e.p.PeriodID == p.Calendar.PeriodID(at) {
		return &e.p, nil
	}
	pp, err := c.src.Prepaid(ctx, p.Tenant.ID, p.Tier, p.Calendar, at)
	if err != nil {
		return nil, err
	}
	return &pp, nil
}

// Credited tells every node that the tenant was granted credit: its cached
// balance and its remembered refusals go (KindRoom). A failed publish is
// logged, not returned: the credit is recorded, and the other nodes read
// the balance again within prepaidTTL.
func (c *Catalog) Credited(ctx context.Context, tenantID string) {
	if err := c.Invalidate(ctx, KindRoom, tenantID); err != nil {
		c.log.Warn("publishing a credit grant failed; other nodes see it within the cache's lifetime", "tenant_id", tenantID, "err", err)
	}
}
