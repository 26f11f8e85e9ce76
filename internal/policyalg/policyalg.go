// Package policyalg holds the pure-Go reference models of the policies'
// rate-limiting algorithms (quota.Algorithm): one Model per Redis key of a
// policy instance, making the same decisions, to the microsecond, as the
// Lua of lua/policy_windows.lua and lua/policy_rates.lua. The tests of
// internal/ratelimit hold the Lua to these models on random schedules; the
// node scope (each API node on its own) runs them in process.
//
// Times are integer microseconds since the Unix epoch; weights are the
// units (or 1 per request) a request counts. Params are the algorithm's
// integer parameters in the order the scripts receive them (ParamsOf).
//
// It is never on a request's path: production decides the policies in Lua
// (lua/policy*.lua) and in internal/locallimit; these models are what the
// tests hold them to.
package policyalg

import (
	"fmt"

	"github.com/tollgate/tollgate/internal/quota"
)

// Params are an algorithm's four integer parameters, a..d of policy.lua:
//
//	fixed_window    limit, window us
//	sliding_log     limit, window us
//	sliding_window  limit, window us, buckets
//	token_bucket    capacity, us per unit of refill
//	gcra            burst, us per request (emission interval)
//	leaky_bucket    burst, us per request, max wait us (0: nodelay, pass at once)
//	concurrency     limit, lease us
//	warm_up         us per permit at the stable rate, warm-up us, cold factor
type Params [4]int64

// Result is a decision of Check, reported as policy.lua's item.
type Result struct {
	OK        bool
	Retry     int64 // us until the same request would pass; 0 when OK, -1 never
	Limit     int64 // the limit of the RateLimit item (q)
	Remaining int64 // after this admission when OK, as it is when not
	Reset     int64 // absolute us: full again, or the window's end
	Delay     int64 // us the request waits before it proceeds (leaky_bucket queue)
}

// Model is the state of one key of one algorithm. Check decides without
// changing anything; Commit records an admission that Check allowed (at the
// same now and weight); Undo rolls a committed admission back; Release
// ends a lease (concurrency only; a no-op elsewhere).
type Model interface {
	Check(now, w int64) Result
	Commit(now, w int64, id string)
	Undo(now, w int64, id string)
	Release(now int64, id string)
}

// constructors maps each algorithm kept in Redis to its model; the files
// of the algorithms register themselves.
var constructors = map[quota.Algorithm]func(Params) Model{}

// New returns a fresh model (empty state) of alg with p.
func New(alg quota.Algorithm, p Params) (Model, error) {
	c, ok := constructors[alg]
	if !ok {
		return nil, fmt.Errorf("policyalg: no model of %q", alg)
	}
	return c(p), nil
}

// ParamsOf converts a valid policy's fields to its Params, with limit (the
// policy's primary limit, or a param exception's) in place of limit,
// capacity or burst.
func ParamsOf(p *quota.Policy, limit int64) Params {
	switch p.Algorithm {
	case quota.AlgFixedWindow, quota.AlgSlidingLog:
		return Params{limit, *p.WindowSeconds * 1e6}
	case quota.AlgSlidingWindow:
		return Params{limit, *p.WindowSeconds * 1e6, *p.Buckets}
	case quota.AlgTokenBucket:
		return Params{limit, quota.IntervalMicros(*p.RefillPerSec)}
	case quota.AlgGCRA:
		return Params{limit, quota.IntervalMicros(*p.Rate)}
	case quota.AlgLeakyBucket:
		var wait int64
		if p.OnRefuse == quota.RefuseQueue {
			wait = *p.MaxWaitMS * 1000
		}
		return Params{limit, quota.IntervalMicros(*p.Rate), wait}
	case quota.AlgConcurrency:
		return Params{limit, *p.LeaseSeconds * 1e6}
	case quota.AlgWarmUp:
		return Params{quota.IntervalMicros(*p.Rate), *p.WarmupSeconds * 1e6, *p.ColdFactor}
	}
	return Params{}
}
