package ratelimit

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/redisfn"
)

// ReportActive adds the tenants this node counted usage for since the last
// report to the active set the worker reads. It is not on the request path:
// cmd/api calls it about once a second. A node that dies before reporting
// leaves its tenants' pending usage to the worker's sweep.
func (r *Runner) ReportActive(ctx context.Context) error {
	ids := r.TakeActive()
	if len(ids) == 0 {
		return nil
	}
	members := make([]any, len(ids))
	for i, id := range ids {
		members[i] = id
	}
	_, err := r.Client().Pipelined(ctx, func(p redis.Pipeliner) error {
		p.SAdd(ctx, r.ActiveKey(), members...)
		p.Expire(ctx, r.ActiveKey(), redisfn.ActiveTTL)
		return nil
	})
	if err != nil {
		for _, id := range ids { // report them next time
			r.MarkActive(id)
		}
		return fmt.Errorf("ratelimit: report active: %w", err)
	}
	return nil
}
