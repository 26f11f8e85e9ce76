package catalog

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPrepaidBalanceCache: a prepaid tenant's balance is read once for
// many concurrent requests, then served from the cache; a credit grant
// (Credited) drops it on every node, so the next request reads the new
// balance; a change nothing announces waits for the refresh loop, not for
// a request; a postpaid tenant has none and costs no read.
func TestPrepaidBalanceCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	store, nodes, srcs := mustNodes(t, pool, 2)
	tier, err := store.CreateTier(ctx, "test", quota.Tier{Slug: "payg", Name: "PAYG", Rank: 4242,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(0))}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
		Billing: quota.BillingPrepaid, TopUpURL: "https://example.com/up"})
	if err != nil {
		t.Fatal(err)
	}
	tenant, _ := mustTenantKey(t, store, tier.Slug)
	p, err := nodes[1].Principal(ctx, tenant.ID)
	if err != nil {
		t.Fatal(err)
	}
	before := srcs[1].reads.Load()
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			pp, err := nodes[1].Prepaid(ctx, p, time.Now())
			if err != nil || pp == nil || pp.BalanceMillicents != 0 {
				t.Errorf("Prepaid = %+v, %v; want a balance of 0", pp, err)
			}
		})
	}
	wg.Wait()
	if got := srcs[1].reads.Load() - before; got != 1 {
		t.Fatalf("32 concurrent lookups made %d reads, want 1", got)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO credits (tenant_id, amount_cents, reason, created_at) VALUES ($1, 250, 'top-up', now())`, tenant.ID); err != nil {
		t.Fatal(err)
	}
	nodes[0].Credited(ctx, tenant.ID) // granted through the other node
	deadline := time.Now().Add(3 * time.Second)
	for {
		pp, err := nodes[1].Prepaid(ctx, p, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if pp.BalanceMillicents == 250_000 && pp.CreditCents == 250 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other node still has %+v, want 250 cents", pp)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// a change no invalidation announces (an invoice made final draws the
	// credit): requests keep the cached balance, without a read; the
	// refresh loop reads it
	if _, err := pool.Exec(ctx, `UPDATE credits SET drawn_cents = 100 WHERE tenant_id = $1`, tenant.ID); err != nil {
		t.Fatal(err)
	}
	before = srcs[1].reads.Load()
	for range 10 {
		if pp, err := nodes[1].Prepaid(ctx, p, time.Now()); err != nil || pp.CreditCents != 250 {
			t.Fatalf("before the refresh: %+v, %v; want the cached 250 cents", pp, err)
		}
	}
	if got := srcs[1].reads.Load() - before; got != 0 {
		t.Fatalf("10 cached lookups made %d reads, want 0", got)
	}
	if err := nodes[1].Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	before = srcs[1].reads.Load()
	if pp, err := nodes[1].Prepaid(ctx, p, time.Now()); err != nil || pp.CreditCents != 150 || srcs[1].reads.Load() != before {
		t.Fatalf("after the refresh: %+v, %v; want 150 cents from the cache", pp, err)
	}
	free, _ := mustTenantKey(t, store, "free")
	fp, err := nodes[1].Principal(ctx, free.ID)
	if err != nil {
		t.Fatal(err)
	}
	before = srcs[1].reads.Load()
	if pp, err := nodes[1].Prepaid(ctx, fp, time.Now()); pp != nil || err != nil || srcs[1].reads.Load() != before {
		t.Fatalf("postpaid: %+v, %v, %d reads; want nil and none", pp, err, srcs[1].reads.Load()-before)
	}
}
