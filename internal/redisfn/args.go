package redisfn

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// The arguments the functions share: checks of what goes into keys, and
// the integer forms of times, periods, idempotency keys and spend caps.

// MaxTenantLen bounds a tenant id.
const MaxTenantLen = 128

// CheckTenant keeps tenant ids from breaking the key's hash tag: a brace
// would move the tag, so that a tenant's keys could span slots.
func CheckTenant(id string) error {
	if id == "" || len(id) > MaxTenantLen || strings.ContainsAny(id, "{}") {
		return quota.FieldError("tenant_id", "must be 1 to %d characters without braces", MaxTenantLen)
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return quota.FieldError("tenant_id", "must not contain control characters")
		}
	}
	return nil
}

// CheckNow rejects explicit times the script cannot take: the script reads
// 0 as "use Redis TIME", and periods before 1970 are not worth supporting.
func CheckNow(now time.Time) error {
	if !now.IsZero() && now.UnixMicro() <= 0 {
		return quota.FieldError("now", "must be after 1970-01-01")
	}
	return nil
}

// Micros returns t in us since the epoch, or 0 (Redis TIME) for the zero time.
func Micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// IdemHash names an idempotency key. Keys are scoped to the tenant (the
// record lives under its hash tag), not to a route: the same key on another
// route is another request, which the fingerprint turns into IdemMismatch.
// Hashing bounds the key's length whatever the client sends.
func IdemHash(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// PeriodIDs returns the scripts' day and month ids of t in cal: days since
// 1970-01-01 and year*100+month, UTC for the default calendar.
func PeriodIDs(cal quota.Calendar, t time.Time) (day, month int64) {
	if cal.IsDefault() {
		t = t.UTC()
		return FloorDiv(t.Unix(), 86400), int64(t.Year())*100 + int64(t.Month())
	}
	return cal.DayID(t), int64(cal.PeriodID(t))
}

// SpendCapMillicents is req's spend cap in millicents when the script
// checks it in millicents, over the tier's overage and the meters' spend
// of the month together: when the tier bills overage (the meters' spend
// may come from a plan of earlier in the month), some meter quota of the
// tier bills, or the tenant is prepaid; else -1.
func SpendCapMillicents(req quota.Request) int64 {
	if req.Prepaid != nil || req.Overage == quota.OverageBill || slices.ContainsFunc(req.MeterQuotas, quota.MeterQuota.Bills) {
		return CapMillicents(req)
	}
	return -1
}

// CapMillicents is req's spend cap (max_overage_cents) in millicents, or
// -1 for none.
func CapMillicents(req quota.Request) int64 {
	if c := req.Limits.MaxOverageCents; c != nil {
		return *c * 1000
	}
	return -1
}
