package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/testenv"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func sharesPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// syncAll runs one Sync of each member, in order: one cycle of each worker.
func syncAll(t *testing.T, members []*Shares) {
	t.Helper()
	for _, m := range members {
		if err := m.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// checkSplit fails unless every shard is held by exactly one member, each
// holding at most its share, and exactly one member leads.
func checkSplit(t *testing.T, members []*Shares) {
	t.Helper()
	owner := map[int]int{}
	leaders := 0
	share := (Shards + len(members) - 1) / len(members)
	for i, m := range members {
		if m.Alive() != len(members) {
			t.Errorf("member %d counts %d alive, want %d", i, m.Alive(), len(members))
		}
		if n := len(m.Owned()); n > share {
			t.Errorf("member %d holds %d shards, above its share of %d", i, n, share)
		}
		for _, s := range m.Owned() {
			if j, ok := owner[s]; ok {
				t.Errorf("shard %d held by members %d and %d", s, j, i)
			}
			owner[s] = i
		}
		if m.Leads() {
			leaders++
		}
	}
	for s := range Shards {
		if _, ok := owner[s]; !ok {
			t.Errorf("shard %d held by no member", s)
		}
	}
	if leaders != 1 {
		t.Errorf("%d leaders, want 1", leaders)
	}
}

func newMembers(t *testing.T, pool *pgxpool.Pool, n int) []*Shares {
	var out []*Shares
	for range n {
		m := NewShares(pool, quietLog)
		t.Cleanup(m.Close)
		out = append(out, m)
	}
	return out
}

// TestSharesSplitWithNoOverlapOrGap: two, then three workers joining one
// after the other split the 64 shards with no overlap and no gap within two
// cycles of each (one to give back, one to take), one of them leading.
func TestSharesSplitWithNoOverlapOrGap(t *testing.T) {
	t.Parallel()
	pool := sharesPool(t)
	members := newMembers(t, pool, 3)

	syncAll(t, members[:1])
	if n := len(members[0].Owned()); n != Shards || !members[0].Leads() {
		t.Fatalf("a lone worker holds %d shards (leads %v), want all %d and the lead", n, members[0].Leads(), Shards)
	}
	syncAll(t, members[:2])
	syncAll(t, members[:2])
	checkSplit(t, members[:2])
	syncAll(t, members)
	syncAll(t, members)
	checkSplit(t, members)

	// Stable: further cycles move nothing.
	before := [][]int{members[0].Owned(), members[1].Owned(), members[2].Owned()}
	syncAll(t, members)
	for i, m := range members {
		if got := m.Owned(); len(got) != len(before[i]) {
			t.Errorf("member %d went from %d to %d shards with no worker joining or leaving", i, len(before[i]), len(got))
		}
	}
	// Tenants follow their shards: each belongs to exactly one worker.
	for i := range 1000 {
		id := testenv.RandomHex(16)
		n := 0
		for _, m := range members {
			if m.Owns(id) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("tenant %d (%s) owned by %d workers, want 1", i, id, n)
		}
	}
}

// TestSharesHandOverWithinOneCycle: a worker that stops (Close) or whose
// session dies (terminated by Postgres, as when its process is killed)
// hands its shards, and the lead if it had it, to the others on their next
// cycle; a worker whose session died takes a share again on its next Sync.
func TestSharesHandOverWithinOneCycle(t *testing.T) {
	t.Parallel()
	pool := sharesPool(t)
	members := newMembers(t, pool, 3)
	syncAll(t, members)
	syncAll(t, members)
	checkSplit(t, members)

	// The leader's session is terminated under it.
	lead := -1
	for i, m := range members {
		if m.Leads() {
			lead = i
		}
	}
	if _, err := pool.Exec(context.Background(), `
		SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1::int8::oid AND objid = 0 AND objsubid = 2 AND granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		int64(nsLeader)); err != nil {
		t.Fatal(err)
	}
	var rest []*Shares
	for i, m := range members {
		if i != lead {
			rest = append(rest, m)
		}
	}
	if err := waitUnlocked(pool); err != nil {
		t.Fatal(err)
	}
	syncAll(t, rest)
	checkSplit(t, rest)

	// The dead session's worker notices on its next Sync (an error, holding
	// nothing), then joins again.
	if err := members[lead].Sync(context.Background()); err == nil {
		t.Fatal("Sync on a terminated session succeeded")
	}
	if n := len(members[lead].Owned()); n != 0 || members[lead].Leads() {
		t.Fatalf("after its session died, a worker holds %d shards (leads %v), want none", n, members[lead].Leads())
	}
	syncAll(t, members)
	syncAll(t, members)
	checkSplit(t, members)

	// One stops cleanly: the two left hold everything after one cycle
	// (once its backend has ended: closing the connection only asks it to).
	members[0].Close()
	if err := waitMembers(pool, 2); err != nil {
		t.Fatal(err)
	}
	syncAll(t, members[1:])
	checkSplit(t, members[1:])
}

// waitMembers waits (a bounded number of polls) until n membership locks
// are held in the pool's database.
func waitMembers(pool *pgxpool.Pool, n int) error {
	for range 500 {
		var got int
		if err := pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int8::oid AND granted
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
			int64(nsMember)).Scan(&got); err != nil {
			return err
		}
		if got == n {
			return nil
		}
		_, _ = pool.Exec(context.Background(), `SELECT pg_sleep(0.01)`)
	}
	return fmt.Errorf("%d membership locks still not held after 500 polls", n)
}

// waitUnlocked waits (a bounded number of polls) until no terminated
// backend still holds the leader lock of the pool's database:
// pg_terminate_backend only signals.
func waitUnlocked(pool *pgxpool.Pool) error {
	for range 500 {
		var n int
		if err := pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int8::oid AND granted
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
			int64(nsLeader)).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		_, _ = pool.Exec(context.Background(), `SELECT pg_sleep(0.01)`)
	}
	return errors.New("the terminated leader's lock is still held after 500 polls")
}

// TestSyncOutlivesTheStepsDeadline: a Sync whose step's deadline has
// passed (a loaded host, a Postgres slow to accept connections) still ends
// holding its shards and the leader lock, rather than dropping its session
// every cycle and never holding any; a Sync of a worker that stops
// (its context canceled) holds nothing.
func TestSyncOutlivesTheStepsDeadline(t *testing.T) {
	t.Parallel()
	pool := sharesPool(t)
	late := NewShares(pool, quietLog)
	t.Cleanup(late.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	if err := late.Sync(ctx); err != nil {
		t.Fatalf("Sync after the step's deadline: %v", err)
	}
	if len(late.Owned()) != Shards || !late.Leads() {
		t.Fatalf("after a Sync past the step's deadline: %d shards, leader %t; want all %d and the lead",
			len(late.Owned()), late.Leads(), Shards)
	}

	stopping := NewShares(pool, quietLog)
	t.Cleanup(stopping.Close)
	ctx, stop := context.WithCancel(context.Background())
	stop()
	if err := stopping.Sync(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sync of a worker that stops = %v, want context.Canceled", err)
	}
	if len(stopping.Owned()) != 0 || stopping.Leads() {
		t.Fatalf("a worker that stops holds %d shards, leader %t", len(stopping.Owned()), stopping.Leads())
	}
}
