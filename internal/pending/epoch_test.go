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

// TestEpochLostUntilRestored walks the epoch through a first start, a
// restore that fails, one that succeeds, a loss, and a loss during a
// restore.
func TestEpochLostUntilRestored(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t, c)
	r := New(redisfn.New(c, prefix))
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
	must(r.MarkRestoring(ctx))
	lost(true, "after a restore began and never succeeded")
	must(r.MarkRestoring(ctx))
	must(r.MarkRestored(ctx))
	lost(false, "after a successful restore")
	lost(false, "a cycle later")
	testenv.DeleteKeys(c, prefix+"*")
	lost(true, "after a loss")
	must(r.MarkRestoring(ctx))
	testenv.DeleteKeys(c, prefix+"*") // lost again while restoring
	must(r.MarkRestored(ctx))
	lost(true, "after a loss during the restore")
}
