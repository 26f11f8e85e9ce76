package ratelimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestRandomGroupsAreDecidedAsAlone draws groups of one tenant's
// admissions (any plan of the differential tests, a plan change within a
// group, meters with and without quotas, billed and blocked overage, a
// spend cap, credit, calendars, idempotency keys used again, dry runs,
// times that cross a day or a month) and sends each group as one call of
// admitn, and the same requests one by one to admit under another prefix:
// every answer, and everything each leaves in Redis, must be the same.
func TestRandomGroupsAreDecidedAsAlone(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	rng, _ := propertyRand(t, 0x9a0b5)
	ctx := context.Background()
	cals := []quota.Calendar{{}, {}, mustCalendar(t, "America/New_York", 15), mustCalendar(t, "Australia/Sydney", 28)}
	starts := append([]string{"2031-10-28T12:50:00Z"}, propertyStarts...)
	// (every other group starts seconds before a month's end: the UTC
	// one, and New York's anchored on the 15th)
	ends := []string{"2031-03-31T23:59:50Z", "2031-03-15T03:59:50Z"}
	for g := range 12 {
		alone, alonePrefix := mustRunner(t, c)
		grouped, groupedPrefix := mustRunner(t, c)
		tenant := newTenant()
		now := at(t, starts[rng.IntN(len(starts))]).Truncate(time.Microsecond)
		if g%2 == 0 {
			now = at(t, ends[rng.IntN(len(ends))])
		}
		p := randomPlan(rng, cals)
		var reqs []quota.Request
		for range 3 {
			for range 1 + rng.IntN(10) {
				if rng.IntN(8) == 0 {
					cal := p.cal
					p = randomPlan(rng, cals)
					p.cal = cal
				}
				now = now.Add(time.Duration(rng.Int64N(int64(2 * time.Second))))
				req := p.request([]string{"a", "a", "b", "c"}[rng.IntN(4)], randomCost(rng), now)
				req.TenantID, req.DryRun = tenant, rng.IntN(10) == 0
				if rng.IntN(5) == 0 {
					req.IdempotencyKey = fmt.Sprintf("key-%d", rng.IntN(2))
					req.IdempotencyFingerprint = []string{"fp", "fp", "other"}[rng.IntN(3)]
				}
				reqs = append(reqs, req)
			}
			want := make([]string, len(reqs))
			for i, req := range reqs {
				want[i] = decided(alone.Admit(ctx, req))
			}
			got := admitAsGroup(t, grouped, reqs)
			for i := range reqs {
				if got[i] != want[i] {
					t.Fatalf("group %d, request %d of %d (%s):\n  grouped %s\n  alone   %s", g, i, len(reqs), fmtPlan(reqs[i]), got[i], want[i])
				}
			}
			a, gr := stripSnapshot(mustSnapshot(t, c, alonePrefix), alonePrefix), stripSnapshot(mustSnapshot(t, c, groupedPrefix), groupedPrefix)
			if len(a) != len(gr) {
				t.Fatalf("group %d: keys alone %d, grouped %d", g, len(a), len(gr))
			}
			for k, v := range a {
				if gr[k] != v {
					t.Fatalf("group %d: key %s: grouped state differs from alone", g, k)
				}
			}
			reqs = reqs[:0]
		}
	}
}

// decided is an answer as the tests compare it.
func decided(d quota.Decision, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return fmtDecision(d) + fmt.Sprintf(" meter overage %d idem %d", d.MeterOverageUnits, d.Idem)
}

// admitAsGroup admits reqs through r's batcher, its senders held, and sends
// them as one batch: one call of admitn. It returns each one's answer.
func admitAsGroup(t *testing.T, r *Runner, reqs []quota.Request) []string {
	t.Helper()
	b := r.batch
	b.once.Do(func() {})
	got := make([]string, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = decided(r.Admit(context.Background(), req))
		}()
		deadline := time.Now().Add(10 * time.Second)
		for len(b.queue) < i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("call %d not queued within 10 s", i)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	batch := make([]*call, 0, len(reqs))
	for range reqs {
		batch = append(batch, <-b.queue)
	}
	b.run(batch, nil)
	for _, cl := range batch {
		cl.done <- struct{}{}
	}
	wg.Wait()
	return got
}

// stripSnapshot is a snapshot's keys without prefix and its values
// without their expiry (explicit past times shift expiries by the real
// clock, read once per call).
func stripSnapshot(snap map[string]string, prefix string) map[string]string {
	out := map[string]string{}
	for k, v := range snap {
		out[strings.TrimPrefix(k, prefix)] = v[:strings.IndexByte(v, '@')]
	}
	return out
}
