package catalog

import (
	"context"
	"reflect"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/routes"
)

// PolicySet is the policies in force, by name, and the version of the set:
// the version changes whenever the list does (and only then), so that what
// a caller derives from a set, such as compiled matchers, can be kept per
// version. List is shared by every caller: read it, never modify it.
type PolicySet struct {
	Version uint64
	List    []quota.Policy
}

// policyCache is the catalog's copy of the policies (under Catalog.mu).
// The set is replaced whole, never changed in place.
type policyCache struct {
	set     PolicySet // the last set loaded; Version 0 before the first
	current bool      // set is loaded and not invalidated since
}

// Policies returns the policies in force, by name, from the cache (see
// PolicySet): a snapshot the caller must not modify.
func (c *Catalog) Policies(ctx context.Context) ([]quota.Policy, error) {
	s, err := c.PolicySet(ctx)
	return s.List, err
}

// PolicySet returns the policies in force with their version. Only the
// first call, and the first after a change, reads Postgres (concurrent
// callers share the read); every node sees a change within a second
// (pub/sub), or within a refresh interval when the message was lost.
func (c *Catalog) PolicySet(ctx context.Context) (PolicySet, error) {
	for {
		c.mu.RLock()
		s, ok := c.pol.set, c.pol.current
		c.mu.RUnlock()
		if ok {
			return s, nil
		}
		if err := c.shared(ctx, "policies", c.loadPolicies); err != nil {
			return PolicySet{}, err
		}
	}
}

// loadPolicies reads the policies and makes them current, under a new
// version when they differ from the set loaded last. A read that an
// invalidation overtook is dropped: the next lookup reads again.
func (c *Catalog) loadPolicies(ctx context.Context) error {
	since := c.beginLoad()
	list, err := c.src.Policies(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.endLoadLocked()
	if err != nil {
		return err
	}
	if c.droppedLocked("policies", since) {
		return nil
	}
	if list == nil {
		list = []quota.Policy{}
	}
	if c.pol.set.Version == 0 || !reflect.DeepEqual(list, c.pol.set.List) {
		c.pol.set = PolicySet{Version: c.pol.set.Version + 1, List: list}
	}
	c.pol.current = true
	return nil
}

// The policies' admin writes (Admin), the one door for changing them: each
// writes through the store, then invalidates the policies on every node (see
// writes.go).

// CreatePolicy creates p, its defaults filled and its path_prefix in
// normal form.
func (a *Admin) CreatePolicy(ctx context.Context, actor string, p quota.Policy) (quota.Policy, error) {
	if err := normalizePrefix(&p); err != nil {
		return quota.Policy{}, err
	}
	p, err := a.store.CreatePolicy(ctx, actor, p)
	if err == nil {
		a.cat.invalidate(ctx, KindPolicy, p.Name)
	}
	return p, err
}

// UpdatePolicy applies change to the policy name, and puts the
// path_prefix it leaves in normal form.
func (a *Admin) UpdatePolicy(ctx context.Context, actor, name string, change func(*quota.Policy) error) (quota.Policy, error) {
	p, err := a.store.UpdatePolicy(ctx, actor, name, func(p *quota.Policy) error {
		if err := change(p); err != nil {
			return err
		}
		return normalizePrefix(p)
	})
	if err == nil {
		a.cat.invalidate(ctx, KindPolicy, p.Name)
	}
	return p, err
}

// DeletePolicy deletes the policy name.
func (a *Admin) DeletePolicy(ctx context.Context, actor, name string) error {
	err := a.store.DeletePolicy(ctx, actor, name)
	if err == nil {
		a.cat.invalidate(ctx, KindPolicy, name)
	}
	return err
}

// normalizePrefix puts p's path_prefix in the normal form request paths are
// matched in (routes.Normalize: /api/%65xpensive is /api/expensive), so
// that the prefix stored and shown is the one requests are compared with.
// A prefix that is no plain path (a dot segment in any spelling, a
// malformed escape, a space or control character) names no request path:
// it is refused, naming match.
func normalizePrefix(p *quota.Policy) error {
	if p.Match.PathPrefix == "" {
		return nil
	}
	n, ok := routes.Normalize(p.Match.PathPrefix)
	if !ok {
		return quota.FieldError("match", "path_prefix must start with / and be a plain path: no dot segments (escaped or not), malformed escapes, spaces or control characters")
	}
	p.Match.PathPrefix = n
	return nil
}
