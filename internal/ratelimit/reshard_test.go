package ratelimit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The reshard tests put a Runner's calls in the states a slot passes
// through while it moves between masters, on a cluster of their own.
// internal/billing's reshard tests run whole reshapings under load.

var monthOnly = quota.Limits{MonthlyQuota: i64(1000)}

// migratingPair starts an own cluster of three masters and returns a
// runner on it, two tenants of different slots served by one master, the
// first's slot marked migrating to another master (and importing there)
// with its state left on the first master, and the other master.
func migratingPair(t *testing.T) (oc *testenv.OwnCluster, cc *redis.ClusterClient, r *stack, a, b string, slot int, to testenv.ClusterNode) {
	t.Helper()
	oc = testenv.StartOwnCluster(t, 3, 0)
	cc = oc.Client()
	r, _ = mustRunner(t, cc)
	ctx := context.Background()
	a = newTenant()
	slot = redisfn.KeySlot("t:" + a)
	owner := oc.OwnerOf(slot)
	for tries := 0; b == ""; tries++ {
		if tries > 1000 {
			t.Fatal("no second tenant on the first's master")
		}
		if id := newTenant(); redisfn.KeySlot("t:"+id) != slot && oc.OwnerOf(redisfn.KeySlot("t:"+id)).ID == owner.ID {
			b = id
		}
	}
	for _, id := range []string{a, b} {
		if d := mustAdmit(t, r, quota.Request{TenantID: id, Meter: "demo", Cost: 1, Limits: monthOnly}); !d.Allowed {
			t.Fatalf("tenant %s: %s, want allowed", id, fmtDecision(d))
		}
	}
	for _, m := range oc.Masters() {
		if m.ID != owner.ID {
			to = m
		}
	}
	src, dst := redis.NewClient(&redis.Options{Addr: owner.Addr}), redis.NewClient(&redis.Options{Addr: to.Addr})
	defer src.Close()
	defer dst.Close()
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", owner.ID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", to.ID).Err(); err != nil {
		t.Fatal(err)
	}
	return oc, cc, r, a, b, slot, to
}

// monthUsed is the tenant's monthly units used, as Peek reports them.
func monthUsed(tb testing.TB, r *stack, id string) int64 {
	tb.Helper()
	d, err := r.Peek(context.Background(), id, monthOnly, time.Time{})
	if err != nil {
		tb.Fatal(err)
	}
	l, _ := d.Limit(quota.LimitMonthly)
	return l.Limit - l.Remaining
}

// TestBatchBesideAMigratingSlotCountsEachCallOnce sends one pipeline of
// two admissions to a master: the first for a tenant whose slot is
// migrating with its keys split (Redis answers TRYAGAIN: it ran nothing),
// the second for a tenant of a stable slot, which Redis runs. The second
// must count once: a client that sends the master's part of the pipeline
// again for the first's TRYAGAIN would run it again.
func TestBatchBesideAMigratingSlotCountsEachCallOnce(t *testing.T) {
	t.Parallel()
	oc, _, r, a, b, slot, to := migratingPair(t)
	batch := make([]*call, 2)
	for i, id := range []string{a, b} {
		keys, args, _ := r.admitCall(id, "", 0, "admit", 1, "demo", "block", mustParams(t, monthOnly), "", 0, nil, nil)
		batch[i] = &call{keys: keys, args: args, done: make(chan struct{}, 1)}
	}
	r.batch.run(batch, nil)
	if batch[0].err == nil || !strings.Contains(batch[0].err.Error(), "TRYAGAIN") {
		t.Fatalf("tenant of the migrating slot: err %v, want TRYAGAIN", batch[0].err)
	}
	if batch[1].err != nil {
		t.Fatalf("tenant of a stable slot: %v", batch[1].err)
	}
	if got := monthUsed(t, r, b); got != 2 {
		t.Errorf("tenant of a stable slot: %d units used after two admissions, want 2", got)
	}
	oc.MoveSlot(slot, to, 10, nil)
	if got := monthUsed(t, r, a); got != 1 {
		t.Errorf("tenant of the migrating slot: %d units used, want the 1 before the refused call", got)
	}
}

func mustParams(tb testing.TB, l quota.Limits) params {
	tb.Helper()
	p, err := paramsOf(l)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestMasterAddedGetsTheLibraryOnItsFirstCall adds a master (without the
// Function library: nothing copies it there) and starts moving a slot to
// it: while the slot is importing the new master serves no slot, yet a
// call of a key of the slot is sent there (ASK). The runner loads the
// library there and calls again; once the slot is the new master's, its
// admissions count there.
func TestMasterAddedGetsTheLibraryOnItsFirstCall(t *testing.T) {
	t.Parallel()
	oc := testenv.StartOwnCluster(t, 3, 0)
	cc := oc.Client()
	r, _ := mustRunner(t, cc)
	ctx := context.Background()
	if err := r.LoadFunctions(ctx, nil); err != nil {
		t.Fatal(err)
	}
	added := oc.AddMaster()
	a := newTenant()
	slot := redisfn.KeySlot("t:" + a)
	owner := oc.OwnerOf(slot)
	src, dst := redis.NewClient(&redis.Options{Addr: owner.Addr}), redis.NewClient(&redis.Options{Addr: added.Addr})
	defer src.Close()
	defer dst.Close()
	if libs, err := dst.FunctionList(ctx, redis.FunctionListQuery{}).Result(); err != nil || len(libs) != 0 {
		t.Fatalf("new master: libraries %v, %v; want none", libs, err)
	}
	for _, c := range []struct {
		n    *redis.Client
		args []any
	}{{dst, []any{"CLUSTER", "SETSLOT", slot, "IMPORTING", owner.ID}}, {src, []any{"CLUSTER", "SETSLOT", slot, "MIGRATING", added.ID}}} {
		if err := c.n.Do(ctx, c.args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// A call of one key the old owner does not have: ASK, to the new master.
	if err := r.Finish(ctx, []quota.Batch{{TenantID: a, ID: "none"}}); err != nil {
		t.Fatalf("Finish while the slot imports to a master without the library: %v", err)
	}
	libs, err := dst.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil || len(libs) != 1 || libs[0].Name != r.FunctionLibrary() {
		t.Fatalf("new master: libraries %+v, %v; want %s", libs, err, r.FunctionLibrary())
	}
	for _, m := range append([]testenv.ClusterNode{added, owner}, oc.Masters()...) {
		n := redis.NewClient(&redis.Options{Addr: m.Addr})
		err := n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", added.ID).Err()
		n.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	if d := mustAdmit(t, r, quota.Request{TenantID: a, Meter: "demo", Cost: 1, Limits: monthOnly}); !d.Allowed {
		t.Fatalf("after the move: %s, want allowed", fmtDecision(d))
	}
	if n, err := dst.Exists(ctx, r.StateKey(a)).Result(); err != nil || n != 1 {
		t.Errorf("the tenant's state on the new master: %d, %v; want it there", n, err)
	}
	if got := monthUsed(t, r, a); got != 1 {
		t.Errorf("%d units used after one admission, want 1", got)
	}
}
