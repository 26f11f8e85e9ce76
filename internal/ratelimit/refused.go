package ratelimit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
)

// CountRefused adds refusals answered outside the script (an API node's deny
// cache) to the tenants' pending usage, as the "|x" counters admit.lua keeps,
// in one pipeline. They go to the pending hash (which has an expiry of
// its own, unlike a state hash a bare HINCRBY could create), and claim.lua
// flushes them with the rest of the usage.
func (r *Runner) CountRefused(ctx context.Context, counts []quota.RefusalCount) error {
	if len(counts) == 0 {
		return nil
	}
	_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, n := range counts {
			key := r.key(n.TenantID, "pending")
			p.HIncrBy(ctx, key, strconv.FormatInt(n.Hour.Unix()/3600*3600, 10)+"|"+n.Meter+"|x", n.Requests)
			p.Expire(ctx, key, pendingTTL)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("ratelimit: count refusals: %w", err)
	}
	for _, n := range counts {
		r.active.add(n.TenantID)
	}
	return nil
}

// pendingTTL is admit.lua's PENDING_US: how long an abandoned pending hash
// lives after its last write.
const pendingTTL = 14 * 24 * time.Hour

// Shard names the Redis node serving the tenant's hash slot: its address in
// a cluster (from the client's cached slot map, no round trip), "redis" for
// a single server, where every tenant shares the one node.
func (r *Runner) Shard(tenantID string) string {
	cc, ok := r.c.(*redis.ClusterClient)
	if !ok {
		return "redis"
	}
	n, err := cc.MasterForKey(context.Background(), r.key(tenantID, "pending"))
	if err != nil {
		return "slot-unknown"
	}
	return n.Options().Addr
}
