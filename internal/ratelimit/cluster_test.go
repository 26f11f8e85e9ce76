package ratelimit

import (
	"context"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The cluster tests run the admission tests against a three-master Redis
// Cluster, with tenants whose hash tags land on different masters. Any
// CROSSSLOT error (a script touching keys of two slots) fails them.

func TestClusterPropertyScriptMatchesModel(t *testing.T) {
	t.Parallel()
	runProperty(t, testenv.Cluster(t), 6, 100)
}

func TestClusterExactQuotaUnderConcurrency(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t)
	testExactQuota(t, c, testenv.Cluster, tenantsOnDistinctMasters(t, c, 3))
}

func TestClusterIdempotentRepeat(t *testing.T) {
	t.Parallel()
	testIdempotency(t, testenv.Cluster(t))
}

// TestClusterTenantKeysShareOneSlot admits with every kind of key for
// tenants on each master and checks that all of a tenant's keys hash to one
// slot, which is what lets one script touch them all.
func TestClusterTenantKeysShareOneSlot(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	for _, tenant := range tenantsOnDistinctMasters(t, c, 3) {
		d, err := r.Admit(ctx, quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Limits: allLimits(), IdempotencyKey: "k"})
		if err != nil {
			if strings.Contains(err.Error(), "CROSSSLOT") {
				t.Fatalf("tenant %s: CROSSSLOT: %v", tenant, err)
			}
			t.Fatalf("tenant %s: %v", tenant, err)
		}
		if !d.Allowed {
			t.Fatalf("tenant %s: got %s, want allowed", tenant, fmtDecision(d))
		}
		if err := r.Grant(ctx, tenant, "day", 1, d.Now); err != nil {
			t.Fatalf("tenant %s: Grant: %v", tenant, err)
		}
		if _, err := r.Peek(ctx, tenant, allLimits(), d.Now); err != nil {
			t.Fatalf("tenant %s: Peek: %v", tenant, err)
		}
		keys := r.keys(tenant, redisfn.IdemHash("k"))
		want := c.ClusterKeySlot(ctx, keys[0]).Val()
		for _, k := range keys[1:] {
			if got := c.ClusterKeySlot(ctx, k).Val(); got != want {
				t.Errorf("slot of %s: got %d, want %d (the slot of %s)", k, got, want, keys[0])
			}
		}
	}
}
