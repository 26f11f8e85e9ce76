package redisfn

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Grouped calls. The worker's flush runs claim, finish and pending for
// every active tenant of a cycle. Each FCALL has costs of its own besides
// its function's work, in Redis (reading and parsing it, finding and
// entering the function, writing its answer) and in the client; the
// function each (lua/each.lua) runs one of the three for many tenants in
// one call, each tenant with its keys and arguments as its own call would
// have them, and pays them once for all.
//
// The keys of one call must all be in one Redis Cluster slot: on a single
// Redis any tenants share a call, in a cluster only those of one slot (and
// among a few thousand tenants, few share one of the 16,384 slots: there
// most go a call each, as without each). A call of each that Redis
// refuses as a whole (TRYAGAIN while its slot migrates, a Redis past its
// maxmemory refusing each, which may write, where it runs pending, which
// only reads) is followed by a call of its own for each of its items, as
// Pipelined sends them, and so is an item whose function raised an error:
// all three functions may run twice (a claim answers the batch already in
// flight, a finish drops only the batch of its id, pending only reads), so
// that no outcome is worse than without each and an item's error is its
// own. A call that got no answer (a timeout, a connection lost) gives its
// error to each of its items, as calls of their own in the same pipeline
// would have had it: sending them again would only wait longer.

// EachGroup is the most items one call of each carries: 100 claims take
// Redis under a millisecond, and answer a few tens of kilobytes. Groups of
// 50, 100 and 200 measured the same (BenchmarkPipelinedEach).
const EachGroup = 100

// A pipeline of PipelinedEach carries at most eachPipelineItems items and
// eachPipelineCalls calls, so that its answers come back well within the
// client's read timeout also when Redis is busy.
const (
	eachPipelineItems = 2000
	eachPipelineCalls = 500
)

// eachRuns are the functions each runs (lua/each.lua's runs).
var eachRuns = [fnCount]bool{FnClaim: true, FnFinish: true, FnPending: true}

// errNotSent is the error of the items PipelinedEach did not send, after
// an earlier pipeline's failure.
var errNotSent = errors.New("redisfn: not sent: an earlier call failed")

// PipelinedEach runs f for n items, item i with the keys and arguments
// item returns for it (it is called once for each i), in pipelines of a
// few thousand items: for claim, finish and pending in calls of each of up
// to EachGroup items (an item alone in its group, or of another function,
// in a call of its own). It returns, for each item, its call of f alone,
// holding the answer each gave it (or that call's own answer, sent alone),
// and the first error among them. After a pipeline with an error it sends
// no more: the items left hold errNotSent.
func (r *Store) PipelinedEach(ctx context.Context, f Fn, n int, item func(i int) (keys []string, args []any)) ([]*redis.Cmd, error) {
	return r.pipelinedEach(ctx, f, n, item, EachGroup)
}

// pipelinedEach is PipelinedEach with groups of up to size items.
func (r *Store) pipelinedEach(ctx context.Context, f Fn, n int, item func(i int) ([]string, []any), size int) ([]*redis.Cmd, error) {
	if n == 0 {
		return nil, nil
	}
	keys, args := make([][]string, n), make([][]any, n)
	cmds := make([]*redis.Cmd, n)
	for i := range n {
		keys[i], args[i] = item(i)
		cmds[i] = fcallCmd(ctx, r.lib.names[f], keys[i], args[i])
	}
	if !eachRuns[f] {
		size = 1
	}
	groups := r.eachGroups(keys, args, size)
	for start := 0; start < len(groups); {
		end, items := start, 0
		for end < len(groups) && end-start < eachPipelineCalls && (end == start || items+len(groups[end]) <= eachPipelineItems) {
			items += len(groups[end])
			end++
		}
		r.sendEach(ctx, f, groups[start:end], keys, args, cmds)
		for _, g := range groups[start:end] {
			for _, i := range g {
				if err := cmds[i].Err(); err != nil {
					for _, rest := range groups[end:] {
						for _, j := range rest {
							cmds[j].SetErr(errNotSent)
						}
					}
					return cmds, err
				}
			}
		}
		start = end
	}
	return cmds, nil
}

// eachGroups groups the items, each group's in their order and the groups
// in that of their first items: up to size items of the same numbers of
// keys and arguments, and in a Redis Cluster (any client but a single
// server's) of the same slot (their first keys'). An item without keys is
// a group of its own.
func (r *Store) eachGroups(keys [][]string, args [][]any, size int) [][]int {
	_, single := r.c.(*redis.Client)
	type shape struct{ slot, keys, args int }
	open := map[shape]int{} // the group items of the shape join
	var groups [][]int
	for i := range keys {
		if len(keys[i]) == 0 || size < 2 {
			groups = append(groups, []int{i})
			continue
		}
		s := shape{-1, len(keys[i]), len(args[i])}
		if !single {
			s.slot = keySlot(keys[i][0])
		}
		if g, ok := open[s]; ok && len(groups[g]) < size {
			groups[g] = append(groups[g], i)
			continue
		}
		open[s] = len(groups)
		groups = append(groups, []int{i})
	}
	return groups
}

// keySlot is the Redis Cluster slot of key: its hash tag's (the text
// between its first '{' and the first '}' after it, when not empty), else
// the whole key's.
func keySlot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return KeySlot(key)
}

// sendEach sends the groups as one pipeline, a group of one item as the
// item's call of f, any other as a call of each, and puts each item's
// answer in its command of cmds; then sends the items spread gave none
// (their call refused, or their function's error) one call each, in
// pipelines of at most eachPipelineCalls.
func (r *Store) sendEach(ctx context.Context, f Fn, groups [][]int, keys [][]string, args [][]any, cmds []*redis.Cmd) {
	calls := make([]*redis.Cmd, len(groups))
	for j, g := range groups {
		if len(g) == 1 {
			calls[j] = cmds[g[0]]
			continue
		}
		calls[j] = r.eachCmd(ctx, f, g, keys, args)
	}
	r.lib.send(ctx, r.c, calls)
	var alone []int
	for j, g := range groups {
		if len(g) == 1 {
			cmds[g[0]] = calls[j] // (resend may have replaced it)
			continue
		}
		alone = append(alone, spread(calls[j], g, cmds)...)
	}
	for start := 0; start < len(alone); start += eachPipelineCalls {
		part := alone[start:min(start+eachPipelineCalls, len(alone))]
		again := make([]*redis.Cmd, len(part))
		for j, i := range part {
			again[j] = cmds[i]
		}
		r.lib.send(ctx, r.c, again)
		for j, i := range part {
			cmds[i] = again[j]
		}
	}
}

// eachCmd returns the call of each that runs f for the items g.
func (r *Store) eachCmd(ctx context.Context, f Fn, g []int, keys [][]string, args [][]any) *redis.Cmd {
	k, a := len(keys[g[0]]), len(args[g[0]])
	ks := make([]string, 0, k*len(g))
	as := make([]any, 0, 4+a*len(g))
	as = append(as, functions[f].name, k, a, len(g))
	for _, i := range g {
		ks = append(ks, keys[i]...)
		as = append(as, args[i]...)
	}
	return fcallCmd(ctx, r.lib.names[FnEach], ks, as)
}

// spread gives each item of g the answer call (of each) gave it, as its
// own call of f would hold it (nil as redis.Nil), and returns the items it
// gave none, to be sent alone: those whose function raised or answered an
// error (each's "EACH <error>"), which their own calls answer in their own
// words, and every item when Redis refused call (an error reply) or its
// answer is not one for each item. When call failed without an answer of
// Redis (a timeout, a connection lost or never made: it may have run, and
// calls of their own would fare no better), each item gets its error, as
// it would have in a pipeline of calls of their own.
func spread(call *redis.Cmd, g []int, cmds []*redis.Cmd) (alone []int) {
	answers, err := call.Slice()
	var re redis.Error
	switch {
	case err != nil && !errors.As(err, &re):
		for _, i := range g {
			cmds[i].SetErr(err)
		}
		return nil
	case err != nil || len(answers) != len(g):
		return g
	}
	for j, i := range g {
		switch v := answers[j].(type) {
		case nil:
			cmds[i].SetErr(redis.Nil)
		case error:
			alone = append(alone, i)
		default:
			cmds[i].SetVal(v)
		}
	}
	return alone
}
