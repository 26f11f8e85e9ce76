package catalog

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// balances computes prepaid tenants' balances, many at once
// (billing.Ledger.Prepaids: the credit left after every charge the
// invoices not final yet will take, which the invoicing rules decide).
type balances interface {
	Prepaids(ctx context.Context, ts []quota.PrepaidOf, now time.Time) ([]quota.Prepaid, error)
}

// balanceBatch bounds the balances one refresh reads at once.
const balanceBatch = 500

// WithBalances sets where the catalog reads prepaid tenants' balances and
// returns c. Without it, a prepaid tenant's balance is an error.
func (c *Catalog) WithBalances(b balances) *Catalog {
	c.balances = b
	return c
}

// readBalances reads balances from the source WithBalances set.
func (c *Catalog) readBalances(ctx context.Context, ts []quota.PrepaidOf, at time.Time) ([]quota.Prepaid, error) {
	if c.balances == nil {
		return nil, errors.New("catalog: no source of prepaid balances (WithBalances)")
	}
	return c.balances.Prepaids(ctx, ts, at)
}

// readBalance reads p's balance at at.
func (c *Catalog) readBalance(ctx context.Context, p Principal, at time.Time) (quota.Prepaid, error) {
	ps, err := c.readBalances(ctx, []quota.PrepaidOf{{TenantID: p.Tenant.ID, Tier: p.Tier, Calendar: p.Calendar}}, at)
	if err != nil {
		return quota.Prepaid{}, err
	}
	return ps[0], nil
}

// prepaidEntry is a prepaid tenant's cached balance, with the principal it
// was read for (Refresh reads it again with them).
type prepaidEntry struct {
	p quota.Prepaid
	// principal's tier and calendar, and the cache's generation when read
	tier quota.Tier
	cal  quota.Calendar
	gen  uint64
}

// prepaidCache holds the balances of the prepaid tenants this node served,
// each until its billing period ends. The metered request never waits for
// Postgres while its entry holds: the catalog's refresh loop reads the
// entries again (Refresh), invalidations drop them (a credit grant,
// KindRoom; a tenant or tier change). Within a period a balance grows by
// a credit grant, which invalidates it, and shrinks by an invoice's draws
// of what the admission script already counts (see quota.Prepaid), by a
// tier change, which invalidates it, and by the ledger's late news of
// usage admission did not draw for (a postpaid stretch's last seconds,
// flushed after the move that made the tenant prepaid): that one only
// reaches the entry at the next refresh.
type prepaidCache struct {
	mu  sync.Mutex
	m   map[string]prepaidEntry
	gen uint64 // bumped by every drop
}

func (c *prepaidCache) drop(id string) {
	c.mu.Lock()
	c.gen++
	if id == "" {
		c.m = nil
	} else {
		delete(c.m, id)
	}
	c.mu.Unlock()
}

// store caches pp for p, unless the entry was dropped since the read began
// (at generation gen).
func (c *prepaidCache) store(p Principal, pp quota.Prepaid, gen uint64) {
	c.mu.Lock()
	if c.gen == gen {
		if c.m == nil {
			c.m = map[string]prepaidEntry{}
		}
		c.m[p.Tenant.ID] = prepaidEntry{p: pp, tier: p.Tier, cal: p.Calendar, gen: gen}
	}
	c.mu.Unlock()
}

func (c *prepaidCache) get(id string) (prepaidEntry, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[id]
	return e, c.gen, ok
}

// Prepaid returns the balance p's admissions at now draw on (nil when its
// tier is postpaid), from the cache while it holds now's billing period;
// else read from the source.
func (c *Catalog) Prepaid(ctx context.Context, p Principal, now time.Time) (*quota.Prepaid, error) {
	if !p.Tier.IsPrepaid() {
		return nil, nil
	}
	if e, _, ok := c.prepaid.get(p.Tenant.ID); ok && now.Before(e.p.Until) {
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
		_, gen, _ := c.prepaid.get(p.Tenant.ID)
		pp, err := c.readBalance(ctx, p, at)
		if err != nil {
			return err
		}
		c.prepaid.store(p, pp, gen)
		got = &pp
		return nil
	})
	if err != nil || got != nil {
		return got, err
	}
	// another caller's read: its balance, when it is of at's period
	if e, _, ok := c.prepaid.get(p.Tenant.ID); ok && at.Before(e.p.Until) && e.p.PeriodID == p.Calendar.PeriodID(at) {
		return &e.p, nil
	}
	pp, err := c.readBalance(ctx, p, at)
	if err != nil {
		return nil, err
	}
	return &pp, nil
}

// refreshPrepaid reads every cached balance again at now, off the request
// path (Refresh), balanceBatch at a time; one dropped meanwhile is left to
// the next request.
func (c *Catalog) refreshPrepaid(ctx context.Context, now time.Time) error {
	c.prepaid.mu.Lock()
	ts := make([]quota.PrepaidOf, 0, len(c.prepaid.m))
	for id, e := range c.prepaid.m {
		ts = append(ts, quota.PrepaidOf{TenantID: id, Tier: e.tier, Calendar: e.cal})
	}
	gen := c.prepaid.gen
	c.prepaid.mu.Unlock()
	for start := 0; start < len(ts); start += balanceBatch {
		batch := ts[start:min(start+balanceBatch, len(ts))]
		ps, err := c.readBalances(ctx, batch, now)
		if err != nil {
			return err
		}
		for k, of := range batch {
			c.prepaid.store(Principal{Tenant: quota.Tenant{ID: of.TenantID}, Tier: of.Tier, Calendar: of.Calendar}, ps[k], gen)
		}
	}
	return nil
}

// Credited tells every node that the tenant was granted credit: its cached
// balance and its remembered refusals go (KindRoom). A failed publish is
// logged, not returned: the credit is recorded, and the other nodes read
// the balance again at their next refresh.
func (c *Catalog) Credited(ctx context.Context, tenantID string) {
	if err := c.Invalidate(ctx, KindRoom, tenantID); err != nil {
		c.log.Warn("publishing a credit grant failed; other nodes see it at their next refresh", "tenant_id", tenantID, "err", err)
	}
}
