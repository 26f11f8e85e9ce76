package redisfn

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
)

// fcalls counts the FCALLs a client sent, by function (claim, each, ...),
// and those that failed, as the client saw them: a hook of its own, exact
// whatever else the Redis serves.
type fcalls struct {
	mu           sync.Mutex
	sent, failed map[string]int
}

func countFcalls(c redis.UniversalClient) *fcalls {
	h := &fcalls{sent: map[string]int{}, failed: map[string]int{}}
	c.AddHook(h)
	return h
}

func (h *fcalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *fcalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.note(cmd)
		return err
	}
}

func (h *fcalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.note(cmd)
		}
		return err
	}
}

func (h *fcalls) note(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 || args[0] != "fcall" {
		return
	}
	_, fn, _ := strings.Cut(fmt.Sprint(args[1]), "_") // tg<v>_<name>
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sent[fn]++
	if cmd.Err() != nil {
		h.failed[fn]++
	}
}

// take returns the counts so far, and starts again from none.
func (h *fcalls) take() (sent, failed map[string]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sent, failed = h.sent, h.failed
	h.sent, h.failed = map[string]int{}, map[string]int{}
	return sent, failed
}

// slotTenants returns n tenant ids whose keys are in the eight slots s
// with s%2048 == 5 (spread over the masters of a cluster), about n/8 a
// slot.
func slotTenants(n int) []string {
	base := "tn-" + testenv.RandomHex(4) + "-"
	var ids []string
	for j := 0; len(ids) < n; j++ {
		id := base + strconv.Itoa(j)
		if KeySlot("t:"+id)%2048 == 5 {
			ids = append(ids, id)
		}
	}
	return ids
}

// claimKeys are claim's KEYS for a tenant (lua/claim.lua).
func claimKeys(r *Store, id string) []string {
	return []string{r.Key(id, "pending"), r.Key(id, "flushing"), r.StateKey(id)}
}

// hashOf reads a flat HGETALL.
func hashOf(cmd *redis.Cmd) (map[string]string, error) {
	flat, err := cmd.StringSlice()
	if err != nil {
		return nil, err
	}
	h := map[string]string{}
	for j := 0; j+1 < len(flat); j += 2 {
		h[flat[j]] = flat[j+1]
	}
	return h, nil
}

// TestPipelinedEachAnswersEachItem claims, claims again, finishes and
// checks 2,500 tenants through PipelinedEach, on a single Redis and on a
// Redis Cluster (1,000 of them in eight slots, the others anywhere), so
// that the items go in many calls of each and more than one pipeline:
// every item is answered for its own keys and arguments, the tenants go
// many to a call of each (in a cluster only those of one slot, a tenant
// alone in its slot in a call of its own), and no call fails (none was
// sent again alone).
func TestPipelinedEachAnswersEachItem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client func(testing.TB) redis.UniversalClient
	}{{"redis", testenv.Redis}, {"cluster", testenv.Cluster}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := tc.client(t)
			r := New(c, testenv.Prefix(t, c))
			if err := r.LoadFunctions(ctx, nil); err != nil {
				t.Fatal(err)
			}
			ids := slotTenants(1000)
			for range 1500 {
				ids = append(ids, "tn-"+testenv.RandomHex(6))
			}
			n := len(ids)
			if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, id := range ids {
					p.HSet(ctx, r.Key(id, "pending"), "3600|m|u", i)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}

			// What each step sends: the same groups (the same tenants).
			keys, args := make([][]string, n), make([][]any, n)
			for i, id := range ids {
				keys[i], args[i] = claimKeys(r, id), []any{"b", 1}
			}
			grouped, alone, inGroups := 0, 0, 0
			for _, g := range r.eachGroups(keys, args, EachGroup) {
				if len(g) > EachGroup {
					t.Errorf("a group of %d items, more than %d", len(g), EachGroup)
				}
				if len(g) == 1 {
					alone++
					continue
				}
				grouped++
				inGroups += len(g)
				if _, ok := c.(*redis.ClusterClient); !ok {
					continue
				}
				for _, i := range g {
					if s, s0 := keySlot(keys[i][0]), keySlot(keys[g[0]][0]); s != s0 {
						t.Fatalf("tenants of slots %d and %d share a call", s, s0)
					}
				}
			}
			if _, single := c.(*redis.Client); single && (grouped != n/EachGroup || alone != 0) {
				t.Fatalf("on a single Redis: %d calls of each and %d alone, want %d and none", grouped, alone, n/EachGroup)
			}
			if inGroups < 1000 || grouped < 16 {
				t.Fatalf("%d calls of each carry %d tenants, want 16 or more carrying at least the 1,000 of eight slots", grouped, inGroups)
			}

			calls := countFcalls(c)
			for _, batch := range []string{"b-", "c-"} { // the second claim finds the first's batches in flight
				cmds, err := r.PipelinedEach(ctx, FnClaim, n, func(i int) ([]string, []any) {
					return claimKeys(r, ids[i]), []any{batch + strconv.Itoa(i), 60000}
				})
				if err != nil {
					t.Fatal(err)
				}
				for i, cmd := range cmds {
					h, err := hashOf(cmd)
					if seq, _ := strconv.ParseInt(h["seq"], 10, 64); err != nil || len(h) != 3 || seq <= 0 ||
						h["batch"] != "b-"+strconv.Itoa(i) || h["3600|m|u"] != strconv.Itoa(i) {
						t.Fatalf("claim %s of tenant %d: %v, %v; want batch b-%d with a sequence, holding 3600|m|u %d", batch, i, h, err, i, i)
					}
				}
			}
			// The even tenants' batches finished, the odd ones' finish
			// names another batch: theirs stay in flight.
			cmds, err := r.PipelinedEach(ctx, FnFinish, n, func(i int) ([]string, []any) {
				batch := "b-" + strconv.Itoa(i)
				if i%2 == 1 {
					batch = "x-" + strconv.Itoa(i)
				}
				return []string{r.Key(ids[i], "flushing")}, []any{batch}
			})
			if err != nil {
				t.Fatal(err)
			}
			for i, cmd := range cmds {
				if got, err := cmd.Int(); err != nil || got != 1-i%2 {
					t.Fatalf("finish of tenant %d: %d, %v; want %d", i, got, err, 1-i%2)
				}
			}
			cmds, err = r.PipelinedEach(ctx, FnPending, n, func(i int) ([]string, []any) {
				return []string{r.Key(ids[i], "pending"), r.StateKey(ids[i]), r.Key(ids[i], "flushing")}, []any{"any"}
			})
			if err != nil {
				t.Fatal(err)
			}
			for i, cmd := range cmds {
				if got, err := cmd.Int(); err != nil || got != i%2 {
					t.Fatalf("pending any of tenant %d: %d, %v; want %d", i, got, err, i%2)
				}
			}

			sent, failed := calls.take()
			want := map[string]int{"each": 4 * grouped}
			if alone > 0 {
				want["claim"], want["finish"], want["pending"] = 2*alone, alone, alone
			}
			if !maps.Equal(sent, want) || len(failed) > 0 {
				t.Errorf("FCALLs sent %v, failed %v; want %v, none failed", sent, failed, want)
			}
		})
	}
}

// TestPipelinedEachItemErrorIsItsOwn: an item whose function raises an
// error (a tenant's flushing key of another type) is answered its own
// error, by a call of its own, as it would be without each; the other
// items of its call keep their answers.
func TestPipelinedEachItemErrorIsItsOwn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r := New(c, testenv.Prefix(t, c))
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = "tn-" + testenv.RandomHex(6)
		if err := c.HSet(ctx, r.Key(ids[i], "pending"), "3600|m|u", i).Err(); err != nil {
			t.Fatal(err)
		}
	}
	const bad = 3
	if err := c.Set(ctx, r.Key(ids[bad], "flushing"), "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	calls := countFcalls(c)
	cmds, err := r.PipelinedEach(ctx, FnClaim, len(ids), func(i int) ([]string, []any) {
		return claimKeys(r, ids[i]), []any{"b-" + strconv.Itoa(i), 60000}
	})
	if !redis.HasErrorPrefix(err, "WRONGTYPE") {
		t.Errorf("PipelinedEach: %v, want the bad item's own WRONGTYPE", err)
	}
	for i, cmd := range cmds {
		h, err := hashOf(cmd)
		if i == bad {
			if !redis.HasErrorPrefix(err, "WRONGTYPE") {
				t.Errorf("the bad item: %v, %v; want WRONGTYPE, as claim answers it alone", h, err)
			}
			continue
		}
		if err != nil || h["batch"] != "b-"+strconv.Itoa(i) || h["3600|m|u"] != strconv.Itoa(i) {
			t.Errorf("item %d: %v, %v; want batch b-%d holding 3600|m|u %d", i, h, err, i, i)
		}
	}
	sent, failed := calls.take()
	if want := map[string]int{"each": 1, "claim": 1}; !maps.Equal(sent, want) || !maps.Equal(failed, map[string]int{"claim": 1}) {
		t.Errorf("FCALLs sent %v, failed %v; want %v, the claim alone failed", sent, failed, want)
	}
}

// TestPipelinedEachSendsItemsAloneWhenACallFails: a call of each that
// fails as a whole (here: a Redis past its maxmemory refuses each, which
// may write, and still runs pending, which only reads) is followed by a
// call of its own for each of its items: every item gets its answer, and
// an item's error stays its own.
func TestPipelinedEachSendsItemsAloneWhenACallFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := testenv.StartRedis(t)
	opts, err := redis.ParseURL(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	r := New(c, "tg")
	if err := r.LoadFunctions(ctx, nil); err != nil {
		t.Fatal(err)
	}
	const n, bad = 250, 7
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "tn-" + strconv.Itoa(i)
		if i%2 == 0 {
			if err := c.HSet(ctx, r.Key(ids[i], "pending"), "3600|m|u", i).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Nothing pending nor in flight: pending reads the state hash, which
	// is not one.
	if err := c.Set(ctx, r.StateKey(ids[bad]), "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	pendingKeys := func(id string) []string { return []string{r.Key(id, "pending"), r.StateKey(id), r.Key(id, "flushing")} }
	if err := r.Call(ctx, FnEach, pendingKeys(ids[0]), "pending", 3, 1, 1, "any").Err(); !redis.HasErrorPrefix(err, "OOM") {
		t.Fatalf("each past maxmemory: %v, want OOM", err)
	}

	calls := countFcalls(c)
	cmds, err := r.PipelinedEach(ctx, FnPending, n, func(i int) ([]string, []any) {
		return pendingKeys(ids[i]), []any{"any"}
	})
	if !redis.HasErrorPrefix(err, "WRONGTYPE") {
		t.Errorf("PipelinedEach: %v, want the bad item's own WRONGTYPE", err)
	}
	for i, cmd := range cmds {
		got, err := cmd.Int()
		switch {
		case i == bad:
			if !redis.HasErrorPrefix(err, "WRONGTYPE") {
				t.Errorf("the bad item: %d, %v; want WRONGTYPE", got, err)
			}
		case err != nil || got != 1-i%2:
			t.Errorf("item %d: %d, %v; want %d", i, got, err, 1-i%2)
		}
	}
	sent, failed := calls.take()
	if want := map[string]int{"each": 3, "pending": n}; !maps.Equal(sent, want) || !maps.Equal(failed, map[string]int{"each": 3, "pending": 1}) {
		t.Errorf("FCALLs sent %v, failed %v; want %v, the three calls of each and the bad item's failed", sent, failed, want)
	}
}

// TestPipelinedEachSendsItemsAloneAfterTryAgain: a call of each answered
// TRYAGAIN (its slot migrating, some of its keys moved) is not sent again
// as it is, as a call of one tenant would be: its items are, one call
// each.
func TestPipelinedEachSendsItemsAloneAfterTryAgain(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		got = map[string]int{}
	)
	c := fakeRedis(t, func(args []string) string {
		if len(args) < 2 || !strings.EqualFold(args[0], "fcall") {
			return "-ERR unknown command\r\n" // (the client's hello)
		}
		_, fn, _ := strings.Cut(args[1], "_")
		mu.Lock()
		got[fn]++
		mu.Unlock()
		if fn == "each" {
			return "-TRYAGAIN Multiple keys request during rehashing of slot\r\n"
		}
		return ":1\r\n"
	})
	r := New(c, "tg")
	cmds, err := r.PipelinedEach(context.Background(), FnPending, 5, func(i int) ([]string, []any) {
		id := strconv.Itoa(i)
		return []string{r.Key(id, "pending"), r.StateKey(id), r.Key(id, "flushing")}, []any{"any"}
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, cmd := range cmds {
		if n, err := cmd.Int(); err != nil || n != 1 {
			t.Errorf("item %d: %d, %v; want 1", i, n, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := map[string]int{"each": 1, "pending": 5}; !maps.Equal(got, want) {
		t.Errorf("the server got %v, want %v", got, want)
	}
}

// TestPipelinedEachGivesATimeoutToEachItem: a call of each that gets no
// answer in time (it may have run) gives its error to each of its items,
// as calls of their own in the same pipeline would have had it, and is
// not followed by calls of their own, which would only wait longer.
func TestPipelinedEachGivesATimeoutToEachItem(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		got = map[string]int{}
	)
	fake := fakeRedis(t, func(args []string) string {
		if len(args) < 2 || !strings.EqualFold(args[0], "fcall") {
			return "-ERR unknown command\r\n" // (the client's hello)
		}
		_, fn, _ := strings.Cut(args[1], "_")
		mu.Lock()
		got[fn]++
		mu.Unlock()
		time.Sleep(time.Second) // past the client's read timeout
		return ":1\r\n"
	})
	c := redis.NewClient(&redis.Options{Addr: fake.Options().Addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1,
		ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	r := New(c, "tg")
	cmds, err := r.PipelinedEach(context.Background(), FnPending, 5, func(i int) ([]string, []any) {
		id := strconv.Itoa(i)
		return []string{r.Key(id, "pending"), r.StateKey(id), r.Key(id, "flushing")}, []any{"any"}
	})
	if err == nil || !MayHaveRun(err) {
		t.Errorf("PipelinedEach: %v, want the call's timeout", err)
	}
	for i, cmd := range cmds {
		if err := cmd.Err(); err == nil || !MayHaveRun(err) {
			t.Errorf("item %d: %v, want the call's timeout", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := map[string]int{"each": 1}; !maps.Equal(got, want) {
		t.Errorf("the server got %v, want %v", got, want)
	}
}

// TestEachRunsOnlyTheWorkersFunctions: each refuses to run a function
// other than claim, finish and pending, and keys and arguments that do not
// make its items; it runs nothing then.
func TestEachRunsOnlyTheWorkersFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r := New(c, testenv.Prefix(t, c))
	flushing := r.Key("tn-"+testenv.RandomHex(6), "flushing")
	if err := c.HSet(ctx, flushing, "batch", "b").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []any
		want string
	}{
		{[]any{"admit", 1, 1, 1, "b"}, "ERR each runs claim, finish or pending, not admit"},
		{[]any{"each", 1, 1, 1, "b"}, "ERR each runs claim, finish or pending, not each"},
		{[]any{"finish", 1, 1, 2, "b", "b"}, "ERR each: 1 keys and 6 arguments do not make n items of k keys and a arguments"},
		{[]any{"finish", 1, 1, 1}, "ERR each: 1 keys and 4 arguments do not make n items of k keys and a arguments"},
		{[]any{"finish", "one", 1, 1, "b"}, "ERR each: 1 keys and 5 arguments do not make n items of k keys and a arguments"},
	} {
		err := r.Call(ctx, FnEach, []string{flushing}, tc.args...).Err()
		var re redis.Error
		if !errors.As(err, &re) || err.Error() != tc.want {
			t.Errorf("each %v: %v, want %q", tc.args, err, tc.want)
		}
	}
	if n, err := c.Exists(ctx, flushing).Result(); err != nil || n != 1 {
		t.Errorf("the flushing hash: exists %d, %v; want it still there", n, err)
	}
	// The same call well formed finishes the batch.
	if got, err := r.Call(ctx, FnEach, []string{flushing}, "finish", 1, 1, 1, "b").Slice(); err != nil || len(got) != 1 || got[0] != int64(1) {
		t.Errorf("each finish: %v, %v; want [1]", got, err)
	}
}

// BenchmarkPipelinedEach claims, finishes and checks 2,000 tenants (a
// chunk of the worker's flush), each with three pending fields, on a
// single Redis, in calls of 1 item (a call each, as without each), 50, 100
// and 200.
func BenchmarkPipelinedEach(b *testing.B) {
	ctx := context.Background()
	c := testenv.Redis(b)
	r := New(c, testenv.Prefix(b, c))
	if err := r.LoadFunctions(ctx, nil); err != nil {
		b.Fatal(err)
	}
	ids := make([]string, 2000)
	for i := range ids {
		ids[i] = "tn-" + testenv.RandomHex(6)
	}
	n := len(ids)
	for _, size := range []int{1, 50, 100, 200} {
		b.Run(fmt.Sprintf("group=%d", size), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for i, id := range ids {
						p.HSet(ctx, r.Key(id, "pending"), "3600|m|u", i, "3600|m|r", 1, "7200|n|u", 2)
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				_, err := r.pipelinedEach(ctx, FnClaim, n, func(i int) ([]string, []any) {
					return claimKeys(r, ids[i]), []any{"b-" + strconv.Itoa(i), 60000}
				}, size)
				if err == nil {
					_, err = r.pipelinedEach(ctx, FnFinish, n, func(i int) ([]string, []any) {
						return []string{r.Key(ids[i], "flushing")}, []any{"b-" + strconv.Itoa(i)}
					}, size)
				}
				if err == nil {
					_, err = r.pipelinedEach(ctx, FnPending, n, func(i int) ([]string, []any) {
						return []string{r.Key(ids[i], "pending"), r.StateKey(ids[i]), r.Key(ids[i], "flushing")}, []any{"any"}
					}, size)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
