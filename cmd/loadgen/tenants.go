package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/quota"
)

// manyTier is the tier of the many-tenant rows' tenants: made afresh on
// every run, and deleted after it (and those of a killed run, before it).
const manyTier = "loadgen-round-robin"

// tenants are loadgen's own, made afresh on every run.
type tenants struct {
	admittedID, admittedKey string // on a tier whose limits the load cannot reach
	// decideID, decideKey: the tenant of the decision API's rows (/v1/check,
	// gRPC), on a tier of their own, limits as admittedID's: each counted
	// decision leaves a settle reservation for 10 minutes, which is no
	// part of what the hot tenant keeps.
	decideID, decideKey string
	refusedKey          string   // on a tier of one request a day
	manyIDs, manyKeys   []string // on manyTier, limits as admittedID's
}

// newTenants makes the hot tenant, the refused one and n on manyTier,
// each with a key, after deleting the manyTier tenants a killed run left.
func newTenants(ctx context.Context, dbURL string, n int) (tenants, error) {
	db, err := pgdb.Open(ctx, dbURL)
	if err != nil {
		return tenants{}, err
	}
	defer db.Close()
	store := catalogdb.NewStore(db)
	var ten tenants
	for _, tc := range []struct {
		tier    quota.Tier
		id, key *string
	}{
		{quota.Tier{Slug: "loadgen", Name: "Load generator", Rank: 1_000_000, Overage: quota.OverageBlock,
			Limits: unreachableLimits()}, &ten.admittedID, &ten.admittedKey},
		{quota.Tier{Slug: "loadgen-refused", Name: "Load generator, one request a day", Rank: 999_999, Overage: quota.OverageBlock,
			Limits: quota.Limits{DailyQuota: quota.Ptr(int64(1))}}, nil, &ten.refusedKey},
		{quota.Tier{Slug: "loadgen-decide", Name: "Load generator, decision API", Rank: 999_997, Overage: quota.OverageBlock,
			Limits: unreachableLimits()}, &ten.decideID, &ten.decideKey},
	} {
		id, key, err := tenantOn(ctx, store, tc.tier)
		if err != nil {
			return tenants{}, err
		}
		if tc.id != nil {
			*tc.id = id
		}
		*tc.key = key
	}

	stale, err := tenantsOf(ctx, store, manyTier)
	if err != nil {
		return tenants{}, err
	}
	if err := deleteAll(ctx, store, stale); err != nil {
		return tenants{}, err
	}
	tier := quota.Tier{Slug: manyTier, Name: "Load generator, tenants in turn", Rank: 999_998, Overage: quota.OverageBlock,
		Limits: unreachableLimits()}
	if _, err := store.CreateTier(ctx, "loadgen", tier); err != nil && quota.ErrorCode(err) != quota.CodeConflict {
		return tenants{}, err
	}
	ten.manyIDs, ten.manyKeys = make([]string, n), make([]string, n)
	err = inParallel(ctx, n, func(ctx context.Context, i int) error {
		var err error
		ten.manyIDs[i], ten.manyKeys[i], err = tenantOn(ctx, store, tier)
		return err
	})
	if err != nil {
		return tenants{}, fmt.Errorf("the %d tenants of tier %s: %w", n, manyTier, err)
	}
	return ten, nil
}

// unreachableLimits are the limits of a tier the load cannot reach.
func unreachableLimits() quota.Limits {
	big := quota.Ptr(quota.MaxQuantity)
	return quota.Limits{BurstRate: quota.Ptr(1e6), Burst: quota.Ptr(int64(1e9)), BucketCapacity: quota.Ptr(int64(1e9)),
		BucketRefillPerSec: quota.Ptr(1e6), DailyQuota: big, MonthlyQuota: big}
}

// tenantOn creates the tier (unless it exists), a new tenant on it and
// a key of that tenant.
func tenantOn(ctx context.Context, store *catalogdb.Store, tier quota.Tier) (id, key string, err error) {
	if _, err := store.CreateTier(ctx, "loadgen", tier); err != nil && quota.ErrorCode(err) != quota.CodeConflict {
		return "", "", err
	}
	t, err := store.CreateTenant(ctx, "loadgen", "loadgen", tier.Slug)
	if err != nil {
		return "", "", err
	}
	k, err := store.IssueKey(ctx, "loadgen", t.ID, "loadgen")
	if err != nil {
		return "", "", err
	}
	return t.ID, k.Secret, nil
}

// tenantsOf lists the ids of the tenants of a tier.
func tenantsOf(ctx context.Context, store *catalogdb.Store, tier string) ([]string, error) {
	var ids []string
	page := quota.Page{Limit: 100}
	for {
		ts, next, err := store.ListTenants(ctx, quota.TenantFilter{Tier: tier}, page)
		if err != nil {
			return nil, err
		}
		for _, t := range ts {
			ids = append(ids, t.ID)
		}
		if next == nil || *next == "" {
			return ids, nil
		}
		page.Cursor = *next
	}
}

// deleteTenants deletes the tenants with these ids, with their keys.
func deleteTenants(ctx context.Context, dbURL string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	db, err := pgdb.Open(ctx, dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	return deleteAll(ctx, catalogdb.NewStore(db), ids)
}

func deleteAll(ctx context.Context, store *catalogdb.Store, ids []string) error {
	return inParallel(ctx, len(ids), func(ctx context.Context, i int) error {
		if err := store.DeleteTenant(ctx, "loadgen", ids[i]); err != nil && quota.ErrorCode(err) != quota.CodeNotFound {
			return fmt.Errorf("deleting tenant %s: %w", ids[i], err)
		}
		return nil
	})
}

// inParallel calls fn for 0 ≤ i < n from a few goroutines (Postgres's
// round trips, not its CPU, bound making hundreds of tenants) and returns
// the first error, after which the calls not yet started are skipped.
func inParallel(ctx context.Context, n int, fn func(context.Context, int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(n, 8) {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}
