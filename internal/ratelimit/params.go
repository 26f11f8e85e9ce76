package ratelimit

import (
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// Sizes of the script's answer (see lua/admit.lua).
const (
	headLen   = 6 // allowed, violated, retry, overage, now, replayed
	perLimit  = 4 // active, limit, remaining, reset
	resultLen = headLen + perLimit*4
)

// Mask bits of the violated limits, in quota.AllLimits order: 1, 2, 4 and
// 8 are the burst limit's, the bucket's, the day's and the month's (decode
// reads them by position), then:
const (
	// bitSpendCap is the spend cap's refusal (quota.LimitSpendCap); 16 and
	// 32 are the policies' (lua/admit.lua)
	bitSpendCap = 64
	// the meter quota's daily and monthly quotas
	bitMeterDaily   = 128
	bitMeterMonthly = 256
	// bitCredit is a prepaid tenant's refusal for want of credit
	// (quota.LimitCredit)
	bitCredit = 512
	// meterLen is the length of the meter quota's items (after resultLen):
	// its daily and monthly limits, then the meter overage units admitted
	meterLen = 2*perLimit + 1
)

const (
	maxMeterLen = 64
	idemWindow  = 24 * time.Hour
)

// params are a request's limits in the script's integer form. A zero
// interval or a negative quota means unlimited.
type params struct {
	gcraT, burst      int64 // us per request, requests
	bucketU, capacity int64 // us per unit, units
	daily, monthly    int64 // units; -1 = unlimited
	ocap              int64 // spend cap, overage units a month; -1 = none
	// mq is admit.lua's ARGV[18] ("" none) and mqMeter the meter it is of
	mq, mqMeter string
}

// paramsOf validates l and converts it to integers.
func paramsOf(l quota.Limits) (params, error) {
	if err := l.Validate(); err != nil {
		return params{}, err
	}
	p := params{daily: -1, monthly: -1, ocap: -1}
	if l.BurstRate != nil {
		p.gcraT, p.burst = quota.IntervalMicros(*l.BurstRate), *l.Burst
		if p.burst > quota.MaxWindowMicros/p.gcraT {
			return params{}, quota.FieldError("burst", "burst / burst_rate must be at most %d seconds", quota.MaxWindowMicros/1e6)
		}
	}
	if l.BucketCapacity != nil {
		p.bucketU, p.capacity = quota.IntervalMicros(*l.BucketRefillPerSec), *l.BucketCapacity
		if p.capacity > quota.MaxWindowMicros/p.bucketU {
			return params{}, quota.FieldError("bucket_capacity", "bucket_capacity / bucket_refill_per_sec must be at most %d seconds", quota.MaxWindowMicros/1e6)
		}
	}
	if l.DailyQuota != nil {
		p.daily = *l.DailyQuota
	}
	if l.MonthlyQuota != nil {
		p.monthly = *l.MonthlyQuota
	}
	return p, nil
}

// requestParams are the params of req: its limits and its spend cap
// (quota.SpendCapUnits of its overage price).
func requestParams(req quota.Request) (params, error) {
	p, err := paramsOf(req.Limits)
	if err != nil {
		return p, err
	}
	p.ocap = quota.SpendCapUnits(req.Limits.MaxOverageCents, req.Overage, req.OveragePriceCentsPer1K)
	p.mq, p.mqMeter = meterArg(req), req.Meter
	return p, nil
}

// meterArg is admit.lua's ARGV[18] for req: the quota of its meter, the
// spend cap in millicents when spendCapMillicents gives it (the cap then
// bounds the tier's overage with the meters' spend of the month), and a
// prepaid tenant's balance; "" when none of them. With
// this argument the script checks the cap in millicents, not ocap's
// units: whenever it is sent it carries the tier's cap, so that a meter
// quota that bills nothing leaves the cap binding the tier's overage.
func meterArg(req quota.Request) string {
	q := quota.MeterQuotaFor(req.MeterQuotas, req.Meter)
	capm, tprice := redisfn.SpendCapMillicents(req), int64(0)
	if q != nil {
		capm = redisfn.CapMillicents(req)
	}
	if req.Overage == quota.OverageBill {
		tprice = req.OveragePriceCentsPer1K
	}
	tail := ""
	if pp := req.Prepaid; pp != nil {
		tail = "," + strconv.FormatInt(pp.BalanceMillicents, 10) + "," + strconv.Itoa(pp.PeriodID) + "," + strconv.Itoa(pp.PrevID) +
			"," + strconv.Itoa(max(pp.Lines, 1)) + "," + strconv.FormatInt(pp.ExpiringMillicents, 10)
	}
	if q == nil {
		if capm < 0 && tail == "" {
			return ""
		}
		return "-1,-1,0,0," + strconv.FormatInt(tprice, 10) + "," + strconv.FormatInt(capm, 10) + tail
	}
	dq, mq, bill := int64(-1), int64(-1), "0"
	if q.DailyQuota != nil {
		dq = *q.DailyQuota
	}
	if q.MonthlyQuota != nil {
		mq = *q.MonthlyQuota
	}
	if q.Bills() {
		bill = "1"
	}
	return strconv.FormatInt(dq, 10) + "," + strconv.FormatInt(mq, 10) + "," + bill + "," +
		strconv.FormatInt(q.OveragePriceCentsPer1K, 10) + "," + strconv.FormatInt(tprice, 10) + "," + strconv.FormatInt(capm, 10) + tail
}

// itemsAt is where the policies' items start in the script's answer.
func itemsAt(p params) int {
	if p.mq != "" {
		return resultLen + meterLen
	}
	return resultLen
}

// checkRequest validates everything of req but its limits.
func checkRequest(req quota.Request) error {
	if err := redisfn.CheckTenant(req.TenantID); err != nil {
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
	return redisfn.CheckNow(req.Now)
}

// overageMode maps the policy to the script's argument; an empty policy
// blocks, the safe choice when a caller does not say.
func overageMode(o quota.Overage) string {
	if o == quota.OverageBill {
		return "bill"
	}
	return "block"
}

// decode turns the script's answer into a Decision. Windows
// come from p: B*T, C*U, one day, and the length of the month of the
// decision's time; in a calendar that is not the default (b, the bounds
// the script was given, not nil), the length of the decision's local day
// and of its billing month.
func decode(r []int64, p params, cal quota.Calendar, b *calBounds) quota.Decision {
	now := time.UnixMicro(r[4]).UTC()
	d := quota.Decision{
		Allowed:      r[0] == 1,
		OverageUnits: r[3],
		Idem:         quota.IdemOutcomeOf(r[5]),
		Now:          now,
	}
	if !d.Allowed {
		d.RetryAfter = time.Duration(r[2]) * time.Microsecond
	}
	windows := [4]time.Duration{
		time.Duration(p.burst*p.gcraT) * time.Microsecond,
		time.Duration(p.capacity*p.bucketU) * time.Microsecond,
	}
	if b != nil {
		windows[2], windows[3] = b.windows(cal, r[4])
	} else {
		monthStart := quota.MonthStart(now)
		windows[2], windows[3] = 24*time.Hour, monthStart.AddDate(0, 1, 0).Sub(monthStart)
	}
	for i, name := range quota.AllLimits {
		f := r[headLen+perLimit*i:]
		if r[1]&(1<<i) != 0 {
			d.Violated = append(d.Violated, name)
		}
		if f[0] == 0 {
			continue
		}
		d.Limits = append(d.Limits, quota.LimitState{
			Name:      name,
			Limit:     f[1],
			Remaining: f[2],
			Reset:     time.UnixMicro(f[3]).UTC(),
			Window:    windows[i],
		})
	}
	if r[1]&bitSpendCap != 0 {
		d.Violated = append(d.Violated, quota.LimitSpendCap)
	}
	if r[1]&bitCredit != 0 {
		d.Violated = append(d.Violated, quota.LimitCredit)
	}
	if p.mq != "" && len(r) >= resultLen+meterLen {
		d.MeterOverageUnits = r[resultLen+2*perLimit]
		names := [2]quota.LimitName{quota.LimitName(p.mqMeter + ".daily"), quota.LimitName(p.mqMeter + ".monthly")}
		bits := [2]int64{bitMeterDaily, bitMeterMonthly}
		for i := range 2 {
			f := r[resultLen+perLimit*i:]
			if r[1]&bits[i] != 0 {
				d.Violated = append(d.Violated, names[i])
			}
			if f[0] == 0 {
				continue
			}
			d.Limits = append(d.Limits, quota.LimitState{
				Name: names[i], Limit: f[1], Remaining: f[2], Reset: time.UnixMicro(f[3]).UTC(), Window: windows[2+i],
			})
		}
	}
	return d
}
