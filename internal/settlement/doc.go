// Package settlement owns the reservations of settle routes in Redis: a
// request admitted for an estimated cost is reserved (Reserve), then
// settled to its actual cost exactly once (Settle) or refunded whole
// (RefundReserved); the concurrency leases of a reserved request are held
// until its release (Hold, TakeHold), and a counted check's request id is
// kept in its idempotency record (NoteRequestID, RequestIDOf).
//
// It must not decide admissions (internal/ratelimit), flush or repair
// pending usage (internal/pending) or store idempotent answers
// (internal/idempotency). Its calls go through internal/redisfn.
package settlement

import "github.com/tollgate/tollgate/internal/redisfn"

// Settler settles the reservations of one Redis store. It is safe for
// concurrent use.
type Settler struct {
	*redisfn.Store
}

// New returns the settler of s.
func New(s *redisfn.Store) *Settler { return &Settler{Store: s} }
