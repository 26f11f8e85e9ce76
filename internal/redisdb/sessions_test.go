package redisdb_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestSessionsEndTheOldestFirst: an owner signing in many times in quick
// succession (several sign-ins a millisecond) keeps exactly its newest
// MaxPerOwner sessions, in the order they came.
func TestSessionsEndTheOldestFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := redisdb.NewSessions(rdb, testenv.Prefix(t, rdb))
	const n = redisdb.MaxPerOwner + 8
	for i := range n {
		if err := s.Put(ctx, "owner", "k"+strconv.Itoa(n-i), []byte("v"), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		_, found, err := s.Get(ctx, "k"+strconv.Itoa(n-i))
		if err != nil {
			t.Fatal(err)
		}
		if live := i >= n-redisdb.MaxPerOwner; found != live {
			t.Errorf("session %d of %d: found %t, want %t", i+1, n, found, live)
		}
	}
}
