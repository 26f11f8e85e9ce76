package worker

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/app"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/ratelimit"
	"github.com/tollgate/tollgate/internal/testenv"
)

// cyclesOfGrants runs the worker with env for n cycles, then stops it.
func cyclesOfGrants(t *testing.T, env map[string]string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	go func() {
		cycles := 0
		for sc := bufio.NewScanner(pr); sc.Scan(); {
			if strings.Contains(sc.Text(), `"msg":"worker cycle"`) {
				if cycles++; cycles == n {
					cancel()
				}
			}
		}
	}()
	err := app.RunWorker(ctx, func(k string) string { return env[k] }, pw)
	pw.Close()
	if err != nil {
		t.Fatalf("run = %v", err)
	}
	if ctx.Err() == context.DeadlineExceeded {
		t.Fatalf("fewer than %d cycles within 60 s", n)
	}
}

// TestWorkerAppliesAGrantRedisMissedOnce: a grant recorded but not applied
// (Redis failed when it was made) is applied by the worker's grants step,
// once: later cycles, and a step that finds it unmarked in Postgres again,
// add nothing. The step tells the API nodes (their deny caches) that the
// tenant has room. On the worker's first start the repair runs too: it
// restores only applied grants, so the grant still counts once.
func TestWorkerAppliesAGrantRedisMissedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, pool, rdb, prefix := stores(t)
	store := catalogdb.NewStore(pool)
	tenant, err := store.CreateTenant(ctx, "test", "acme", "free")
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	g, err := store.CreateGrant(ctx, "test", tenant.ID, "day", quota.DayStart(now), 5)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"REDIS_URL": testenv.RedisURL(t), "DATABASE_URL": dbURL, "TOLLGATE_REDIS_PREFIX": prefix,
		"TOLLGATE_RECONCILE_INTERVAL": interval, "TOLLGATE_LOG_LEVEL": "debug", "TOLLGATE_WORKER_METRICS_ADDR": "127.0.0.1:0",
	}
	stateKey := prefix + ":v2:{t:" + tenant.ID + "}" // lua/state.lua
	sub := rdb.Subscribe(ctx, prefix+":v1:invalidate")
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	for _, step := range []string{"first run", "after Postgres forgot it was applied"} {
		cyclesOfGrants(t, env, 3)
		select {
		case m := <-sub.Channel():
			if m.Payload != "room:"+tenant.ID {
				t.Errorf("%s: published %q, want %q", step, m.Payload, "room:"+tenant.ID)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s: no invalidation published for the tenant", step)
		}
		raw, err := rdb.HGet(ctx, stateKey, "q").Result()
		st, perr := ratelimit.ParseState(",", raw, "0,0")
		if got := st[4]; err != nil || perr != nil || got != 5 { // dg, the day's grant
			t.Errorf("%s: day grant in Redis %d (%v, %v), want 5", step, st[4], err, perr)
		}
		var applied bool
		if err := pool.QueryRow(ctx, `SELECT applied_at IS NOT NULL FROM grants WHERE id = $1`, g.ID).Scan(&applied); err != nil || !applied {
			t.Errorf("%s: grant applied in Postgres %v (%v), want true", step, applied, err)
		}
		if _, err := pool.Exec(ctx, `UPDATE grants SET applied_at = NULL WHERE id = $1`, g.ID); err != nil {
			t.Fatal(err)
		}
	}
}
