// Package quotaredis assembles the Redis side of quota state on one
// client and key prefix: the admission (internal/ratelimit), the pending
// usage and its repair (internal/pending), settlement
// (internal/settlement) and idempotent answers (internal/idempotency), all
// on one internal/redisfn.Store. The API node, the worker and the tests
// build it here, once, and hand it to the consumers (admission.Gate,
// billing.Reconciler, usage.Reader, catalog's grants and plans) through
// their interfaces.
//
// It owns no behaviour of its own: it must not add operations, only join
// the parts.
package quotaredis

import (
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/idempotency"
	"github.com/tollgate/tollgate/internal/pending"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/ratelimit"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/settlement"
)

// Store is every part of the Redis side on one redisfn.Store: the
// methods of each part, and the store's own (LoadFunctions, Shard, ...).
type Store struct {
	*redisfn.Store
	*ratelimit.Runner
	*pending.Usage
	*settlement.Settler
	*idempotency.Answers
}

// New returns the parts on c under prefix (redisfn.New: it panics when
// prefix holds a brace).
func New(c redis.UniversalClient, prefix string) *Store {
	return Of(redisfn.New(c, prefix))
}

// Of returns the parts on s.
func Of(s *redisfn.Store) *Store {
	return &Store{
		Store:   s,
		Runner:  ratelimit.New(s),
		Usage:   pending.New(s),
		Settler: settlement.New(s),
		Answers: idempotency.New(s),
	}
}

// WithAnswerLimits sets the room of each tenant's idempotency records
// (idempotency.Answers.WithAnswerLimits) and returns st.
func (st *Store) WithAnswerLimits(l quota.AnswerLimits) *Store {
	st.Answers.WithAnswerLimits(l)
	return st
}
