package ratelimit

import (
	"context"
	_ "embed"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// admitV1Released is admit.lua as the last release that knew only the v1
// layout shipped it: the old nodes of a rolling upgrade.
//
//go:embed testdata/admit_v1_released.lua
var admitV1Released string

var oldAdmit = redis.NewScript(admitV1Released)

// oldNodeAdmit admits cost 1 against a monthly quota as an old node would.
func oldNodeAdmit(ctx context.Context, c redis.UniversalClient, r *Runner, tenant string, quotaN int64, now time.Time) (bool, error) {
	keys := []string{r.key(tenant, "gcra"), r.key(tenant, "bucket"), r.key(tenant, "day"), r.key(tenant, "month"), r.key(tenant, "pending")}
	res, err := oldAdmit.Run(ctx, c, keys, now.UnixMicro(), "admit", 1, "demo", "block", 0, 0, 0, 0, -1, quotaN).Int64Slice()
	if err != nil {
		return false, err
	}
	return res[0] == 1, nil
}

// TestLayoutV2CarriesV1StateOver: a v2 node finds a tenant's state in the
// v1 keys (written by a v1 node), continues from it, moves it, grant marks
// included, into the v2 hash and deletes the v1 keys.
func TestLayoutV2CarriesV1StateOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	v1, prefix := mustRunner(t, c)
	v1.WithLayout(LayoutV1)
	v2 := New(c, prefix)
	tenant := newTenant()
	limits := quota.Limits{BurstRate: f64(1), Burst: i64(10), DailyQuota: i64(100), MonthlyQuota: i64(1000)}
	req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 7, Limits: limits}
	mustAdmit(t, v1, req)
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := v1.ApplyGrant(ctx, tenant, quota.Calendar{}, "g-1", "day", quota.DayStart(now), 5); err != nil || !ok {
		t.Fatalf("ApplyGrant on v1: %t, %v", ok, err)
	}
	if n := c.Exists(ctx, v1.stateKeys(tenant)[0]).Val(); n != 0 {
		t.Fatalf("a v1 node wrote the v2 hash")
	}
	d := mustAdmit(t, v2, req)
	if l, _ := d.Limit(quota.LimitDaily); l.Remaining != 100+5-14 || l.Limit != 105 {
		t.Fatalf("daily after carry-over: %+v, want limit 105, remaining 91", l)
	}
	if l, _ := d.Limit(quota.LimitBurst); l.Remaining != 8 {
		t.Fatalf("burst after carry-over: %+v, want 8 (two requests within a second)", l)
	}
	keys := v1.stateKeys(tenant)
	if n := c.Exists(ctx, keys[1:]...).Val(); n != 0 {
		t.Errorf("%d v1 keys left after the carry-over, want 0", n)
	}
	if ttl := c.PTTL(ctx, keys[0]).Val(); ttl <= 0 {
		t.Errorf("v2 hash PTTL %v, want an expiry", ttl)
	}
	// The grant mark came along: applying g-1 again adds nothing.
	if ok, err := v2.ApplyGrant(ctx, tenant, quota.Calendar{}, "g-1", "day", quota.DayStart(now), 5); err != nil || !ok {
		t.Fatalf("ApplyGrant again: %t, %v", ok, err)
	}
	if st := stateOf(t, c, v2, tenant); st.Day.Grant != 5 || st.Day.Used != 14 {
		t.Errorf("day after the repeated grant: %+v, want grant 5, used 14", st.Day)
	}
	// A v1 node now reads and writes the v2 hash.
	mustAdmit(t, v1, req)
	if n := c.Exists(ctx, keys[1:]...).Val(); n != 0 {
		t.Errorf("a v1-layout node recreated %d v1 keys next to the v2 hash", n)
	}
	if st := stateOf(t, c, v2, tenant); st.Day.Used != 21 {
		t.Errorf("day used after a v1-layout node's admission: %d, want 21", st.Day.Used)
	}
}

// TestRollingUpgradeStaysExact drives one monthly quota from 48 clients at
// once through the two steps of a rolling upgrade: old nodes (the released
// v1 script) beside new nodes writing the v1 layout; then new nodes writing
// v1 beside new nodes writing v2. Each step admits exactly its quota.
func TestRollingUpgradeStaysExact(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	_, prefix := mustRunner(t, c)
	now := at(t, "2031-05-15T12:00:00Z")
	const quotaN, workers = 600, 48
	for _, step := range []struct {
		name string
		node func(i int) func(ctx context.Context, tenant string) (bool, error)
	}{
		{"old nodes beside new nodes in layout v1", func(i int) func(context.Context, string) (bool, error) {
			cl := testenv.Redis(t)
			r := New(cl, prefix).WithLayout(LayoutV1)
			if i%2 == 0 {
				return func(ctx context.Context, tenant string) (bool, error) {
					return oldNodeAdmit(ctx, cl, r, tenant, quotaN, now)
				}
			}
			return newNodeAdmit(r, quotaN, now)
		}},
		{"new nodes in layout v1 beside new nodes in layout v2", func(i int) func(context.Context, string) (bool, error) {
			layout := LayoutV1
			if i%2 == 0 {
				layout = LayoutV2
			}
			return newNodeAdmit(New(testenv.Redis(t), prefix).WithLayout(layout), quotaN, now)
		}},
	} {
		t.Run(step.name, func(t *testing.T) {
			tenant := newTenant()
			var admitted atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for i := range workers {
				admit := step.node(i)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						ok, err := admit(context.Background(), tenant)
						if err != nil {
							errs <- err
							return
						}
						if !ok {
							return
						}
						admitted.Add(1)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := admitted.Load(); got != quotaN {
				t.Fatalf("admitted %d, want exactly %d", got, quotaN)
			}
		})
	}
}

func newNodeAdmit(r *Runner, quotaN int64, now time.Time) func(context.Context, string) (bool, error) {
	return func(ctx context.Context, tenant string) (bool, error) {
		d, err := r.Admit(ctx, quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Now: now,
			Limits: quota.Limits{MonthlyQuota: &quotaN}})
		return d.Allowed, err
	}
}

// TestStateHashStaysCompact: the v2 hash keeps Redis's compact listpack
// encoding (each value under hash-max-listpack-value): a hash table would
// cost twice the memory and a slower HMGET on every admission.
func TestStateHashStaysCompact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	big := i64(1 << 40)
	limits := quota.Limits{BurstRate: f64(1e6), Burst: i64(1e9), BucketCapacity: i64(1e9), BucketRefillPerSec: f64(1e6),
		DailyQuota: big, MonthlyQuota: big}
	for _, meter := range []string{"demo", "a-meter-name-of-sixty-four-characters-is-the-longest-one-allowed"} {
		mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: meter, Cost: 1 << 39, Limits: limits})
	}
	if now, err := c.Time(ctx).Result(); err != nil {
		t.Fatal(err)
	} else if _, err := r.ApplyGrant(ctx, tenant, quota.Calendar{}, "0123456789abcdef0123456789abcdef", "month", quota.MonthStart(now), 1<<40); err != nil {
		t.Fatal(err)
	}
	key := r.stateKeys(tenant)[0]
	if enc := c.ObjectEncoding(ctx, key).Val(); enc != "listpack" && enc != "ziplist" {
		t.Fatalf("OBJECT ENCODING %s: %q, want listpack", key, enc)
	}
}
