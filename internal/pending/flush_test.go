package pending_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/quotaredis/quotaredistest"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

// slotTenants returns n tenant ids whose keys are in the eight slots s
// with s%2048 == 5 (spread over the masters of a cluster), about n/8 a
// slot: in a cluster, many tenants of the same slots.
func slotTenants(n int) []string {
	base := "tn-" + testenv.RandomHex(4) + "-"
	var ids []string
	for j := 0; len(ids) < n; j++ {
		id := base + strconv.Itoa(j)
		if redisfn.KeySlot("t:"+id)%2048 == 5 {
			ids = append(ids, id)
		}
	}
	return ids
}

// TestClaimFinishIdleOverManyTenants: the worker's flush of 1,200 tenants
// (more than one pipeline; in a cluster 600 of them in eight slots, the
// others anywhere), on a single Redis and on a Redis Cluster: every tenant with
// usage is claimed once, with its rows (a tenant's unreadable field is its
// batch's Err, no other's); a second claim returns the same batches,
// resumed; Finish drops only the batches it names by their ids, and so does
// a claim that names them (taking the usage pending since); Idle takes
// tenants out of the active set.
func TestClaimFinishIdleOverManyTenants(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client func(testing.TB) redis.UniversalClient
	}{{"redis", testenv.Redis}, {"cluster", testenv.Cluster}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := tc.client(t)
			r := quotaredis.New(c, testenv.Prefix(t, c))
			ids := slotTenants(600)
			for range 600 {
				ids = append(ids, quotaredistest.NewTenant())
			}
			now := time.Date(2026, 11, 22, 10, 30, 0, 0, time.UTC)
			idle := func(i int) bool { return i%4 == 3 } // never admitted
			const bad = 6                                // a field the worker cannot read
			cost := func(i int) int64 { return 1 + int64(i%7) }
			var active []any
			for i, id := range ids {
				active = append(active, id)
				if !idle(i) {
					quotaredistest.MustAdmit(t, r, quota.Request{TenantID: id, Meter: "m", Cost: cost(i), Now: now})
				}
			}
			if err := c.HSet(ctx, r.Key(ids[bad], "pending"), "lots|m|u", "1").Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.SAdd(ctx, r.ActiveKey(), active...).Err(); err != nil {
				t.Fatal(err)
			}
			wantRows := func(i int) []quota.PendingRow {
				return []quota.PendingRow{{Hour: now.Truncate(time.Hour), Meter: "m", Units: cost(i), Requests: 1}}
			}
			index := map[string]int{}
			for i, id := range ids {
				index[id] = i
			}

			first, err := r.Claim(ctx, ids, nil)
			if err != nil {
				t.Fatal(err)
			}
			claimed := map[string]quota.Batch{}
			for _, b := range first {
				i, ok := index[b.TenantID]
				if _, twice := claimed[b.TenantID]; !ok || twice || idle(i) {
					t.Fatalf("claimed %s: a tenant not asked for, claimed twice, or idle", b.TenantID)
				}
				claimed[b.TenantID] = b
				switch {
				case b.ID == "" || b.Resumed:
					t.Errorf("tenant %d: batch %q resumed %t, want a new batch", i, b.ID, b.Resumed)
				case i == bad:
					if b.Err == nil || b.Rows != nil {
						t.Errorf("tenant %d (an unreadable field): rows %v, err %v; want its own Err and no rows", i, b.Rows, b.Err)
					}
				case b.Err != nil || !slices.Equal(b.Rows, wantRows(i)):
					t.Errorf("tenant %d: rows %v, err %v; want %v", i, b.Rows, b.Err, wantRows(i))
				}
			}
			if want := len(ids) - len(ids)/4; len(claimed) != want {
				t.Fatalf("%d batches, want %d (one for each tenant with usage)", len(claimed), want)
			}

			again, err := r.Claim(ctx, ids, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(again) != len(first) {
				t.Fatalf("a second claim: %d batches, want the %d in flight", len(again), len(first))
			}
			for _, b := range again {
				was := claimed[b.TenantID]
				if b.ID != was.ID || !b.Resumed || !slices.Equal(b.Rows, was.Rows) || (b.Err == nil) != (was.Err == nil) {
					t.Errorf("tenant %d claimed again: %+v, want the batch in flight, resumed: %+v", index[b.TenantID], b, was)
				}
			}

			// The even tenants' batches are finished; the odd ones' are
			// named by another id, and stay in flight.
			var finish []quota.Batch
			for _, b := range first {
				if index[b.TenantID]%2 == 1 {
					b.ID = "other-" + b.ID
				}
				finish = append(finish, b)
			}
			if err := r.Finish(ctx, finish); err != nil {
				t.Fatal(err)
			}
			inFlight := func(i int) bool { return !idle(i) && i%2 == 1 }
			for i, id := range ids {
				n, err := c.Exists(ctx, r.Key(id, "flushing")).Result()
				if err != nil || (n == 1) != inFlight(i) {
					t.Errorf("tenant %d: a batch in flight %d, %v; want %t", i, n, err, inFlight(i))
				}
			}

			// Every eighth tenant (finished) counts usage again. A third
			// claim names the odd tenants' batches (still in flight) to
			// drop: it drops them and claims nothing more of them, and
			// claims the eighth tenants' new usage. The tenants it returns
			// nothing for leave the active set (Idle).
			again8 := func(i int) bool { return i%8 == 0 }
			for i, id := range ids {
				if again8(i) {
					quotaredistest.MustAdmit(t, r, quota.Request{TenantID: id, Meter: "m", Cost: 1, Now: now.Add(time.Minute)})
				}
			}
			drop := make([]string, len(ids))
			for _, b := range first {
				if i := index[b.TenantID]; i%2 == 1 {
					drop[i] = b.ID
				}
			}
			third, err := r.Claim(ctx, ids, drop)
			if err != nil {
				t.Fatal(err)
			}
			claimedAgain := map[string]bool{}
			for _, b := range third {
				i := index[b.TenantID]
				if !again8(i) || b.Resumed || b.Err != nil || len(b.Rows) != 1 || b.Rows[0].Units != 1 {
					t.Errorf("tenant %d claimed a third time: %+v; want only the eighth tenants' new usage, in new batches", i, b)
				}
				claimedAgain[b.TenantID] = true
			}
			var quiet, want []string
			for i, id := range ids {
				if again8(i) {
					want = append(want, id)
				}
				if !claimedAgain[id] {
					quiet = append(quiet, id)
				}
				n, err := c.Exists(ctx, r.Key(id, "flushing")).Result()
				if err != nil || (n == 1) != again8(i) {
					t.Errorf("tenant %d after the third claim: a batch in flight %d, %v; want %t", i, n, err, again8(i))
				}
			}
			if len(claimedAgain) != len(want) {
				t.Errorf("the third claim: %d batches, want %d", len(claimedAgain), len(want))
			}
			if err := r.Idle(ctx, quiet); err != nil {
				t.Fatal(err)
			}
			left, err := r.ActiveTenants(ctx)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(left)
			slices.Sort(want)
			if !slices.Equal(left, want) {
				t.Errorf("active after Idle: %d tenants, want the %d with usage again", len(left), len(want))
			}
		})
	}
}
