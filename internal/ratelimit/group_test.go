package ratelimit

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// groupRequests are one tenant's requests of a grouped-decision test: a
// burst limit, a bucket, a daily quota, a billed monthly quota under a
// spend cap, and a meter with a billed quota of its own; costs that pass,
// bill, hit the cap and pass the day; an idempotency key used twice (a
// replay) and once for another request (a mismatch); a dry run; another
// meter; a tenant's fixed window and concurrency policies (leases) on some.
func groupRequests(tenant string, now time.Time) []quota.Request {
	window, leases := fixedWindow("g-window", 4, quota.ScopeTenant, quota.RefuseReject), concurrencyPolicy("g-leases", 2, quota.ScopeTenant)
	f := func(v float64) *float64 { return &v }
	lim := quota.Limits{BurstRate: f(5), Burst: i64(9), BucketCapacity: i64(40), BucketRefillPerSec: f(2),
		DailyQuota: i64(30), MonthlyQuota: i64(12), MaxOverageCents: i64(3)}
	mqs := []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(4), Overage: quota.OverageBill, OveragePriceCentsPer1K: 2000}}
	base := quota.Request{TenantID: tenant, Meter: "echo", Cost: 1, Limits: lim, Overage: quota.OverageBill,
		OveragePriceCentsPer1K: 1000, MeterQuotas: mqs, Now: now}
	var reqs []quota.Request
	add := func(mut func(*quota.Request)) {
		r := base
		r.RequestID = fmt.Sprintf("req-%02d", len(reqs))
		mut(&r)
		reqs = append(reqs, r)
	}
	for i, cost := range []int64{3, 5, 2, 4, 1, 6, 2, 8, 1, 3} {
		add(func(r *quota.Request) {
			r.Cost = cost
			r.Now = now.Add(time.Duration(i) * 50 * time.Millisecond)
			if i%3 == 1 {
				r.Meter = "search"
			}
			if i%2 == 0 {
				r.Policies = policyReq(tenant, r.Now, i, 1, window, leases).Policies
			}
		})
		switch i {
		case 2:
			add(func(r *quota.Request) {
				r.IdempotencyKey, r.IdempotencyFingerprint, r.Now = "k1", "fp1", now.Add(110*time.Millisecond)
			})
		case 4:
			add(func(r *quota.Request) { r.DryRun, r.Cost = true, 7 })
			add(func(r *quota.Request) {
				r.IdempotencyKey, r.IdempotencyFingerprint, r.Now = "k1", "fp1", now.Add(230*time.Millisecond)
			})
		case 6:
			add(func(r *quota.Request) {
				r.IdempotencyKey, r.IdempotencyFingerprint, r.Now = "k1", "fp2", now.Add(330*time.Millisecond)
			})
		}
	}
	return reqs
}

// TestGroupedDecisionsAreThoseOfEachAlone: one tenant's admissions that
// the batcher sends as one group (one call of admitn) get the answers,
// and leave the state, that each would have had alone, in arrival order.
// A call of the group that Redis refuses with an error gets that error,
// and the others their own answers.
func TestGroupedDecisionsAreThoseOfEachAlone(t *testing.T) {
	t.Parallel()
	groupedAsAlone(t, testenv.Redis(t))
}

// TestClusterGroupedDecisionsAreThoseOfEachAlone is the same on the
// 3-master cluster (a group is one call on the tenant's slot).
func TestClusterGroupedDecisionsAreThoseOfEachAlone(t *testing.T) {
	t.Parallel()
	groupedAsAlone(t, testenv.Cluster(t))
}

func groupedAsAlone(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	alone, alonePrefix := mustRunner(t, c)
	grouped, groupedPrefix := mustRunner(t, c)
	tenant := newTenant()
	// The month rolls within the group. (The times are ahead of the real
	// clock: keys written at a past time may expire, by Redis's clock,
	// between the two snapshots.)
	y, m, _ := time.Now().UTC().Date()
	now := time.Date(y, m+2, 1, 0, 0, 0, 0, time.UTC).Add(-200 * time.Millisecond)
	reqs := groupRequests(tenant, now)

	want := make([]string, len(reqs))
	for i, req := range reqs {
		d, err := alone.Admit(ctx, req)
		if err != nil {
			t.Fatalf("alone %d: %v", i, err)
		}
		want[i] = fmtGrouped(d)
	}

	// The grouped runner's senders are held: each Admit queues its call
	// and waits, in the order of reqs; the test then sends the queue as
	// one batch, with a call that Redis refuses in the middle.
	b := grouped.batch
	b.once.Do(func() {})
	got := make([]string, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := grouped.Admit(ctx, req)
			if err != nil {
				got[i] = "error: " + err.Error()
				return
			}
			got[i] = fmtGrouped(d)
		}()
		deadline := time.Now().Add(10 * time.Second)
		for len(b.queue) < i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("call %d not queued within 10 s", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	batch := make([]*call, 0, len(reqs)+1)
	for range reqs {
		batch = append(batch, <-b.queue)
	}
	bad := &call{keys: batch[0].keys, args: append([]any{}, batch[0].args...), done: make(chan struct{}, 1)}
	bad.args[2] = "not a number"
	batch = append(batch[:5], append([]*call{bad}, batch[5:]...)...)
	before := b.grouped.Load()
	b.run(batch, nil)
	for _, cl := range batch {
		cl.done <- struct{}{}
	}
	wg.Wait()

	if n := b.grouped.Load() - before; n != int64(len(batch)) {
		t.Fatalf("%d calls went in a group, want all %d", n, len(batch))
	}
	if bad.err == nil || bad.res != nil {
		t.Errorf("the call Redis refuses: %v %v, want its error alone", bad.res, bad.err)
	}
	for i := range reqs {
		if got[i] != want[i] {
			t.Errorf("request %d grouped:\n  %s\nalone:\n  %s", i, got[i], want[i])
		}
	}
	// The state each leaves is the same (key for key, but for the prefix;
	// expiries of explicit past times are shifted by the real clock).
	strip := func(snap map[string]string, prefix string) map[string]string {
		out := map[string]string{}
		for k, v := range snap {
			out[strings.TrimPrefix(k, prefix)] = v[:strings.IndexByte(v, '@')]
		}
		return out
	}
	a, g := strip(mustSnapshot(t, c, alonePrefix), alonePrefix), strip(mustSnapshot(t, c, groupedPrefix), groupedPrefix)
	if len(a) == 0 || len(a) != len(g) {
		t.Fatalf("keys alone %v, grouped %v", slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(g)))
	}
	for k, v := range a {
		if g[k] != v {
			t.Errorf("key %s: grouped state differs from alone", k)
		}
	}
}

// fmtGrouped is fmtDecision with the policies' states.
func fmtGrouped(d quota.Decision) string {
	s := fmtDecision(d)
	for _, p := range d.Policies {
		s += fmt.Sprintf(" | policy %+v", p)
	}
	return s
}
