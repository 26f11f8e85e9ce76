package catalog

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// heldSource reads the real store, then holds one chosen read (once) until
// the test releases it: the read has its answer, from before the change the
// test then makes, but has not handed it to the catalog yet.
type heldSource struct {
	*catalogdb.Store
	mu      sync.Mutex
	hold    string        // "key", "tenant" or "tenants": the read to hold
	held    chan struct{} // closed when that read holds its answer
	release chan struct{}
}

func (s *heldSource) wait(read string) {
	s.mu.Lock()
	mine := s.hold == read
	if mine {
		s.hold = ""
	}
	s.mu.Unlock()
	if mine {
		close(s.held)
		<-s.release
	}
}

func (s *heldSource) KeyByPrefix(ctx context.Context, p string) (quota.KeyRecord, error) {
	r, err := s.Store.KeyByPrefix(ctx, p)
	s.wait("key")
	return r, err
}

func (s *heldSource) Tenant(ctx context.Context, id string) (quota.Tenant, error) {
	t, err := s.Store.Tenant(ctx, id)
	s.wait("tenant")
	return t, err
}

func (s *heldSource) TenantsByID(ctx context.Context, ids []string) ([]quota.Tenant, error) {
	ts, err := s.Store.TenantsByID(ctx, ids)
	s.wait("tenants")
	return ts, err
}

// TestAStaleLoadDoesNotOutliveItsInvalidation: a cache load that read
// Postgres before an admin change and stores its answer after the change's
// invalidation must not keep the old record (a revoked key or a suspended
// tenant would stay usable until the next refresh). Deterministic: the
// source holds its answer until the invalidation has been applied.
func TestAStaleLoadDoesNotOutliveItsInvalidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		hold string
		// warm fills the cache before the load that will be held, when the
		// held read is a refresh.
		warm bool
		// load starts the read that is held; it runs in its own goroutine.
		load func(c *Catalog, secret string) error
		// change is the admin change made while the read is held.
		change func(ctx context.Context, store *catalogdb.Store, c *Catalog, tenant quota.Tenant, key quota.IssuedKey) error
		want   string // the error code of Resolve afterwards
	}{
		{
			name: "key revoked while its miss loads", hold: "key",
			load: func(c *Catalog, secret string) error { _, err := c.Resolve(context.Background(), secret); return err },
			change: func(ctx context.Context, store *catalogdb.Store, c *Catalog, _ quota.Tenant, key quota.IssuedKey) error {
				if _, err := store.RevokeKey(ctx, "test", key.ID); err != nil {
					return err
				}
				return c.Invalidate(ctx, KindKey, key.Prefix)
			},
			want: quota.CodeUnauthorized,
		},
		{
			name: "tenant suspended while its miss loads", hold: "tenant",
			load: func(c *Catalog, secret string) error { _, err := c.Resolve(context.Background(), secret); return err },
			change: func(ctx context.Context, store *catalogdb.Store, c *Catalog, tenant quota.Tenant, _ quota.IssuedKey) error {
				if _, err := store.UpdateTenant(ctx, "test", tenant.ID, func(t *quota.Tenant) error { t.Status = quota.StatusSuspended; return nil }); err != nil {
					return err
				}
				return c.Invalidate(ctx, KindTenant, tenant.ID)
			},
			want: quota.CodeForbidden,
		},
		{
			name: "tenant suspended while a refresh loads", hold: "tenants", warm: true,
			load: func(c *Catalog, _ string) error { return c.Refresh(context.Background()) },
			change: func(ctx context.Context, store *catalogdb.Store, c *Catalog, tenant quota.Tenant, _ quota.IssuedKey) error {
				if _, err := store.UpdateTenant(ctx, "test", tenant.ID, func(t *quota.Tenant) error { t.Status = quota.StatusSuspended; return nil }); err != nil {
					return err
				}
				return c.Invalidate(ctx, KindTenant, tenant.ID)
			},
			want: quota.CodeForbidden,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store := catalogdb.NewStore(testenv.Postgres(t))
			rdb := testenv.Redis(t)
			src := &heldSource{Store: store, held: make(chan struct{}), release: make(chan struct{})}
			c := New(src, rdb, testenv.Prefix(t, rdb), slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
			tenant, key := mustTenantKey(t, store, "free")
			if tc.warm {
				if _, err := c.Resolve(ctx, key.Secret); err != nil {
					t.Fatal(err)
				}
			}
			src.mu.Lock()
			src.hold = tc.hold
			src.mu.Unlock()
			done := make(chan error, 1)
			go func() { done <- tc.load(c, key.Secret) }()
			select {
			case <-src.held:
			case <-time.After(5 * time.Second):
				t.Fatalf("the %s read did not start within 5s", tc.hold)
			}
			if err := tc.change(ctx, store, c, tenant, key); err != nil {
				t.Fatal(err)
			}
			close(src.release)
			select {
			case err := <-done: // its own answer may be either: it raced the change
				t.Logf("the held %s read answered %v", tc.hold, err)
			case <-time.After(5 * time.Second):
				t.Fatal("the held load did not finish within 5s of its release")
			}
			_, err := c.Resolve(ctx, key.Secret)
			if err == nil {
				t.Errorf("Resolve after the change and its invalidation: resolved, want a %q error: the stale load was kept", tc.want)
			} else if got := quota.ErrorCode(err); got != tc.want {
				t.Errorf("Resolve after the change and its invalidation: code %q (%v), want %q", got, err, tc.want)
			}
		})
	}
}
