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
	_, err := r.Client().Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, n := range counts {
			key := r.Key(n.TenantID, "pending")
			p.HIncrBy(ctx, key, strconv.FormatInt(n.Hour.Unix()/3600*3600, 10)+"|"+n.Meter+"|x", n.Requests)
			p.Expire(ctx, key, pendingTTL)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("ratelimit: count refusals: %w", err)
	}
	for _, n := range counts {
		r.MarkActive(n.TenantID)
	}
	return nil
}

// pendingTTL is admit.lua's PENDING_US: how long an abandoned pending hash
// lives after its last write.
const pendingTTL = 14 * 24 * time.Hour
