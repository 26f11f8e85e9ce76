package quota

import (
	"errors"
	"time"
)

// OutageRow is usage an API node admitted in process while Redis was away
// (a fail-open tier's), of one meter, UTC hour and local day of a tenant,
// not yet recorded anywhere but the node's memory.
type OutageRow struct {
	Meter string
	Hour  time.Time // the UTC hour's start
	// At is an instant of the row: the tenant's day and billing period
	// (Request.Calendar) of At are the row's.
	At time.Time
	// Units may be negative: a refund or a settlement of requests whose
	// units already left the node in an earlier batch.
	Units    int64
	Requests int64
	// Overage and MeterOverage are, with negative Units, the tier's and
	// the meter's overage units to give back (those the earlier batch
	// recovered for the same meter, hour and day, at most; together at
	// most the units, the meter's first: the last units admitted were
	// overage, and a unit past both quotas the meter's); in the rows of
	// a recovered batch, the overage units recovery counted (or gave back,
	// negative).
	Overage, MeterOverage int64
}

// MaxOutageRows bounds the rows of one OutageBatch.
const MaxOutageRows = 256

// OutageBatch is one tenant's outage usage sent at once: recorded exactly
// once under ID, however often it is sent.
type OutageBatch struct {
	ID string
	// Request holds the tenant's limits as of its last fail-open admission
	// (TenantID, Limits, Overage, OveragePriceCentsPer1K, MeterQuotas,
	// Calendar): what overage and the spend cap are counted against.
	Request Request
	Rows    []OutageRow
}

// Units returns the units of b's rows.
func (b OutageBatch) Units() int64 {
	var n int64
	for _, r := range b.Rows {
		n += r.Units
	}
	return n
}

// ErrNotSent marks the error of a write that never left the node (no
// connection could be made): the store cannot have applied it, so it may
// be sent elsewhere. Any other error of a write may hide a write that
// landed.
var ErrNotSent = errors.New("quota: not sent")
