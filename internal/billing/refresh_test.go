package billing

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestInvoicesFollowTheActiveTenants checks that between full sweeps only the
// drafts of the tenants the worker just flushed are refreshed.
func TestInvoicesFollowTheActiveTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	ids := r.tenants(t, 2, "pro")
	var mu sync.Mutex
	clock := time.Now().UTC()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	inv := NewInvoicer(r.db, now, 48*time.Hour)
	inv.FullSweepEvery = time.Hour
	hour := clock.Truncate(time.Hour)
	addUsage := func(id string, units int) {
		if _, err := r.db.Exec(ctx, `INSERT INTO usage (tenant_id, hour, meter, units, requests) VALUES ($1, $2, 'demo', $3, 1)
			ON CONFLICT (tenant_id, hour, meter) DO UPDATE SET units = usage.units + EXCLUDED.units`, id, hour, units); err != nil {
			t.Fatal(err)
		}
	}
	included := func(id string) int64 {
		invs, err := NewLedger(r.db).TenantInvoices(ctx, id)
		if err != nil || len(invs) != 1 {
			t.Fatalf("invoices of %s: %v, %v; want one draft", id, invs, err)
		}
		for _, l := range invs[0].Lines {
			if l.Kind == "included" {
				return l.Quantity
			}
		}
		t.Fatalf("no included line: %+v", invs[0].Lines)
		return 0
	}
	addUsage(ids[0], 10)
	addUsage(ids[1], 20)
	if err := inv.Run(ctx); err != nil { // the first sweep
		t.Fatal(err)
	}
	if included(ids[0]) != 10 || included(ids[1]) != 20 {
		t.Fatalf("after the first sweep: %d and %d units, want 10 and 20", included(ids[0]), included(ids[1]))
	}
	addUsage(ids[0], 5)
	addUsage(ids[1], 5)
	if err := inv.Run(ctx); err != nil { // no sweep due
		t.Fatal(err)
	}
	if err := inv.Refresh(ctx, []string{ids[0], "not-a-tenant"}); err != nil {
		t.Fatal(err)
	}
	if included(ids[0]) != 15 || included(ids[1]) != 20 {
		t.Fatalf("after Refresh of the first tenant: %d and %d units, want 15 and 20 (the second waits for the sweep)", included(ids[0]), included(ids[1]))
	}
	mu.Lock()
	clock = clock.Add(time.Hour)
	mu.Unlock()
	if err := inv.Run(ctx); err != nil { // the sweep is due
		t.Fatal(err)
	}
	if included(ids[1]) != 25 {
		t.Fatalf("after the next sweep: %d units, want 25", included(ids[1]))
	}
}

func TestReconcilerReportsTheTenantsItFlushed(t *testing.T) {
	t.Parallel()
	r := mustRig(t, nil)
	ids := r.tenants(t, 3, "pro")
	admitted := r.admit(t, ids[:2], 20, 9)
	rc := r.reconciler()
	if err := rc.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := rc.TakeFlushed()
	if len(got) != len(admitted) {
		t.Fatalf("TakeFlushed = %v, want the %d tenants with usage", got, len(admitted))
	}
	for _, id := range got {
		if _, ok := admitted[id]; !ok {
			t.Fatalf("TakeFlushed returned %s, which had no usage", id)
		}
	}
	if again := rc.TakeFlushed(); len(again) != 0 {
		t.Fatalf("a second TakeFlushed = %v, want none", again)
	}
}
