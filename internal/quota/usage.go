package quota

import (
	"encoding/json"
	"time"
)

// PendingRow is one tenant, meter and UTC hour of usage counted at admission
// and not yet recorded in the ledger. Units and Overage may be negative after
// a refund of usage that was recorded already.
type PendingRow struct {
	Hour     time.Time
	Meter    string
	Units    int64
	Requests int64
	Rejected int64
	Overage  int64
	// ShadowRefused counts the requests a shadow policy would have refused,
	// admitted or not; Degraded the requests answered with a degrade
	// policy's fallback (not admitted, not charged, not in Rejected).
	ShadowRefused int64
	Degraded      int64
	// MeterOverage are the units past the meter's own monthly quota
	// (MeterQuota), billed at its price; they are not in Overage.
	MeterOverage int64
}

// Batch is one tenant's pending usage taken for one flush.
type Batch struct {
	TenantID string
	ID       string // names the batch in flight (and in usage_batches, when Seq is 0)
	// Seq orders the tenant's batches: a later batch of the tenant has a
	// greater one, and the ledger records a batch only if its Seq is
	// greater than the last it recorded of the tenant (exactly once). 0
	// for a batch claimed by a release before sequences, recorded once by
	// its ID instead.
	Seq int64
	// Prev, when the claim marked the tenant's state hash with Seq
	// (lua/claim.lua; nil when it did not), is the Seq of the batch Redis
	// claimed of the tenant before this one (0 for none). Normally the
	// ledger recorded that batch last; one that follows an earlier
	// recorded batch comes from Redis gone back to older data, and holds
	// usage recorded already.
	Prev *int64
	Rows []PendingRow
	// Resumed is true when the batch was already in flight (an earlier
	// flush stopped, or another worker is flushing it): the tenant's newer
	// pending usage is still waiting behind it.
	Resumed bool
	// Err is set, and Rows empty, when the batch holds fields that cannot be
	// read: it cannot be recorded until they are repaired, and stays in
	// flight meanwhile. It is returned with the other batches rather than
	// failing the whole claim, so that one tenant's bad data holds back no
	// other tenant.
	Err error
}

// FlushingTTL bounds an abandoned batch: far longer than any worker outage
// we expect to recover from, so a batch is never lost to expiry in practice.
// It is also the longest a batch can be replayed after its claim, which
// bounds how long the ledger must remember the batch's id.
const FlushingTTL = 30 * 24 * time.Hour

// Recorded is what the ledger holds for a tenant's current day and month:
// the units counted and the units granted, and the month's overage units
// (the tier's), which its spend cap counts. A repair restores the
// admission counters from it.
type Recorded struct {
	TenantID             string
	DayUnits, MonthUnits int64
	DayGrant, MonthGrant int64
	MonthOverage         int64
	// Calendar is the tenant's billing calendar, whose day and month
	// (period) these are; the zero Calendar's are the UTC day and month.
	Calendar Calendar
	// Meters are the units of the meters of the tier's meter quotas in
	// the same day and month (MeterQuota).
	Meters []MeterRecorded
}

// MeterRecorded is one meter's units of a day and a month in the ledger,
// and its units past the meter's monthly quota that month, with what the
// spend cap counts of them: at the meter quota's overage price when it
// bills, in millicents.
type MeterRecorded struct {
	Meter                              string
	DayUnits, MonthUnits, MonthOverage int64
	OverageMillicents                  int64
}

// KeyRecord is an API key as authentication needs it: the listed key and the
// SHA-256 of its secret.
type KeyRecord struct {
	Key  APIKey
	Hash []byte
}

// Grant is extra units for one of a tenant's days or months. Applied says
// whether it is in the tenant's admission counter yet; until it is, the
// worker applies it, once, by its ID.
type Grant struct {
	ID          string    `json:"id"`
	TenantID    string    `json:"tenant_id"`
	Period      string    `json:"period"`
	PeriodStart string    `json:"period_start"`
	Units       int64     `json:"units"`
	CreatedAt   time.Time `json:"created_at"`
	Applied     bool      `json:"applied"`
}

// Page asks for one page of a list: at most Limit items after Cursor.
type Page struct {
	Limit  int
	Cursor string // opaque, from the previous page's next cursor
}

// TenantFilter narrows a listing of tenants.
type TenantFilter struct {
	Query string // case-insensitive substring of the name, or the exact id
	Tier  string
}

// AuditEntry is one recorded admin change.
type AuditEntry struct {
	ID       int64           `json:"id"`
	At       time.Time       `json:"at"`
	Actor    string          `json:"actor"`
	Action   string          `json:"action"`
	Entity   string          `json:"entity"`
	EntityID string          `json:"entity_id"`
	Before   json.RawMessage `json:"before"`
	After    json.RawMessage `json:"after"`
}

// PrepaidRecorded is what a prepaid tenant's admissions drew on its credit
// in its current billing period and the one before, by the ledger: the
// units past its monthly quotas at the overage prices of now (as the
// admission script counts them), in millicents. Period and Prev are the
// periods' ids (Calendar.PeriodID); Until is the current period's end.
type PrepaidRecorded struct {
	TenantID                   string
	Period, Prev               int
	Millicents, PrevMillicents int64
	Until                      time.Time
}
