// Package catalog is the API node's in-process cache of API keys, tenants,
// tiers and policies, so that a metered request makes no Postgres query.
//
// A miss reads Postgres once (concurrent misses for one key share the read).
// Admin changes reach every node through Redis pub/sub: Invalidate drops the
// local entry at once and publishes the change; other nodes drop theirs when
// the message arrives (well under a second). A periodic refresh re-reads every
// cached entry in a few batch queries, covering messages lost while a node was
// disconnected from Redis.
//
// Entries are versioned against invalidations: a load (a miss or a refresh)
// that read Postgres before a change and finishes after the change's
// invalidation drops its answer instead of caching it, so a revoked key or a
// suspended tenant never outlives its invalidation.
//
// Which type does what:
//
//   - Catalog is the cache and its reads (keys, principals, tenants, tiers,
//     policies, prepaid balances), with Invalidate, Run and Refresh. It
//     writes nothing to the store but the keys' last use.
//   - Admin (writes.go) is the admin write path of tiers, tenants, keys and
//     policies: each write goes to the store, is audited there, and
//     invalidates every node's cache through the Catalog it is built on.
//   - Plans (plans.go) changes tenants' tiers, now or at their next period,
//     and Grants (grants.go) adds units to their current quotas: both write
//     through the store and invalidate through the same Catalog.
//
// It writes no usage, invoice or credit (internal/billing's), and imports no
// adapter of the module: internal/app gives it the store and Redis.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/apikey"
	"github.com/tollgate/tollgate/internal/quota"
)

// source is the store of tiers, tenants and keys (*catalogdb.Store): what the
// catalog reads on a miss or a refresh. Its writes are Admin's (writer).
type source interface {
	KeyByPrefix(ctx context.Context, prefix string) (quota.KeyRecord, error)
	KeysByPrefix(ctx context.Context, prefixes []string) ([]quota.KeyRecord, error)
	Tenant(ctx context.Context, id string) (quota.Tenant, error)
	TenantsByID(ctx context.Context, ids []string) ([]quota.Tenant, error)
	Tiers(ctx context.Context) ([]quota.Tier, error)
	Policies(ctx context.Context) ([]quota.Policy, error)
	TouchKeys(ctx context.Context, used map[string]time.Time) error
}

// Principal is what a valid API key resolves to: its tenant, the tenant's
// tier and effective limits, and the upgrade hints (Upgrade,
// RefusalUpgrade).
type Principal struct {
	KeyID     string
	KeyPrefix string
	Tenant    quota.Tenant
	Tier      quota.Tier
	Limits    quota.Limits // the tier's limits with the tenant's overrides
	// Upgrades are the upgrade hints of the cached tiers: see Upgrade and
	// RefusalUpgrade.
	Upgrades *quota.Upgrades
	// Calendar is the tenant's billing calendar (its anchor day and time
	// zone), which its quotas follow: quota.Request.Calendar.
	Calendar quota.Calendar
}

// maxNegative bounds the cache of unknown key prefixes, so that a flood of
// random keys cannot grow memory without bound.
const maxNegative = 10_000

type keyEntry struct {
	rec     quota.KeyRecord
	missing bool // no such key (negative entry)
}

// Catalog caches keys, tenants and tiers. It is safe for concurrent use.
type Catalog struct {
	src     source
	rdb     redis.UniversalClient
	channel string
	log     *slog.Logger
	now     func() time.Time

	mu       sync.RWMutex
	keys     map[string]keyEntry     // by prefix
	tenants  map[string]quota.Tenant // by id
	tiers    map[string]quota.Tier   // by slug
	tierList []quota.Tier
	pol      policyCache  // policies.go
	prepaid  prepaidCache // prepaid.go
	balances balances     // prepaid.go; nil: WithBalances not called
	negative int

	// upgrades are the upgrade hints of tierList, computed with it.
	upgrades *quota.Upgrades

	usedMu sync.Mutex
	used   map[string]time.Time // key prefix -> last use, not yet written

	loads    sync.Map // prefix or "t:"+id -> *call, for shared misses
	onTenant []func(tenantID string)

	// Versions (under mu): every invalidation bumps gen; while loads are in
	// flight, dropped remembers the gen at which each entry ("k:"+prefix,
	// "t:"+id, "tiers") was last invalidated, droppedAll that of the last
	// invalidation of everything. A load notes gen when it starts and
	// stores only the entries not dropped since. Nothing is remembered
	// while no load is in flight, so the map stays as small as the
	// invalidations that overlap a load.
	gen        uint64
	loading    int
	dropped    map[string]uint64
	droppedAll uint64

	// Hits and Misses count cache lookups (metrics).
	Hits, Misses func()
}

type call struct {
	done chan struct{}
	err  error
}

// New returns a Catalog reading src and listening for invalidations on the
// Redis channel <prefix>:v1:invalidate. Call Run to listen and refresh.
func New(src source, rdb redis.UniversalClient, prefix string, log *slog.Logger, now func() time.Time) *Catalog {
	return &Catalog{
		src: src, rdb: rdb, channel: prefix + ":v1:invalidate", log: log, now: now,
		keys: map[string]keyEntry{}, tenants: map[string]quota.Tenant{}, tiers: map[string]quota.Tier{},
		used: map[string]time.Time{}, dropped: map[string]uint64{},
		Hits: func() {}, Misses: func() {},
	}
}

// OnTenantChange registers f to run when a tenant's entry is invalidated
// or its room changed (the deny cache clears the tenant's entry); f("")
// means every tenant may have changed (a tier's limits did).
func (c *Catalog) OnTenantChange(f func(tenantID string)) {
	c.mu.Lock()
	c.onTenant = append(c.onTenant, f)
	c.mu.Unlock()
}

// Resolve authenticates secret and returns its principal. A malformed,
// unknown, revoked or expired key is a CodeUnauthorized error; a suspended
// tenant is CodeForbidden. Only a cache miss reads Postgres.
func (c *Catalog) Resolve(ctx context.Context, secret string) (Principal, error) {
	prefix, hash, ok := apikey.Parse(secret)
	if !ok {
		return Principal{}, quota.Errorf(quota.CodeUnauthorized, "malformed API key")
	}
	// The prefix becomes a map key that outlives the request: never keep a
	// string that may point into a reused request buffer (Fiber's headers).
	prefix = strings.Clone(prefix)
	e, err := c.key(ctx, prefix)
	if err != nil {
		return Principal{}, err
	}
	// Compare even for a negative entry, so that timing does not tell
	// unknown prefixes from wrong secrets.
	if e.missing || !apikey.Equal(e.rec.Hash, hash[:]) {
		return Principal{}, quota.Errorf(quota.CodeUnauthorized, "unknown API key")
	}
	now := c.now()
	p, err := c.keyPrincipal(ctx, e.rec.Key, now)
	if err != nil {
		return p, err
	}
	c.usedMu.Lock()
	c.used[p.KeyPrefix] = now
	c.usedMu.Unlock()
	return p, nil
}

// KeyPrincipal returns the principal of the key with the visible prefix,
// checked as Resolve checks it but without a secret: for a dashboard
// session, which remembers the key it was opened with by prefix only, so
// that revoking the key or suspending the tenant ends the session. An
// unknown, revoked or expired key is CodeUnauthorized, a suspended tenant
// CodeForbidden. It does not count as a use of the key.
func (c *Catalog) KeyPrincipal(ctx context.Context, prefix string) (Principal, error) {
	e, err := c.key(ctx, strings.Clone(prefix))
	if err != nil {
		return Principal{}, err
	}
	if e.missing {
		return Principal{}, quota.Errorf(quota.CodeUnauthorized, "unknown API key")
	}
	return c.keyPrincipal(ctx, e.rec.Key, c.now())
}

func (c *Catalog) keyPrincipal(ctx context.Context, k quota.APIKey, now time.Time) (Principal, error) {
	if k.RevokedAt != nil && !k.RevokedAt.After(now) {
		return Principal{}, quota.Errorf(quota.CodeUnauthorized, "API key revoked")
	}
	if k.ExpiresAt != nil && !k.ExpiresAt.After(now) {
		return Principal{}, quota.Errorf(quota.CodeUnauthorized, "API key expired")
	}
	p, err := c.Principal(ctx, k.TenantID)
	if err != nil {
		if quota.ErrorCode(err) == quota.CodeNotFound {
			return Principal{}, quota.Errorf(quota.CodeUnauthorized, "unknown API key")
		}
		return Principal{}, err
	}
	p.KeyID, p.KeyPrefix = k.ID, k.Prefix
	if p.Tenant.Status == quota.StatusSuspended {
		return p, quota.Errorf(quota.CodeForbidden, "tenant suspended")
	}
	return p, nil
}

// Principal returns the tenant with id, its tier, limits and upgrade hint
// (without key fields), from the cache.
func (c *Catalog) Principal(ctx context.Context, tenantID string) (Principal, error) {
	t, err := c.tenant(ctx, tenantID)
	if err != nil {
		return Principal{}, err
	}
	tiers, _, ups, err := c.loadedTiers(ctx)
	if err != nil {
		return Principal{}, err
	}
	tier, ok := tiers[t.Tier]
	if !ok {
		return Principal{}, fmt.Errorf("catalog: tenant %s is on unknown tier %q", t.ID, t.Tier)
	}
	return Principal{Tenant: t, Tier: tier, Limits: t.Overrides.Apply(tier.Limits), Upgrades: ups,
		Calendar: c.calendarOf(t)}, nil
}

// Upgrade returns the upgrade hint without a refusal (/v1/usage): a tier
// that gives more room (quota.Upgrades). It is asked for, not computed
// with every principal: the hint of a tenant with overrides is computed
// when asked.
func (p *Principal) Upgrade() *quota.Upgrade {
	return p.Upgrades.For(p.Tier, p.Tenant.Overrides, nil)
}

// RefusalUpgrade returns the upgrade hint of the principal's refusal d:
// a tier that gives more room where d was refused (quota.Upgrades).
func (p *Principal) RefusalUpgrade(d *quota.Decision) *quota.Upgrade {
	return p.Upgrades.For(p.Tier, p.Tenant.Overrides, d)
}

// Calendar returns the billing calendar of the tenant with id, from the
// cache: what its quotas count (quota.Request.Calendar), for the callers
// that act on its counters outside a request (grants, quota resets).
func (c *Catalog) Calendar(ctx context.Context, tenantID string) (quota.Calendar, error) {
	t, err := c.tenant(ctx, tenantID)
	if err != nil {
		return quota.Calendar{}, err
	}
	return c.calendarOf(t), nil
}

// calendarOf returns t's billing calendar (quota.LoadZone loads each zone
// once per process). A stored zone this binary does not know (validated
// by another one's database) counts as UTC, and is logged.
func (c *Catalog) calendarOf(t quota.Tenant) quota.Calendar {
	cal := quota.Calendar{AnchorDay: t.BillingAnchorDay}
	if t.TimeZone == "" || t.TimeZone == quota.DefaultTimeZone {
		return cal
	}
	loc, err := quota.LoadZone(t.TimeZone)
	if err != nil {
		c.log.Warn("tenant time zone unknown here; its quotas count UTC days", "tenant_id", t.ID, "time_zone", t.TimeZone, "err", err)
		loc = time.UTC
	}
	cal.Zone = loc
	return cal
}

// Tiers returns the cached tiers by rank.
func (c *Catalog) Tiers(ctx context.Context) ([]quota.Tier, error) {
	_, list, _, err := c.loadedTiers(ctx)
	return list, err
}

func (c *Catalog) key(ctx context.Context, prefix string) (keyEntry, error) {
	for {
		c.mu.RLock()
		e, ok := c.keys[prefix]
		c.mu.RUnlock()
		if ok {
			c.Hits()
			return e, nil
		}
		c.Misses()
		if err := c.shared(ctx, prefix, func(ctx context.Context) error {
			since := c.beginLoad()
			rec, err := c.src.KeyByPrefix(ctx, prefix)
			c.mu.Lock()
			defer c.mu.Unlock()
			defer c.endLoadLocked()
			if err != nil && quota.ErrorCode(err) != quota.CodeNotFound {
				return err
			}
			if c.droppedLocked("k:"+prefix, since) {
				return nil // read before a change: the loop reads again
			}
			if err != nil {
				if c.negative >= maxNegative {
					c.dropNegativeLocked()
				}
				c.keys[prefix] = keyEntry{missing: true}
				c.negative++
				return nil
			}
			c.keys[prefix] = keyEntry{rec: rec}
			return nil
		}); err != nil {
			return keyEntry{}, err
		}
	}
}

func (c *Catalog) tenant(ctx context.Context, id string) (quota.Tenant, error) {
	for {
		c.mu.RLock()
		t, ok := c.tenants[id]
		c.mu.RUnlock()
		if ok {
			return t, nil
		}
		var missing error
		if err := c.shared(ctx, "t:"+id, func(ctx context.Context) error {
			since := c.beginLoad()
			t, err := c.src.Tenant(ctx, id)
			c.mu.Lock()
			defer c.mu.Unlock()
			defer c.endLoadLocked()
			if err != nil {
				if quota.ErrorCode(err) == quota.CodeNotFound {
					missing = err
					return nil
				}
				return err
			}
			if c.droppedLocked("t:"+id, since) {
				return nil // read before a change: the loop reads again
			}
			// The id may point into a reused request buffer (a Fiber
			// route parameter): a map key made of it could change under
			// the map, and an invalidation would then miss a stale entry.
			c.tenants[strings.Clone(id)] = t
			return nil
		}); err != nil {
			return quota.Tenant{}, err
		}
		if missing != nil {
			return quota.Tenant{}, missing
		}
	}
}

// shared runs load once for concurrent callers with the same name.
func (c *Catalog) shared(ctx context.Context, name string, load func(context.Context) error) error {
	cl := &call{done: make(chan struct{})}
	if v, loaded := c.loads.LoadOrStore(name, cl); loaded {
		other := v.(*call)
		select {
		case <-other.done:
			return other.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// The load is not bound to one caller's cancellation.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	cl.err = load(lctx)
	c.loads.Delete(name)
	close(cl.done)
	return cl.err
}

func (c *Catalog) dropNegativeLocked() {
	for p, e := range c.keys {
		if e.missing {
			delete(c.keys, p)
		}
	}
	c.negative = 0
}

// loadedTiers returns the cached tiers by slug and by rank and their
// upgrade hints, loading them when they are not. All are replaced whole,
// never changed in place, so the caller may read them without the lock.
func (c *Catalog) loadedTiers(ctx context.Context) (map[string]quota.Tier, []quota.Tier, *quota.Upgrades, error) {
	for {
		c.mu.RLock()
		m, list, ups := c.tiers, c.tierList, c.upgrades
		c.mu.RUnlock()
		if list != nil {
			return m, list, ups, nil
		}
		if err := c.shared(ctx, "tiers", c.loadTiers); err != nil {
			return nil, nil, nil, err
		}
	}
}

func (c *Catalog) loadTiers(ctx context.Context) error {
	since := c.beginLoad()
	list, err := c.src.Tiers(ctx)
	var ups *quota.Upgrades
	if err == nil {
		ups = quota.NewUpgrades(list) // outside the lock: every tier against every other
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.endLoadLocked()
	if err != nil {
		return err
	}
	if c.droppedLocked("tiers", since) {
		return nil // read before a change: the next lookup reads again
	}
	m := make(map[string]quota.Tier, len(list))
	for _, t := range list {
		m[t.Slug] = t
	}
	if list == nil {
		list = []quota.Tier{}
	}
	c.tiers, c.tierList, c.upgrades = m, list, ups
	return nil
}

// beginLoad notes that a load starts and returns the version it reads at.
func (c *Catalog) beginLoad() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.beginLoadLocked()
}

func (c *Catalog) beginLoadLocked() uint64 {
	c.loading++
	return c.gen
}

// endLoadLocked notes that a load ended; with none left in flight the
// remembered invalidations can no longer matter.
func (c *Catalog) endLoadLocked() {
	c.loading--
	if c.loading == 0 {
		clear(c.dropped)
	}
}

// droppedLocked reports whether entry was invalidated after a load that
// began at version since: what the load read may predate the change.
func (c *Catalog) droppedLocked(entry string, since uint64) bool {
	return c.droppedAll > since || c.dropped[entry] > since
}

// dropLocked records an invalidation of entry ("" for everything).
func (c *Catalog) dropLocked(entry string) {
	c.gen++
	switch {
	case c.loading == 0:
	case entry == "":
		c.droppedAll = c.gen
	default:
		c.dropped[entry] = c.gen
	}
}

// Kinds of invalidation messages.
const (
	KindKey    = "key"    // id: key prefix
	KindTenant = "tenant" // id: tenant id
	KindTier   = "tier"   // id: tier slug
	KindPolicy = "policy" // id: policy name
	// KindRoom says a tenant has room again that no cached entry shows (a
	// refund, a grant): only what OnTenantChange hooks hold is dropped.
	KindRoom = "room" // id: tenant id
)

// Invalidate drops the entry on this node at once and publishes the change
// to every node.
func (c *Catalog) Invalidate(ctx context.Context, kind, id string) error {
	c.apply(kind + ":" + id)
	if err := c.rdb.Publish(ctx, c.channel, kind+":"+id).Err(); err != nil {
		return fmt.Errorf("catalog: publish invalidation: %w", err)
	}
	return nil
}

func (c *Catalog) apply(msg string) {
	kind, id, _ := strings.Cut(msg, ":")
	var notify []func(string)
	c.mu.Lock()
	switch kind {
	case KindKey:
		if e, ok := c.keys[id]; ok && e.missing {
			c.negative--
		}
		delete(c.keys, id)
		c.dropLocked("k:" + id)
	case KindTenant:
		delete(c.tenants, id)
		notify = c.onTenant
		c.dropLocked("t:" + id)
		c.prepaid.drop(id)
	case KindRoom:
		notify = c.onTenant // the cached tenant is still right
		c.prepaid.drop(id)  // a credit grant is room
	case KindTier:
		c.tierList, c.tiers = nil, map[string]quota.Tier{}
		c.prepaid.drop("")
		c.dropLocked("tiers")
		notify, id = c.onTenant, "" // a tier's limits are every tenant's on it
	case KindPolicy:
		c.pol.current = false
		c.dropLocked("policies")
		notify, id = c.onTenant, "" // a policy may apply to every tenant
	default:
		c.keys, c.tenants, c.tierList, c.negative = map[string]keyEntry{}, map[string]quota.Tenant{}, nil, 0
		c.pol.current = false
		c.dropLocked("")
		c.prepaid.drop("")
		notify, id = c.onTenant, ""
	}
	c.mu.Unlock()
	for _, f := range notify {
		f(id)
	}
}

// Run listens for invalidations and refreshes every cached entry each
// refresh interval, until ctx ends. ready, when not nil, is closed once the
// subscription is active.
func (c *Catalog) Run(ctx context.Context, refresh time.Duration, ready chan<- struct{}) {
	sub := c.rdb.Subscribe(ctx, c.channel)
	// Receive blocks on the socket whatever its context says; closing the
	// subscription is what ends it.
	stop := context.AfterFunc(ctx, func() { _ = sub.Close() })
	defer stop()
	defer func() { _ = sub.Close() }()
	go func() {
		t := time.NewTicker(refresh)
		defer t.Stop()
		flush := time.NewTicker(5 * time.Second)
		defer flush.Stop()
		for {
			select {
			case <-ctx.Done():
				fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
				_ = c.FlushUsed(fctx)
				cancel()
				return
			case <-flush.C:
				fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if err := c.FlushUsed(fctx); err != nil && ctx.Err() == nil {
					c.log.Warn("key last-use flush failed", "err", err)
				}
				cancel()
			case <-t.C:
				rctx, cancel := context.WithTimeout(ctx, refresh)
				if err := c.Refresh(rctx); err != nil && ctx.Err() == nil {
					c.log.Warn("catalog refresh failed", "err", err)
				}
				cancel()
			}
		}
	}()
	for {
		msg, err := sub.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// The connection dropped; messages may have been lost meanwhile.
			// go-redis resubscribes on the next Receive; refresh to catch up.
			c.log.Warn("catalog subscription lost", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = c.Refresh(rctx)
			cancel()
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && ready != nil {
				close(ready)
				ready = nil
			}
		case *redis.Message:
			c.apply(m.Payload)
		}
	}
}

// FlushUsed writes the keys' last-use times gathered since the last flush;
// Run calls it every few seconds, off the request path.
func (c *Catalog) FlushUsed(ctx context.Context) error {
	c.usedMu.Lock()
	used := c.used
	c.used = map[string]time.Time{}
	c.usedMu.Unlock()
	if err := c.src.TouchKeys(ctx, used); err != nil {
		c.usedMu.Lock()
		for p, t := range used { // keep them for the next flush
			if t.After(c.used[p]) {
				c.used[p] = t
			}
		}
		c.usedMu.Unlock()
		return err
	}
	return nil
}

// Refresh re-reads the tiers, the policies, the prepaid balances and every
// cached tenant and key from the source. An entry invalidated while it reads is left to the next
// lookup, which reads it again.
func (c *Catalog) Refresh(ctx context.Context) error {
	c.mu.Lock()
	since := c.beginLoadLocked()
	prefixes := make([]string, 0, len(c.keys))
	for p, e := range c.keys {
		if !e.missing {
			prefixes = append(prefixes, p)
		}
	}
	ids := make([]string, 0, len(c.tenants))
	for id := range c.tenants {
		ids = append(ids, id)
	}
	c.mu.Unlock()

	tiersErr := c.loadTiers(ctx)
	policiesErr := c.loadPolicies(ctx)
	prepaidErr := c.refreshPrepaid(ctx, c.now())
	keys, kerr := c.src.KeysByPrefix(ctx, prefixes)
	tenants, terr := c.src.TenantsByID(ctx, ids)
	if err := errors.Join(tiersErr, policiesErr, prepaidErr, kerr, terr); err != nil {
		c.mu.Lock()
		c.endLoadLocked()
		c.mu.Unlock()
		return err
	}
	freshKeys := make(map[string]quota.KeyRecord, len(keys))
	for _, k := range keys {
		freshKeys[k.Key.Prefix] = k
	}
	freshTenants := make(map[string]quota.Tenant, len(tenants))
	for _, t := range tenants {
		freshTenants[t.ID] = t
	}
	var changed []string
	c.mu.Lock()
	// Unknown prefixes are forgotten too: a key created while this node
	// missed its invalidation message becomes usable within one refresh.
	c.dropNegativeLocked()
	for _, p := range prefixes {
		if c.droppedLocked("k:"+p, since) {
			continue
		}
		if k, ok := freshKeys[p]; ok {
			c.keys[p] = keyEntry{rec: k}
		} else {
			delete(c.keys, p)
		}
	}
	for _, id := range ids {
		if c.droppedLocked("t:"+id, since) {
			continue
		}
		if t, ok := freshTenants[id]; ok {
			if old, had := c.tenants[id]; had && !old.UpdatedAt.Equal(t.UpdatedAt) {
				changed = append(changed, id)
			}
			c.tenants[id] = t
		} else {
			delete(c.tenants, id)
			changed = append(changed, id)
		}
	}
	c.endLoadLocked()
	notify := c.onTenant
	c.mu.Unlock()
	for _, id := range changed {
		for _, f := range notify {
			f(id)
		}
	}
	return nil
}
