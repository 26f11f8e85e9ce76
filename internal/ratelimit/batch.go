package ratelimit

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Coalescing. Every admission is one function call (FCALL of the
// library's admit: library.go), but the calls of
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
	c     redis.UniversalClient
	lib   *library
	queue chan *call
	once  sync.Once
	// shared counts the calls sent in a batch of more than one (tests see
	// that batches form).
	shared atomic.Int64
}

func newBatcher(c redis.UniversalClient, l *library) *batcher {
	return &batcher{c: c, lib: l, queue: make(chan *call, senders*maxBatch)}
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

// run sends the batch as one pipeline of calls of admit. (One call for
// the whole batch was measured too: it saved ~10% of Redis's time per
// admission and doubled the p99 at half load, since a batch's admissions
// then wait for each other inside Redis.) Calls that Redis answers
// "Function not found" (restarted, flushed, a new master) are sent again
// once the library is loaded (library.go).
func (b *batcher) run(batch []*call, cmds []*redis.Cmd) []*redis.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	if len(batch) == 1 {
		c := batch[0]
		c.res, c.err = b.lib.call(ctx, b.c, fnAdmit, c.keys, c.args...).Int64Slice()
		return cmds
	}
	b.shared.Add(int64(len(batch)))
	_, _ = b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range batch {
			cmds = append(cmds, p.FCall(ctx, b.lib.names[fnAdmit], c.keys, c.args...))
		}
		return nil
	})
	b.lib.retryMissing(ctx, b.c, cmds)
	for i, c := range batch {
		c.res, c.err = cmds[i].Int64Slice()
	}
	return cmds
}
