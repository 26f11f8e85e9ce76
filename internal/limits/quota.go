package limits

import (
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Quota is d as the rest of Tollgate reads a decision: the active limits
// in the order of the headers (the tier's four, then the meter's), each
// with its window (burst × interval, capacity × interval, the length of
// the day and of the billing month of d's time in l's calendar); the
// refusing limits by name, the policies' excepted (their names are the
// caller's).
func (d Decision) Quota(l *List) quota.Decision {
	now := time.UnixMicro(d.Now).UTC()
	q := quota.Decision{Allowed: d.Allowed, OverageUnits: d.Overage, MeterOverageUnits: d.MeterOverage, Idem: d.Idem, Now: now}
	if !d.Allowed {
		q.RetryAfter = time.Duration(d.Retry) * time.Microsecond
	}
	var windows [nItems]time.Duration
	for _, e := range l.Entries {
		switch e.Kind {
		case Rate:
			windows[ItemBurst] = time.Duration(e.Size*e.Interval) * time.Microsecond
		case Bucket:
			windows[ItemBucket] = time.Duration(e.Size*e.Interval) * time.Microsecond
		}
	}
	ds, de := l.Calendar.Day(now)
	ps, pe := l.Calendar.Period(now)
	windows[ItemDaily], windows[ItemMonthly] = de.Sub(ds), pe.Sub(ps)
	windows[ItemMeterDaily], windows[ItemMeterMonthly] = windows[ItemDaily], windows[ItemMonthly]
	names := [nItems]quota.LimitName{quota.LimitBurst, quota.LimitBucket, quota.LimitDaily, quota.LimitMonthly}
	if meter := l.meterName(); meter != "" {
		names[ItemMeterDaily], names[ItemMeterMonthly] = quota.LimitName(meter+".daily"), quota.LimitName(meter+".monthly")
	}
	bits := [nItems]int64{BitBurst, BitBucket, BitDaily, BitMonthly, BitMeterDaily, BitMeterMonthly}
	for i := range ItemMeterDaily {
		if d.Mask&bits[i] != 0 {
			q.Violated = append(q.Violated, names[i])
		}
	}
	if d.Mask&BitSpendCap != 0 {
		q.Violated = append(q.Violated, quota.LimitSpendCap)
	}
	if d.Mask&BitCredit != 0 {
		q.Violated = append(q.Violated, quota.LimitCredit)
	}
	for i := ItemMeterDaily; i < nItems; i++ {
		if d.Mask&bits[i] != 0 {
			q.Violated = append(q.Violated, names[i])
		}
	}
	for i, it := range d.Items {
		if it.Active {
			q.Limits = append(q.Limits, quota.LimitState{Name: names[i], Limit: it.Limit, Remaining: it.Remaining,
				Reset: time.UnixMicro(it.Reset).UTC(), Window: windows[i]})
		}
	}
	return q
}

// Flat is d as lua/admit.lua answers it (ratelimit's result positions,
// Results): the head, the four limits' items, and, with meter, the
// meter's two items and its overage.
func (d Decision) Flat(meter bool) []int64 {
	out := make([]int64, 0, resultMeterLen)
	out = append(out, b2i(d.Allowed), d.Mask, d.Retry, d.Overage, d.Now, int64(d.Idem))
	n := ItemMeterDaily
	if meter {
		n = nItems
	}
	for _, it := range d.Items[:n] {
		out = append(out, b2i(it.Active), it.Limit, it.Remaining, it.Reset)
	}
	if meter {
		out = append(out, d.MeterOverage)
	}
	return out
}

// decodeFlat reads Flat's answer (22 or 31 values).
func decodeFlat(f []int64) Decision {
	d := Decision{Allowed: f[0] == 1, Mask: f[1], Retry: f[2], Overage: f[3], Now: f[4], Idem: quota.IdemOutcomeOf(f[5])}
	for i := 0; i < nItems && resultHead+4*i+4 <= len(f); i++ {
		g := f[resultHead+4*i:]
		d.Items[i] = Item{Active: g[0] == 1, Limit: g[1], Remaining: g[2], Reset: g[3]}
	}
	if len(f) >= resultMeterLen {
		d.MeterOverage = f[resultMeterLen-1]
	}
	return d
}
