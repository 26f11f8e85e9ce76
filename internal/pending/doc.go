// Package pending owns the usage counted in Redis and not yet in the
// ledger, and its repair: reading a tenant's pending usage (Pending,
// PendingMany, ParsePending), giving back the units of a request whose
// upstream failed (Refund, RefundIn, RefundRequest), the worker's side of
// a flush (ActiveTenants, SweepTenants, Claim, Finish, Idle), and the
// repair of counters after Redis lost data (EpochLost, MarkRestoring,
// MarkRestored, Restore, RestorePrepaid), with a prepaid tenant's credit
// drawn (PrepaidDrawn).
//
// It must not decide admissions (internal/ratelimit does), settle
// reservations (internal/settlement), keep idempotency records
// (internal/idempotency) or write to Postgres (internal/billing records
// what it claims). Its calls go through internal/redisfn, on the key
// layout described there.
package pending

import "github.com/tollgate/tollgate/internal/redisfn"

// Usage is the pending usage of every tenant of one Redis store. It is
// safe for concurrent use.
type Usage struct {
	*redisfn.Store
}

// New returns the pending usage of s.
func New(s *redisfn.Store) *Usage { return &Usage{Store: s} }
