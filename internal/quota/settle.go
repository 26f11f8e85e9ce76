package quota

import "time"

// SettleWindow is how long a request admitted on a route with settle: true
// may be settled to its actual cost; after it the route cost is final.
const SettleWindow = 10 * time.Minute

// SettleStatus is what a settle did.
type SettleStatus int

const (
	// SettleUnknown means no reservation under the request id (never made, or
	// older than SettleWindow): nothing changed.
	SettleUnknown SettleStatus = iota
	// SettleApplied means the difference was refunded or charged, now.
	SettleApplied
	// SettleAlready means the request was settled before: nothing changed.
	SettleAlready
	// SettleRefunded means the request was refunded before (a check's POST
	// /v1/refund): nothing changed.
	SettleRefunded
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

// SettlementRecord is a settlement as the audit log records it (entity
// "settlement", its request id): who settled is the entry's actor
// (SettleByService, SettleByUpstream).
type SettlementRecord struct {
	RequestID  string `json:"request_id"`
	TenantID   string `json:"tenant_id"`
	ActualCost int64  `json:"actual_cost"`
	// Delta is actual cost - admitted cost, as applied.
	Delta int64 `json:"delta"`
	// RemoteIP is the address of the service that posted it (none for the
	// upstream's header).
	RemoteIP string `json:"remote_ip,omitempty"`
}

// The actors of settlements in the audit log.
const (
	SettleByService  = "service"  // POST /v1/settle, with the service token
	SettleByUpstream = "upstream" // the upstream's Tollgate-Actual-Cost header
	SettleByRefund   = "refund"   // POST /v1/refund, with the service token
)

// HeldLease is a concurrency lease a reserved check holds until POST
// /v1/release or /v1/refund: its policy (by name) and scope value.
type HeldLease struct{ Policy, Value string }
