package admission

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// The room of a tenant's idempotency records (quota.AnswerLimits). A
// request with a key claims the room of the record it may write before it
// is decided, in one atomic script run, so that concurrent requests never
// take more room than there is; past the room it is refused before it
// runs, consuming nothing. The decision then tells whether a record was
// written: a claim whose request wrote none is given back at once, one
// whose request did is settled when its answer is stored or its key
// released (StoreAnswer, ReleaseKey, Refund), and a record written after
// the claim found the key decided (the deciding record went in between) is
// counted then. The claim costs idempotent requests one Redis round trip;
// requests without a key make none.

// errIdemUnavailable answers an idempotent request while Redis is away:
// keys are recorded there only.
var errIdemUnavailable = &quota.Error{Code: quota.CodeUnavailable,
	Message: "the quota store is unavailable and idempotency keys are kept there only; retry shortly"}

// newClaimID names a request's claim: 128 random bits, so that no other
// request's claim, on any node, is taken for it.
func newClaimID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// admitIdempotent is Admit for a request with an idempotency key: its
// claim, the decision, and the claim given back or counted as the decision
// says.
func (g *Gate) admitIdempotent(ctx context.Context, req quota.Request) (quota.Decision, error) {
	if req.IdempotencyClaim == "" {
		req.IdempotencyClaim = newClaimID()
	}
	now := g.now()
	shard := ""
	if g.nBreakers.Load() > 0 {
		if shard = g.store.Shard(req.TenantID); g.open(shard, now) {
			return quota.Decision{}, errIdemUnavailable
		}
	}
	c, err := g.store.ClaimAnswer(ctx, req, false)
	if err != nil {
		if quota.ErrorCode(err) == quota.CodeInvalid || ctx.Err() != nil {
			return quota.Decision{}, err
		}
		g.OnRedisError(err)
		if shard == "" {
			shard = g.store.Shard(req.TenantID)
		}
		g.failed(shard, now)
		return quota.Decision{}, errIdemUnavailable
	}
	if c.Status == quota.ClaimRefused {
		return quota.Decision{Idem: quota.IdemLimit, RetryAfter: c.RetryAfter, Now: now}, nil
	}
	d, err := g.admitQueued(ctx, req)
	if err != nil {
		var stale *quota.PrepaidStaleError
		if quota.ErrorCode(err) == quota.CodeInvalid || errors.As(err, &stale) {
			// decided before anything was written (bad input, or a
			// prepaid balance of another period: the caller asks again)
			g.afterClaim(ctx, func(ctx context.Context) error { return g.store.UnclaimAnswer(ctx, req) })
		}
		// Otherwise Redis may have written the record before the error
		// came back: the claim stays, to free with its score (the bound
		// errs on the safe side).
		return d, err
	}
	wrote := d.Allowed && d.Idem == quota.IdemNone && !d.Degraded
	switch {
	case c.Status == quota.ClaimTaken && !wrote:
		g.afterClaim(ctx, func(ctx context.Context) error { return g.store.UnclaimAnswer(ctx, req) })
	case c.Status == quota.ClaimSkipped && wrote:
		g.afterClaim(ctx, func(ctx context.Context) error {
			_, err := g.store.ClaimAnswer(ctx, req, true)
			return err
		})
	}
	return d, nil
}

// afterClaim runs a claim's follow-up, even when the client hung up: it
// changes only the count of the room, so a failure is counted as Redis's
// and left (an unreturned claim frees with its score; an uncounted record
// with its expiry).
func (g *Gate) afterClaim(ctx context.Context, f func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := f(ctx); err != nil {
		g.OnRedisError(err)
	}
}
