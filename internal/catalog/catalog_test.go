package catalog

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// countingSource wraps the real store (and the ledger's balances) and
// counts the reads, to prove that a cached lookup makes no Postgres query.
type countingSource struct {
	*catalogdb.Store
	ledger *billing.Ledger
	reads  atomic.Int64
}

func (s *countingSource) KeyByPrefix(ctx context.Context, p string) (quota.KeyRecord, error) {
	s.reads.Add(1)
	return s.Store.KeyByPrefix(ctx, p)
}

func (s *countingSource) Tenant(ctx context.Context, id string) (quota.Tenant, error) {
	s.reads.Add(1)
	return s.Store.Tenant(ctx, id)
}

func (s *countingSource) Tiers(ctx context.Context) ([]quota.Tier, error) {
	s.reads.Add(1)
	return s.Store.Tiers(ctx)
}

func (s *countingSource) Prepaids(ctx context.Context, ts []quota.PrepaidOf, now time.Time) ([]quota.Prepaid, error) {
	s.reads.Add(1)
	return s.ledger.Prepaids(ctx, ts, now)
}

// mustNodes starts n catalogs sharing pool's database and one Redis, as n
// API nodes would, each listening for invalidations.
func mustNodes(tb testing.TB, pool *pgxpool.Pool, n int) (*catalogdb.Store, []*Catalog, []*countingSource) {
	tb.Helper()
	rdb := testenv.Redis(tb)
	prefix := testenv.Prefix(tb, rdb)
	store := catalogdb.NewStore(pool)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	tb.Cleanup(func() { cancel(); wg.Wait() })
	var nodes []*Catalog
	var srcs []*countingSource
	for range n {
		src := &countingSource{Store: store, ledger: billing.NewLedger(pool)}
		c := New(src, rdb, prefix, log, time.Now).WithBalances(src)
		ready := make(chan struct{})
		wg.Add(1)
		go func() { defer wg.Done(); c.Run(ctx, time.Hour, ready) }()
		select {
		case <-ready:
		case <-time.After(5 * time.Second):
			tb.Fatal("catalog did not subscribe within 5s")
		}
		nodes = append(nodes, c)
		srcs = append(srcs, src)
	}
	return store, nodes, srcs
}

func mustTenantKey(tb testing.TB, store *catalogdb.Store, tier string) (quota.Tenant, quota.IssuedKey) {
	tb.Helper()
	ctx := context.Background()
	t, err := store.CreateTenant(ctx, "test", "acme", tier)
	if err != nil {
		tb.Fatal(err)
	}
	k, err := store.IssueKey(ctx, "test", t.ID, "k")
	if err != nil {
		tb.Fatal(err)
	}
	return t, k
}

func TestResolveCachesAndMakesNoQueryOnHit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, nodes, srcs := mustNodes(t, testenv.Postgres(t), 1)
	tenant, key := mustTenantKey(t, store, "free")
	p, err := nodes[0].Resolve(ctx, key.Secret)
	if err != nil {
		t.Fatal(err)
	}
	if p.Tenant.ID != tenant.ID || p.Tier.Slug != "free" || p.KeyPrefix != key.Prefix {
		t.Fatalf("got tenant %s tier %s prefix %s, want %s free %s", p.Tenant.ID, p.Tier.Slug, p.KeyPrefix, tenant.ID, key.Prefix)
	}
	if up := p.Upgrade(); up == nil || up.Tier != "pro" {
		t.Fatalf("upgrade = %+v, want the pro tier", up)
	}
	if p.Limits.DailyQuota == nil || *p.Limits.DailyQuota != *p.Tier.DailyQuota {
		t.Fatalf("limits = %+v, want the tier's", p.Limits)
	}
	before := srcs[0].reads.Load()
	for range 100 {
		if _, err := nodes[0].Resolve(ctx, key.Secret); err != nil {
			t.Fatal(err)
		}
	}
	if got := srcs[0].reads.Load() - before; got != 0 {
		t.Fatalf("100 cached resolves made %d Postgres reads, want 0", got)
	}
}

func TestResolveRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, nodes, _ := mustNodes(t, testenv.Postgres(t), 1)
	_, valid := mustTenantKey(t, store, "free")
	other, _ := mustTenantKey(t, store, "free")
	wrongSecret := valid.Secret[:len(valid.Secret)-1] + "X"
	if wrongSecret == valid.Secret {
		wrongSecret = valid.Secret[:len(valid.Secret)-1] + "Y"
	}
	for _, tc := range []struct{ name, key, code string }{
		{"malformed", "hello", quota.CodeUnauthorized},
		{"unknown prefix", "tg_aaaaaaaa_" + valid.Secret[12:], quota.CodeUnauthorized},
		{"wrong secret", wrongSecret, quota.CodeUnauthorized},
	} {
		_, err := nodes[0].Resolve(ctx, tc.key)
		if got := quota.ErrorCode(err); got != tc.code {
			t.Errorf("%s: code %q (%v), want %q", tc.name, got, err, tc.code)
		}
	}
	_ = other
}

// TestInvalidationReachesOtherNode checks that an admin change on one node is
// seen by another within a second: revocation, suspension and a tier change.
func TestInvalidationReachesOtherNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	store, nodes, _ := mustNodes(t, pool, 2)
	tenant, key := mustTenantKey(t, store, "free")
	for _, n := range nodes {
		if _, err := n.Resolve(ctx, key.Secret); err != nil {
			t.Fatal(err)
		}
	}
	changed := make(chan string, 1)
	nodes[1].OnTenantChange(func(id string) { changed <- id })

	steps := []struct {
		name   string
		sql    string
		kind   string
		id     string
		expect func(Principal, error) bool
	}{
		{"tier change", `UPDATE tenants SET tier = 'pro', updated_at = now() WHERE id = $1`, KindTenant, tenant.ID,
			func(p Principal, err error) bool { return err == nil && p.Tier.Slug == "pro" }},
		{"suspension", `UPDATE tenants SET status = 'suspended', updated_at = now() WHERE id = $1`, KindTenant, tenant.ID,
			func(_ Principal, err error) bool { return quota.ErrorCode(err) == quota.CodeForbidden }},
		{"revocation", `UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1`, KindKey, key.Prefix,
			func(_ Principal, err error) bool { return quota.ErrorCode(err) == quota.CodeUnauthorized }},
	}
	for _, st := range steps {
		if _, err := pool.Exec(ctx, st.sql, tenant.ID); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := nodes[0].Invalidate(ctx, st.kind, st.id); err != nil {
			t.Fatal(err)
		}
		for {
			p, err := nodes[1].Resolve(ctx, key.Secret)
			if st.expect(p, err) {
				break
			}
			if time.Since(start) > time.Second {
				t.Fatalf("%s: other node still sees tier %q err %v after 1s", st.name, p.Tier.Slug, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if st.kind == KindTenant {
			select {
			case id := <-changed:
				if id != tenant.ID {
					t.Fatalf("%s: OnTenantChange(%s), want %s", st.name, id, tenant.ID)
				}
			case <-time.After(time.Second):
				t.Fatalf("%s: OnTenantChange not called on the other node", st.name)
			}
		}
	}
}

// TestRefreshCoversAMissedMessage changes the database without publishing:
// Refresh alone must bring the node up to date.
func TestRefreshCoversAMissedMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	store, nodes, _ := mustNodes(t, pool, 1)
	tenant, key := mustTenantKey(t, store, "free")
	if _, err := nodes[0].Resolve(ctx, key.Secret); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE tenants SET tier = 'enterprise', updated_at = now() WHERE id = $1`, tenant.ID); err != nil {
		t.Fatal(err)
	}
	if p, _ := nodes[0].Resolve(ctx, key.Secret); p.Tier.Slug != "free" {
		t.Fatalf("before refresh: tier %q, want the cached free", p.Tier.Slug)
	}
	if err := nodes[0].Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := nodes[0].Resolve(ctx, key.Secret)
	if err != nil || p.Tier.Slug != "enterprise" || p.Upgrade() != nil {
		t.Fatalf("after refresh: tier %q upgrade %+v err %v, want enterprise with no upgrade", p.Tier.Slug, p.Upgrade(), err)
	}
}

// TestKeyPrincipalFollowsTheKey checks the lookup dashboard sessions use: by
// prefix, ended by revocation, expiry and suspension like Resolve.
func TestKeyPrincipalFollowsTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, nodes, _ := mustNodes(t, testenv.Postgres(t), 1)
	c := nodes[0]
	tenant, key := mustTenantKey(t, store, "free")
	p, err := c.KeyPrincipal(ctx, key.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if p.Tenant.ID != tenant.ID || p.KeyID != key.ID || p.Tier.Slug != "free" {
		t.Fatalf("got tenant %s key %s tier %s, want %s %s free", p.Tenant.ID, p.KeyID, p.Tier.Slug, tenant.ID, key.ID)
	}
	if _, err := c.KeyPrincipal(ctx, "tg_nosuchkey"); quota.ErrorCode(err) != quota.CodeUnauthorized {
		t.Errorf("unknown prefix: %v, want CodeUnauthorized", err)
	}

	if _, err := store.UpdateTenant(ctx, "test", tenant.ID, func(t *quota.Tenant) error { t.Status = quota.StatusSuspended; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Invalidate(ctx, KindTenant, tenant.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.KeyPrincipal(ctx, key.Prefix); quota.ErrorCode(err) != quota.CodeForbidden {
		t.Errorf("suspended tenant: %v, want CodeForbidden", err)
	}

	_, other := mustTenantKey(t, store, "free")
	if _, err := store.RevokeKey(ctx, "test", other.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Invalidate(ctx, KindKey, other.Prefix); err != nil {
		t.Fatal(err)
	}
	if _, err := c.KeyPrincipal(ctx, other.Prefix); quota.ErrorCode(err) != quota.CodeUnauthorized {
		t.Errorf("revoked key: %v, want CodeUnauthorized", err)
	}
}

// TestPrincipalKeepsNoBorrowedID: a tenant id that points into a buffer the
// caller reuses (a Fiber route parameter) must not become a cache key, or an
// invalidation can miss the entry and a stale tenant comes back.
func TestPrincipalKeepsNoBorrowedID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, nodes, _ := mustNodes(t, testenv.Postgres(t), 1)
	c := nodes[0]
	tenant, _ := mustTenantKey(t, store, "free")
	buf := []byte(tenant.ID)
	borrowed := unsafe.String(&buf[0], len(buf))
	if _, err := c.Principal(ctx, borrowed); err != nil {
		t.Fatal(err)
	}
	copy(buf, strings.Repeat("x", len(buf))) // the buffer serves another request
	if _, err := store.UpdateTenant(ctx, "test", tenant.ID, func(t *quota.Tenant) error { t.Tier = "pro"; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Invalidate(ctx, KindTenant, tenant.ID); err != nil {
		t.Fatal(err)
	}
	copy(buf, tenant.ID) // and holds the same id again
	p, err := c.Principal(ctx, tenant.ID)
	if err != nil {
		t.Fatal(err)
	}
	if p.Tier.Slug != "pro" {
		t.Errorf("after the tier change and its invalidation, tier %q, want pro", p.Tier.Slug)
	}
}

// TestPeriodDate: a grant's period start is the first local date of the
// tenant's day or billing month.
func TestPeriodDate(t *testing.T) {
	ny, err := quota.LoadZone("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 10, 3, 0, 0, 0, time.UTC) // 2026-03-09 23:00 in New York
	for _, tc := range []struct {
		cal    quota.Calendar
		period string
		want   string
	}{
		{quota.Calendar{}, "day", "2026-03-10"},
		{quota.Calendar{}, "month", "2026-03-01"},
		{quota.Calendar{AnchorDay: 15, Zone: ny}, "day", "2026-03-09"},
		{quota.Calendar{AnchorDay: 15, Zone: ny}, "month", "2026-02-15"},
		{quota.Calendar{AnchorDay: 9, Zone: ny}, "month", "2026-03-09"},
	} {
		if got := periodDate(tc.cal, tc.period, at).Format(time.DateOnly); got != tc.want {
			t.Errorf("periodDate(%v, %s) = %s, want %s", tc.cal, tc.period, got, tc.want)
		}
	}
}

// TestCalendarOf: a tenant's calendar, its zone loaded once per name; a
// zone unknown here counts as UTC.
func TestCalendarOf(t *testing.T) {
	c := &Catalog{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a := c.calendarOf(quota.Tenant{ID: "a", BillingAnchorDay: 15, TimeZone: "Asia/Kathmandu"})
	b := c.calendarOf(quota.Tenant{ID: "b", BillingAnchorDay: 3, TimeZone: "Asia/Kathmandu"})
	if a.AnchorDay != 15 || a.Zone == nil || a.Zone.String() != "Asia/Kathmandu" || a.Zone != b.Zone {
		t.Errorf("calendars %v %v: want anchor 15 in Asia/Kathmandu, one location for both", a, b)
	}
	if d := c.calendarOf(quota.Tenant{BillingAnchorDay: 1, TimeZone: "UTC"}); !d.IsDefault() {
		t.Errorf("UTC anchor 1: %v, want the default calendar", d)
	}
	if u := c.calendarOf(quota.Tenant{ID: "c", BillingAnchorDay: 1, TimeZone: "Mars/Olympus_Mons"}); !u.IsDefault() {
		t.Errorf("unknown zone: %v, want UTC", u)
	}
}
