package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/redisfn"
)

// Coalescing. Every admission is one function call (FCALL of the
// library's admit: internal/redisfn), but the calls of
// concurrent requests need not each pay a round trip of their own: a few
// sender goroutines take whatever admissions are waiting and send them to
// Redis as one pipeline (go-redis splits a pipeline by node in a Redis
// Cluster and sends the parts concurrently), so N waiting admissions cost
// one write and one read instead of N of each, on the API node and in
// Redis. There is no timer: an admission that finds a sender idle leaves at
// once, so latency does not grow at low load; while a batch is in flight,
// the next one fills. Each call stays its own atomic decision.

const (
	// senders is how many batches may be in flight at once.
	senders = 4
	// maxBatch bounds one pipeline.
	maxBatch = 128
	// batchTimeout bounds a batch's round trip (each caller still stops
	// waiting at its own deadline); go-redis's read and write timeouts bound
	// each attempt within it.
	batchTimeout = 10 * time.Second
)

// call is one admit call waiting for a sender.
type call struct {
	keys []string
	args []any
	res  []int64
	err  error
	done chan struct{}
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

type batcher struct {
	s     *redisfn.Store
	queue chan *call
	once  sync.Once
	// shared counts the calls sent in a batch of more than one, grouped
	// those sent in a group of one tenant's calls (tests see that batches
	// and groups form).
	shared, grouped atomic.Int64
}

func newBatcher(s *redisfn.Store) *batcher {
	return &batcher{s: s, queue: make(chan *call, senders*maxBatch)}
}

func (b *batcher) start() {
	for range senders {
		go b.send()
	}
}

// do calls admit with keys and args in the next batch and waits for
// its answer, or for ctx to end. With finish, a call once queued is waited
// for whatever ctx says (batchTimeout bounds it): a call that may take
// what only its caller gives back (a concurrency lease) is never left to
// run unseen.
func (b *batcher) do(ctx context.Context, keys []string, args []any, finish bool) ([]int64, error) {
	b.once.Do(b.start)
	c := callPool.Get().(*call)
	c.keys, c.args, c.res, c.err = keys, args, nil, nil
	select {
	case b.queue <- c:
	case <-ctx.Done():
		callPool.Put(c)
		return nil, ctx.Err()
	}
	gone := ctx.Done()
	if finish {
		gone = nil // (a nil channel is never ready)
	}
	select {
	case <-c.done:
		res, err := c.res, c.err
		c.keys, c.args, c.res = nil, nil, nil
		callPool.Put(c)
		return res, err
	case <-gone:
		// The sender still owns c and will answer it; it is not reused.
		return nil, ctx.Err()
	}
}

// send takes a batch (waiting only for its first call), sends it, answers
// every call of it, and starts over.
func (b *batcher) send() {
	batch := make([]*call, 0, maxBatch)
	cmds := make([]*redis.Cmd, 0, maxBatch)
	for first := range b.queue {
		batch = append(batch[:0], first)
	fill:
		for len(batch) < maxBatch {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		cmds = b.run(batch, cmds[:0])
		for _, c := range batch {
			c.done <- struct{}{}
		}
	}
}

// run sends the batch as one pipeline. The calls of one tenant (the same
// state key) go as groups of up to maxGroup, each one call of admitn
// (lua/group.lua), which decides them in arrival order exactly as admit
// decides each alone; a tenant's lone call is one call of admit. (One
// call for the whole batch, of every tenant, was measured too: it saved
// ~10% of Redis's time per admission and doubled the p99 at half load,
// since a batch's admissions then wait for each other inside Redis.)
// Calls that Redis answers without running them (a function not found, a
// slot moving) are sent again, and no call is sent twice by go-redis
// (redisfn.Store.Send).
func (b *batcher) run(batch []*call, cmds []*redis.Cmd) []*redis.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	if len(batch) == 1 {
		c := batch[0]
		c.res, c.err = b.s.Call(ctx, redisfn.FnAdmit, c.keys, c.args...).Int64Slice()
		return cmds
	}
	b.shared.Add(int64(len(batch)))
	groups := groupByTenant(batch)
	for _, g := range groups {
		if len(g) == 1 {
			cmds = append(cmds, b.s.Command(ctx, redisfn.FnAdmit, g[0].keys, g[0].args))
			continue
		}
		b.grouped.Add(int64(len(g)))
		keys, args := frame(g)
		cmds = append(cmds, b.s.Command(ctx, redisfn.FnAdmitN, keys, args))
	}
	b.s.Send(ctx, cmds)
	for i, g := range groups {
		if len(g) == 1 {
			g[0].res, g[0].err = cmds[i].Int64Slice()
			continue
		}
		answerGroup(g, cmds[i])
	}
	return cmds
}

// maxGroup bounds a group: its calls wait for each other inside Redis.
const maxGroup = 32

// groupByTenant splits batch into groups of calls of one tenant (by their
// state key, the first), each in arrival order and of at most maxGroup,
// in the order of their first calls.
func groupByTenant(batch []*call) [][]*call {
	groups := make([][]*call, 0, len(batch))
	open := make(map[string]int, len(batch)) // a tenant's group taking calls
	for _, c := range batch {
		i, ok := open[c.keys[0]]
		if !ok || len(groups[i]) == maxGroup {
			i = len(groups)
			open[c.keys[0]] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], c)
	}
	return groups
}

// frame joins the keys and arguments of a group's calls as admitn takes
// them: every key in turn; the count of calls, each one's counts of keys
// and arguments, then every argument in turn.
func frame(g []*call) ([]string, []any) {
	nk, na := 0, 1+2*len(g)
	for _, c := range g {
		nk += len(c.keys)
		na += len(c.args)
	}
	keys, args := make([]string, 0, nk), make([]any, 1, na)
	args[0] = len(g)
	for _, c := range g {
		keys = append(keys, c.keys...)
		args = append(args, len(c.keys), len(c.args))
	}
	for _, c := range g {
		args = append(args, c.args...)
	}
	return keys, args
}

// answerGroup gives each call of g its answer of admitn's array, or the
// call's error to all of them.
func answerGroup(g []*call, cmd *redis.Cmd) {
	all, err := cmd.Slice()
	if err == nil && len(all) != len(g) {
		err = fmt.Errorf("ratelimit: admitn answered %d answers for %d calls", len(all), len(g))
	}
	for i, c := range g {
		if err != nil {
			c.res, c.err = nil, err
			continue
		}
		c.res, c.err = int64s(all[i])
	}
}

// int64s reads one answer of admitn: admit's integers, or its error.
func int64s(v any) ([]int64, error) {
	switch v := v.(type) {
	case error:
		return nil, v
	case []any:
		res := make([]int64, len(v))
		for i, x := range v {
			n, ok := x.(int64)
			if !ok {
				return nil, fmt.Errorf("ratelimit: admitn answered %T in an answer, want integers", x)
			}
			res[i] = n
		}
		return res, nil
	}
	return nil, fmt.Errorf("ratelimit: admitn answered %T for a call, want an array", v)
}
