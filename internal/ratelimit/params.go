package ratelimit

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/limits"
	"github.com/tollgate/tollgate/internal/quota"
)

const (
	maxMeterLen  = 64
	maxTenantLen = 128
	idemWindow   = 24 * time.Hour
)

// listKey is what a compiled list depends on (limits.Compile): the
// tier's limits with the tenant's overrides, its overage, the quota of the
// request's meter, whether it is prepaid, and its calendar. has marks the
// limits that are set.
type listKey struct {
	has                                             uint16
	burstRate, refill                               float64
	burst, capacity, daily, monthly, maxOver, price int64
	bill, prepaid                                   bool
	meter                                           string // "" without a quota of it
	meterDaily, meterMonthly, meterPrice            int64
	meterBills                                      bool
	anchor                                          int
	zone                                            string
}

// lists caches the compiled lists by listKey (tiers and their overrides
// are few; the cache is dropped whole past maxLists).
var (
	lists    sync.Map // listKey -> *limits.List
	listsLen atomic.Int64
)

const maxLists = 10_000

// listFor returns the list of req's plan for its meter (cached): a
// quota.CodeInvalid *quota.Error for limits Redis would not take.
func listFor(req quota.Request) (*limits.List, error) {
	l := req.Limits
	k := listKey{bill: req.Overage == quota.OverageBill, price: req.OveragePriceCentsPer1K, prepaid: req.Prepaid != nil,
		anchor: req.Calendar.AnchorDay}
	if req.Calendar.Zone != nil {
		k.zone = req.Calendar.Zone.String()
	}
	set := func(bit uint16, dst *int64, v *int64) {
		if v != nil {
			k.has |= bit
			*dst = *v
		}
	}
	if l.BurstRate != nil {
		k.has, k.burstRate = k.has|1, *l.BurstRate
	}
	if l.BucketRefillPerSec != nil {
		k.has, k.refill = k.has|2, *l.BucketRefillPerSec
	}
	set(4, &k.burst, l.Burst)
	set(8, &k.capacity, l.BucketCapacity)
	set(16, &k.daily, l.DailyQuota)
	set(32, &k.monthly, l.MonthlyQuota)
	set(64, &k.maxOver, l.MaxOverageCents)
	if q := quota.MeterQuotaFor(req.MeterQuotas, req.Meter); q != nil {
		k.meter, k.meterPrice, k.meterBills = req.Meter, q.OveragePriceCentsPer1K, q.Bills()
		set(128, &k.meterDaily, q.DailyQuota)
		set(256, &k.meterMonthly, q.MonthlyQuota)
	}
	if v, ok := lists.Load(k); ok {
		return v.(*limits.List), nil
	}
	list, err := limits.Compile(limits.PlanOf(req), req.Meter)
	if err != nil {
		return nil, err
	}
	if listsLen.Add(1) > maxLists {
		lists.Clear()
		listsLen.Store(1)
	}
	lists.Store(k, list)
	return list, nil
}

// prepaidArg is admit's prepaid argument: a prepaid tenant's balance,
// "bal,period,prev,lines,expiring" (lua/kinds.lua, the credit), "" for
// postpaid.
func prepaidArg(pp *quota.Prepaid) string {
	if pp == nil {
		return ""
	}
	return strconv.FormatInt(pp.BalanceMillicents, 10) + "," + strconv.Itoa(pp.PeriodID) + "," + strconv.Itoa(pp.PrevID) +
		"," + strconv.Itoa(max(pp.Lines, 1)) + "," + strconv.FormatInt(pp.ExpiringMillicents, 10)
}

// spendCapMillicents is req's spend cap in millicents when the script
// counts the meters' overage against it (some meter quota of the tier
// bills) or the tenant is prepaid (the script then checks every cap in
// millicents), else -1.
func spendCapMillicents(req quota.Request) int64 {
	if req.Prepaid != nil || slices.ContainsFunc(req.MeterQuotas, quota.MeterQuota.Bills) {
		return capMillicents(req)
	}
	return -1
}

// capMillicents is req's spend cap (max_overage_cents) in millicents, or
// -1 for none.
func capMillicents(req quota.Request) int64 {
	if c := req.Limits.MaxOverageCents; c != nil {
		return *c * 1000
	}
	return -1
}

// checkRequest validates everything of req but its limits.
func checkRequest(req quota.Request) error {
	if err := checkTenant(req.TenantID); err != nil {
		return err
	}
	if n := len(req.Meter); n == 0 || n > maxMeterLen || strings.Contains(req.Meter, "|") {
		// '|' separates the fields of the pending usage hash.
		return quota.FieldError("meter", "must be 1 to %d characters without '|'", maxMeterLen)
	}
	if req.Cost < 1 || req.Cost > quota.MaxQuantity {
		return quota.FieldError("cost", "must be an integer between 1 and %d", quota.MaxQuantity)
	}
	if req.IdempotencyLease < 0 || req.IdempotencyLease > idemWindow || len(req.IdempotencyFingerprint) > 128 {
		return quota.FieldError("idempotency", "the lease must be 0 to 24 h and the fingerprint at most 128 bytes")
	}
	switch req.Overage {
	case quota.OverageBlock, quota.OverageBill, "":
	default:
		return quota.FieldError("overage", `must be "block" or "bill"`)
	}
	return checkNow(req.Now)
}

// checkTenant keeps tenant ids from breaking the key's hash tag: a brace
// would move the tag, so that a tenant's keys could span slots.
func checkTenant(id string) error {
	if id == "" || len(id) > maxTenantLen || strings.ContainsAny(id, "{}") {
		return quota.FieldError("tenant_id", "must be 1 to %d characters without braces", maxTenantLen)
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return quota.FieldError("tenant_id", "must not contain control characters")
		}
	}
	return nil
}

// checkNow rejects explicit times the script cannot take: the script reads
// 0 as "use Redis TIME", and periods before 1970 are not worth supporting.
func checkNow(now time.Time) error {
	if !now.IsZero() && now.UnixMicro() <= 0 {
		return quota.FieldError("now", "must be after 1970-01-01")
	}
	return nil
}

// micros returns t in us since the epoch, or 0 (Redis TIME) for the zero time.
func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// idemHash names an idempotency key. Keys are scoped to the tenant (the
// record lives under its hash tag), not to a route: the same key on another
// route is another request, which the fingerprint turns into IdemMismatch.
// Hashing bounds the key's length whatever the client sends.
func idemHash(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}
