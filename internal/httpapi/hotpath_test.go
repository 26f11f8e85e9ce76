package httpapi

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/admission"
	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

// roundTrips counts what a Redis client sends: one per command, one per
// pipeline.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// pgReads wraps the real store and counts its reads.
type pgReads struct {
	*catalogdb.Store
	n atomic.Int64
}

func (s *pgReads) KeyByPrefix(ctx context.Context, p string) (quota.KeyRecord, error) {
	s.n.Add(1)
	return s.Store.KeyByPrefix(ctx, p)
}
func (s *pgReads) Tenant(ctx context.Context, id string) (quota.Tenant, error) {
	s.n.Add(1)
	return s.Store.Tenant(ctx, id)
}
func (s *pgReads) Tiers(ctx context.Context) ([]quota.Tier, error) {
	s.n.Add(1)
	return s.Store.Tiers(ctx)
}

// TestHotPathIsOneRedisRoundTripAndNoPostgres checks the promise of
// DESIGN.md on the real app: once a key is cached, a metered request makes
// exactly one Redis round trip and no Postgres query.
func TestHotPathIsOneRedisRoundTripAndNoPostgres(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	opts, _ := redisOptions(testenv.RedisURL(t))
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	hook := &roundTrips{}
	rdb.AddHook(hook)
	prefix := testenv.Prefix(t, testenv.Redis(t))
	store := catalogdb.NewStore(pool)
	src := &pgReads{Store: store}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	runner := quotaredis.New(rdb, prefix)
	s, err := New(Deps{Log: log, Store: store, Sessions: redisdb.NewSessions(rdb, prefix), Catalog: catalog.New(src, rdb, prefix, log, time.Now),
		Gate: admission.New(runner, time.Now), Ledger: billing.NewLedger(pool)}, Options{BodyLimit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}

	tenant, err := store.CreateTenant(context.Background(), "test", "hot", "pro")
	if err != nil {
		t.Fatal(err)
	}
	key, err := store.IssueKey(context.Background(), "test", tenant.ID, "k")
	if err != nil {
		t.Fatal(err)
	}
	call := func() int {
		req := httptest.NewRequest("GET", "/api/demo/echo", nil)
		req.Header.Set("Authorization", "Bearer "+key.Secret)
		resp, err := s.App().Test(req, 5000)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := call(); got != 200 { // warms the cache
		t.Fatalf("status %d, want 200", got)
	}
	redisBefore, pgBefore := hook.n.Load(), src.n.Load()
	const n = 20
	for range n {
		if got := call(); got != 200 {
			t.Fatalf("status %d, want 200", got)
		}
	}
	if got := hook.n.Load() - redisBefore; got != n {
		t.Errorf("%d metered requests made %d Redis round trips, want exactly %d", n, got, n)
	}
	if got := src.n.Load() - pgBefore; got != 0 {
		t.Errorf("%d metered requests made %d Postgres reads, want 0", n, got)
	}
}

func redisOptions(url string) (*redis.Options, error) {
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	o.Protocol = 2
	return o, nil
}
