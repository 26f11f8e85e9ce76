package quota

import "time"

// SettleWindow is how long a request admitted on a route with settle: true
// may be settled to its actual cost; after it the route cost is final.
const SettleWindow = 10 * time.Minute

// SettleStatus is what a settle did.
type SettleStatus int

const (
	// SettleUnknown: no reservation under the request id (never made, or
	// older than SettleWindow): nothing changed.
	SettleUnknown SettleStatus = iota
	// SettleApplied: the difference was refunded or charged, now.
	SettleApplied
	// SettleAlready: the request was settled before: nothing changed.
	SettleAlready
)

// Settlement is the outcome of settling one request.
type Settlement struct {
	Status SettleStatus
	// Delta is actual cost - admitted cost: negative units given back,
	// positive units charged (0 unless Applied).
	Delta int64
	// OverageDelta is the change of the month's overage units.
	OverageDelta int64
}
