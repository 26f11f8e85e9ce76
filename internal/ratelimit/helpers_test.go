package ratelimit

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/idempotency"
	"github.com/tollgate/tollgate/internal/pending"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis/quotaredistest"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/settlement"
	"github.com/tollgate/tollgate/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	// The loopback Redis Cluster is shared by every test of the binary, so
	// it is stopped here rather than in one test's cleanup.
	testenv.StopCluster()
	os.Exit(code)
}

// The helpers these tests share with the other parts' tests, under the
// short names the tests use (internal/quotaredis/quotaredistest).
var (
	newTenant                = quotaredistest.NewTenant
	mustAdmit                = quotaredistest.MustAdmit
	fmtDecision              = quotaredistest.FmtDecision
	at                       = quotaredistest.At
	i64                      = quotaredistest.I64
	f64                      = quotaredistest.F64
	allLimits                = quotaredistest.AllLimits
	limitOf                  = quotaredistest.LimitOf
	tenantsOnDistinctMasters = quotaredistest.TenantsOnDistinctMasters
	stateOf                  = quotaredistest.StateOf
	redisState               = quotaredistest.RedisState
	pendingFields            = quotaredistest.PendingFields
	pendingAt                = quotaredistest.PendingAt
	meterCounters            = quotaredistest.MeterCounters
	wantMonths               = quotaredistest.WantMonths
)

// Period is a quota period's counters in the tests' terms.
type Period = quotaredistest.Period

// stack is every part of the Redis side on one store, joined as
// quotaredis.Store joins them (which these tests cannot import: it imports
// this package), so that a test admits, settles, refunds and flushes on
// one store.
type stack struct {
	*redisfn.Store
	*Runner
	*pending.Usage
	*settlement.Settler
	*idempotency.Answers
}

// newStack returns the parts on c under prefix.
func newStack(c redis.UniversalClient, prefix string) *stack { return stackOn(redisfn.New(c, prefix)) }

// stackOn returns the parts on s.
func stackOn(s *redisfn.Store) *stack {
	return &stack{Store: s, Runner: New(s), Usage: pending.New(s), Settler: settlement.New(s), Answers: idempotency.New(s)}
}

// mustRunner returns the parts on c under a key prefix of the test's own,
// whose keys are deleted at cleanup, and the prefix.
func mustRunner(tb testing.TB, c redis.UniversalClient) (*stack, string) {
	tb.Helper()
	prefix := testenv.Prefix(tb, c)
	return newStack(c, prefix), prefix
}

// mustKeys returns every key under prefix (on every master of a cluster).
func mustKeys(tb testing.TB, c redis.UniversalClient, prefix string) []string {
	tb.Helper()
	ctx := context.Background()
	var (
		mu   sync.Mutex
		keys []string
	)
	scan := func(ctx context.Context, n *redis.Client) error {
		iter := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock() // ForEachMaster calls scan concurrently
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	switch cc := c.(type) {
	case *redis.ClusterClient:
		err = cc.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, cc)
	default:
		tb.Fatalf("unknown client %T", c)
	}
	if err != nil {
		tb.Fatalf("scan %s*: %v", prefix, err)
	}
	return keys
}

// mustSnapshot returns, for every key under prefix, its DUMP and absolute
// expiry (PEXPIRETIME), so that two snapshots are equal only when nothing
// about the keys changed.
func mustSnapshot(tb testing.TB, c redis.UniversalClient, prefix string) map[string]string {
	tb.Helper()
	ctx := context.Background()
	snap := map[string]string{}
	for _, k := range mustKeys(tb, c, prefix) {
		dump, err := c.Dump(ctx, k).Result()
		if err != nil {
			tb.Fatalf("DUMP %s: %v", k, err)
		}
		at, err := c.PExpireTime(ctx, k).Result()
		if err != nil {
			tb.Fatalf("PEXPIRETIME %s: %v", k, err)
		}
		snap[k] = fmt.Sprintf("%x@%d", dump, at)
	}
	return snap
}

// untilRefused races workers clients of their own on one Redis (as many
// API nodes would), started at once, each admitting req(w) until its first
// refusal: it returns each worker's admissions and the refusals, one per
// worker that did not fail.
func untilRefused(t *testing.T, workers int, newClient func(testing.TB) redis.UniversalClient, prefix string,
	req func(w int) quota.Request) (admitted [][]quota.Decision, refused []quota.Decision) {
	t.Helper()
	admitted = make([][]quota.Decision, workers)
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for w := range workers {
		r := newStack(newClient(t), prefix)
		wg.Go(func() {
			<-start
			for {
				d, err := r.Admit(context.Background(), req(w))
				if err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
				if !d.Allowed {
					mu.Lock()
					refused = append(refused, d)
					mu.Unlock()
					return
				}
				admitted[w] = append(admitted[w], d)
			}
		})
	}
	close(start)
	wg.Wait()
	return admitted, refused
}

// count is the number of decisions in ds.
func count(ds [][]quota.Decision) int64 {
	n := 0
	for _, d := range ds {
		n += len(d)
	}
	return int64(n)
}
