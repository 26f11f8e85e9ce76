package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Coalescing. Every admission is one script call, but the calls of
// concurrent requests need not each pay a round trip of their own: a few
// sender goroutines take whatever admissions are waiting and send them to
// Redis as one pipeline (go-redis splits a pipeline by node in a Redis
// Cluster and sends the parts concurrently), so N waiting admissions cost
// one write and one read instead of N of each, on the API node and in
// Redis. There is no timer: an admission that finds a sender idle leaves at
// once, so latency does not grow at low load; while a batch is in flight,
// the next one fills. Each script call stays its own atomic decision.

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

// call is one script call waiting for a sender.
type call struct {
	keys []string
	args []any
	res  []int64
	err  error
	done chan struct{}
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

type batcher struct {
	c      redis.UniversalClient
	script *redis.Script
	layout any // ARGV[1] of admit.lua
	// oneCall sends a batch as one call of admit.lua (ARGV[2] requests)
	// rather than a pipeline of calls, on a single Redis server; a Redis
	// Cluster always gets the pipeline (a call's keys must be on one node).
	oneCall bool
	queue   chan *call
	once    sync.Once
	// shared counts the calls sent in a batch of more than one (tests,
	// metrics).
	shared atomic.Int64
}

func newBatcher(c redis.UniversalClient, script *redis.Script) *batcher {
	_, cluster := c.(*redis.ClusterClient)
	return &batcher{c: c, script: script, layout: LayoutV2, oneCall: !cluster,
		queue: make(chan *call, senders*maxBatch)}
}

func (b *batcher) start() {
	for range senders {
		go b.send()
	}
}

// do runs the script with keys and args in the next batch and waits for
// its answer, or for ctx to end.
func (b *batcher) do(ctx context.Context, keys []string, args []any) ([]int64, error) {
	b.once.Do(b.start)
	c := callPool.Get().(*call)
	c.keys, c.args, c.res, c.err = keys, args, nil, nil
	select {
	case b.queue <- c:
	case <-ctx.Done():
		callPool.Put(c)
		return nil, ctx.Err()
	}
	select {
	case <-c.done:
		res, err := c.res, c.err
		c.keys, c.args, c.res = nil, nil, nil
		callPool.Put(c)
		return res, err
	case <-ctx.Done():
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

// run sends the batch: one call of admit.lua for all of it (oneCall), or
// a pipeline of one call per admission. Calls that fail with NOSCRIPT
// (Redis restarted or its script cache was flushed) are run again by
// Script.Run, which loads the script.
func (b *batcher) run(batch []*call, cmds []*redis.Cmd) []*redis.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	if len(batch) == 1 {
		c := batch[0]
		c.res, c.err = b.script.Run(ctx, b.c, c.keys, b.argv(batch)...).Int64Slice()
		return cmds
	}
	b.shared.Add(int64(len(batch)))
	if b.oneCall {
		keys := make([]string, 0, 7*len(batch))
		for _, c := range batch {
			keys = append(keys, c.keys...)
		}
		res, err := b.script.Run(ctx, b.c, keys, b.argv(batch)...).Int64Slice()
		if err == nil && len(res) != resultLen*len(batch) {
			err = fmt.Errorf("script answered %d values for %d requests", len(res), len(batch))
		}
		for i, c := range batch {
			if c.err = err; err == nil {
				c.res = res[i*resultLen : (i+1)*resultLen : (i+1)*resultLen]
			}
		}
		return cmds
	}
	_, _ = b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range batch {
			cmds = append(cmds, b.script.EvalSha(ctx, p, batch[i].keys, b.argv(batch[i:i+1])...))
		}
		return nil
	})
	for i, c := range batch {
		c.res, c.err = cmds[i].Int64Slice()
		if c.err != nil && redis.HasErrorPrefix(c.err, "NOSCRIPT") {
			c.res, c.err = b.script.Run(ctx, b.c, c.keys, b.argv(batch[i:i+1])...).Int64Slice()
		}
	}
	return cmds
}

// argv is admit.lua's ARGV for the calls: the layout, how many, then each
// call's own.
func (b *batcher) argv(batch []*call) []any {
	if len(batch) == 1 {
		args := make([]any, 0, 2+len(batch[0].args))
		return append(append(args, b.layout, 1), batch[0].args...)
	}
	args := make([]any, 0, 2+14*len(batch))
	args = append(args, b.layout, len(batch))
	for _, c := range batch {
		args = append(args, c.args...)
	}
	return args
}
