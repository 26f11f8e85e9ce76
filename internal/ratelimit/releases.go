package ratelimit

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
)

// Releases of concurrency leases, for the requests that wait for them in a
// policy queue (internal/admission, queue.go). policy_run.lua publishes the
// key of a queue policy's state on one channel when its release (or the
// undo of a reservation) gives a slot back to a full set; every API node
// listens and wakes one of its waiters of that state. A release of a
// policy that was not full, or whose refusals do not queue, publishes
// nothing: nobody can be waiting for it. The channel is plain pub/sub:
// one subscription per node, whichever server of a Redis Cluster it is on
// (a message crosses the cluster bus once). Messages lost while a node's
// subscription is down are covered by the waiters' own bounds: the
// earliest lease's end and their max wait.

// releases names the channel of the releases (ARGV[6+7n] of
// policy_run.lua).
func (r *Runner) releases() string { return r.Prefix() + ":released" }

// LeaseKey names the Redis state of a concurrency policy's instance for
// req, as ListenReleases reports its releases.
func (r *Runner) LeaseKey(req quota.Request, c quota.PolicyCall) string {
	spec, _ := r.policySpec(req, c)
	return spec.Key
}

// ListenReleases calls released with the key of every release published
// (LeaseKey's names), until ctx ends. After the subscription was lost and
// made again it calls lost: releases may have gone unheard meanwhile.
// ready, if not nil, is closed once the first subscription is confirmed.
func (r *Runner) ListenReleases(ctx context.Context, released func(key string), lost func(), ready chan<- struct{}) {
	sub := r.Client().Subscribe(ctx, r.releases())
	// Receive blocks on the socket whatever its context says; closing the
	// subscription is what ends it.
	stop := context.AfterFunc(ctx, func() { _ = sub.Close() })
	defer stop()
	defer func() { _ = sub.Close() }()
	broken := false
	for {
		msg, err := sub.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// go-redis subscribes again on the next Receive
			broken = true
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			if ready != nil {
				close(ready)
				ready = nil
			}
			if broken {
				broken = false
				lost()
			}
		case *redis.Message:
			released(m.Payload)
		}
	}
}
