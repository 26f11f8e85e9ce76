package pending

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

func TestKeySlotMatchesRedis(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t)
	ctx := context.Background()
	for _, tag := range []string{"", "e:0", "e:1", "e:12345", "t:tn-" + testenv.RandomHex(6), "123456789"} {
		want, err := c.ClusterKeySlot(ctx, "x:v1:{"+tag+"}:epoch").Result()
		if tag == "" { // an empty tag is no tag: the whole key is hashed
			want, err = c.ClusterKeySlot(ctx, tag).Result()
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := redisfn.KeySlot(tag); int64(got) != want {
			t.Errorf("redisfn.KeySlot(%q) = %d, want %d (CLUSTER KEYSLOT)", tag, got, want)
		}
	}
}

// TestEpochKeysOnePerMaster checks that the epoch keys of a three-master
// cluster land one on each master.
func TestEpochKeysOnePerMaster(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t)
	cc := c.(*redis.ClusterClient)
	r := New(redisfn.New(c, testenv.Prefix(t, c)))
	ctx := context.Background()
	keys, err := r.epochKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 {
		t.Fatalf("got %d epoch keys %v, want 3 (one per master)", len(keys), keys)
	}
	seen := map[string]string{}
	for _, k := range keys {
		node, err := cc.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if other, dup := seen[node.Options().Addr]; dup {
			t.Errorf("epoch keys %s and %s are both on master %s", other, k, node.Options().Addr)
		}
		seen[node.Options().Addr] = k
	}
}

// epochUsage returns a Redis server, the test's prefix on it and a Usage
// there.
func epochUsage(t *testing.T) (redis.UniversalClient, string, *Usage) {
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t, c)
	return c, prefix, New(redisfn.New(c, prefix))
}

// TestEpochLostUntilRestored walks the epoch through a first start, a
// restore that fails, one that succeeds, a loss, and a loss during a
// restore.
func TestEpochLostUntilRestored(t *testing.T) {
	t.Parallel()
	c, prefix, r := epochUsage(t)
	ctx := context.Background()
	lost := func(want bool, when string) {
		t.Helper()
		got, err := r.EpochLost(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("EpochLost %s: got %t, want %t", when, got, want)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	lost(true, "at the first start")
	must(r.MarkRestoring(ctx, false))
	lost(true, "after a restore began and never succeeded")
	must(r.MarkRestoring(ctx, false))
	must(r.MarkIntact(ctx, 0))
	lost(false, "after a successful restore")
	lost(false, "a cycle later")
	testenv.DeleteKeys(c, prefix+"*")
	lost(true, "after a loss")
	must(r.MarkRestoring(ctx, false))
	testenv.DeleteKeys(c, prefix+"*") // lost again while restoring
	must(r.MarkIntact(ctx, 0))
	lost(true, "after a loss during the restore")
}

// TestEpochWentBack: a key whose generation is below the one Postgres
// confirmed is older data; a restore after it stays marked so until it
// succeeded; a key of an earlier release (no generation) is not. A raise
// never lowers a generation, and leaves a key restoring or gone as it is.
func TestEpochWentBack(t *testing.T) {
	t.Parallel()
	c, prefix, r := epochUsage(t)
	ctx := context.Background()
	state := func(confirmed int64, wantLost, wantBack bool, when string) {
		t.Helper()
		lost, back, err := r.EpochState(ctx, confirmed)
		if err != nil {
			t.Fatal(err)
		}
		if lost != wantLost || back != wantBack {
			t.Errorf("EpochState(%d) %s: lost %t, went back %t; want %t, %t", confirmed, when, lost, back, wantLost, wantBack)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(r.MarkRestoring(ctx, false))
	must(r.MarkIntact(ctx, 7))
	state(7, false, false, "at the generation confirmed")
	state(6, false, false, "ahead of the one confirmed (written, not confirmed yet)")
	state(8, false, true, "behind the one confirmed")
	must(r.MarkRestoring(ctx, true))
	state(8, true, true, "while the restore after older data has not succeeded")
	must(r.MarkIntact(ctx, 8))
	state(8, false, false, "after it succeeded")
	must(c.Set(ctx, prefix+":v1:epoch", "intact", 0).Err())
	state(8, false, false, "a key of an earlier release")
	must(r.MarkIntact(ctx, 8))
	must(r.RaiseGeneration(ctx, 10))
	state(10, false, false, "raised")
	must(r.RaiseGeneration(ctx, 9))
	state(10, false, false, "never lowered")
	must(r.MarkRestoring(ctx, false))
	must(r.RaiseGeneration(ctx, 11))
	state(0, true, false, "restoring is left as it is")
	testenv.DeleteKeys(c, prefix+"*")
	must(r.MarkIntact(ctx, 12))
	must(r.RaiseGeneration(ctx, 12))
	state(12, true, false, "a key gone stays gone")
}
