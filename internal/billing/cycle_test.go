package billing

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestCycleHandsTheFlushedTenantsToTheInvoices checks the worker's handoff:
// the Invoices step refreshes the draft of a tenant whose usage the Flush
// step just recorded, though no full sweep is due; LastFlush moves only when
// a flush succeeds; the invoicer finalizes on the reconciler's FlushedThrough.
func TestCycleHandsTheFlushedTenantsToTheInvoices(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	ids := r.tenants(t, 2, "pro")
	var mu sync.Mutex
	clock := time.Now().UTC()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	tick := func(d time.Duration) time.Time { mu.Lock(); defer mu.Unlock(); clock = clock.Add(d); return clock }
	rec := NewReconciler(r.db, r.rl, now, quiet)
	inv := NewInvoicer(r.db, now, 48*time.Hour)
	inv.FullSweepEvery = time.Hour
	c := NewCycle(rec, inv)
	if inv.FlushedThrough == nil {
		t.Fatal("NewCycle left Invoicer.FlushedThrough nil, want the reconciler's")
	}
	if got := c.LastFlush(); !got.IsZero() {
		t.Fatalf("LastFlush before any flush = %v, want zero", got)
	}
	included := func(id string) int64 {
		t.Helper()
		invs, err := NewLedger(r.db).TenantInvoices(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(invs) != 1 {
			t.Fatalf("tenant %s has %d invoices, want one draft", id, len(invs))
		}
		for _, l := range invs[0].Lines {
			if l.Kind == "included" {
				return l.Quantity
			}
		}
		t.Fatalf("no included line: %+v", invs[0].Lines)
		return 0
	}
	if err := c.Invoices(ctx); err != nil { // the first full sweep: empty drafts
		t.Fatal(err)
	}

	want := r.admit(t, ids[:1], 5, 13)[ids[0]]
	rec.hook = func(step string) error {
		if step == "claimed" {
			return errors.New("Postgres went away")
		}
		return nil
	}
	if err := c.Flush(ctx); err == nil {
		t.Fatal("the failing Flush returned no error")
	}
	if got := c.LastFlush(); !got.IsZero() {
		t.Fatalf("LastFlush after a failed flush = %v, want zero", got)
	}
	if got := inv.FlushedThrough(); !got.IsZero() {
		t.Fatalf("FlushedThrough after a failed flush = %v, want zero", got)
	}

	rec.hook = func(string) error { return nil }
	flushed := tick(time.Minute) // the next cycle; the full sweep is not due
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.LastFlush(); !got.Equal(flushed) {
		t.Fatalf("LastFlush after a flush = %v, want %v", got, flushed)
	}
	if got := inv.FlushedThrough(); !got.Equal(flushed) {
		t.Fatalf("the invoicer's FlushedThrough = %v, want %v: the start of the completed sweeping flush", got, flushed)
	}
	if got := included(ids[0]); got != 0 {
		t.Fatalf("draft before the Invoices step: %d units, want 0", got)
	}
	if err := c.Invoices(ctx); err != nil {
		t.Fatal(err)
	}
	if got := included(ids[0]); got != want {
		t.Fatalf("draft after Flush and Invoices: %d units, want the %d admitted", got, want)
	}
	if got := included(ids[1]); got != 0 {
		t.Fatalf("draft of the tenant with no usage: %d units, want 0", got)
	}

	// A later failed flush leaves LastFlush where the successful one put it.
	more := r.admit(t, ids[:1], 5, 14)[ids[0]]
	rec.hook = func(step string) error {
		if step == "committed" {
			return errors.New("crash after the commit")
		}
		return nil
	}
	tick(time.Minute)
	if err := c.Flush(ctx); err == nil {
		t.Fatal("the failing Flush returned no error")
	}
	if got := c.LastFlush(); !got.Equal(flushed) {
		t.Fatalf("LastFlush after a failed flush = %v, want %v (the last successful one)", got, flushed)
	}
	rec.hook = func(string) error { return nil }
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Invoices(ctx); err != nil {
		t.Fatal(err)
	}
	if got := included(ids[0]); got != want+more {
		t.Fatalf("draft after the next cycle: %d units, want %d", got, want+more)
	}
}
