package billing

import (
	"context"
	"testing"
	"time"
)

// TestFlushPrunesBatchIDsPastReplay checks that the flush deletes the ids of
// batches recorded longer ago than any batch can be replayed (the in-flight
// hash lives 30 days), however many there are, and keeps the younger ones:
// a replayed batch must still find its id.
func TestFlushPrunesBatchIDsPastReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "pro")[0]
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	ages := []struct {
		age  time.Duration
		n    int
		kept bool
	}{
		{400 * 24 * time.Hour, 12_000, false}, // more than one delete statement's worth
		{40 * 24 * time.Hour, 3, false},
		{31 * 24 * time.Hour, 3, true}, // past the in-flight hash's TTL, within the margin
		{29 * 24 * time.Hour, 3, true},
		{time.Hour, 3, true},
	}
	for _, a := range ages {
		invExec(t, r.db, `INSERT INTO usage_batches (batch_id, tenant_id, units, requests, flushed_at)
			SELECT 'old-' || $3::text || '-' || g, $1, 1, 1, $2 FROM generate_series(1, $4) g`,
			id, now.Add(-a.age), a.age.String(), a.n)
	}
	r.admitUnits(t, id, 5)
	mustFlush(t, NewReconciler(r.db, r.rl, func() time.Time { return now }, quiet))
	for _, a := range ages {
		var n int
		if err := r.db.QueryRow(ctx, `SELECT count(*) FROM usage_batches WHERE flushed_at = $1`, now.Add(-a.age)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		want := 0
		if a.kept {
			want = a.n
		}
		if n != want {
			t.Errorf("batch ids recorded %v before now: got %d left, want %d", a.age, n, want)
		}
	}
	// The flush's own batch is remembered by its tenant's sequence, not
	// by an id of its own.
	var fresh, heads int
	if err := r.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_batches WHERE batch_id NOT LIKE 'old-%'),
		(SELECT count(*) FROM usage_flushed WHERE tenant_id = $1)`, id).Scan(&fresh, &heads); err != nil {
		t.Fatal(err)
	}
	if fresh != 0 || heads != 1 {
		t.Errorf("recorded by the flush itself: %d batch ids and %d rows of usage_flushed, want none and 1", fresh, heads)
	}
}
