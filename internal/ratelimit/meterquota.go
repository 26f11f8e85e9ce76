package ratelimit

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// PeekMeterQuotas reports the tenant's meter quotas qs as they stand, in
// their order: for each, its "<meter>.daily" and "<meter>.monthly" limits
// that are set, with the room left in the current day and month of the
// tenant's billing calendar cal (Redis time, or now when it is not zero).
// It consumes and counts nothing.
func (r *Runner) PeekMeterQuotas(ctx context.Context, tenantID string, cal quota.Calendar, qs []quota.MeterQuota, now time.Time) ([]quota.LimitState, error) {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return nil, err
	}
	if len(qs) == 0 {
		return nil, nil
	}
	args := make([]any, len(qs))
	for i, q := range qs {
		args[i] = q.Meter
	}
	// the hash with the function's clock (lua/peek.lua)
	res, err := r.Call(ctx, redisfn.FnMeterPeek, []string{r.Key(tenantID, "mq")}, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("ratelimit: peek meter quotas: %w", err)
	}
	if len(res) != 2+len(qs) {
		return nil, fmt.Errorf("ratelimit: peek meter quotas: script answered %d values, want %d", len(res), 2+len(qs))
	}
	if now, err = orRedisTime(now, res[0], res[1]); err != nil {
		return nil, fmt.Errorf("ratelimit: peek meter quotas: %w", err)
	}
	dayID, monthID := redisfn.PeriodIDs(cal, now)
	dayStart, dayEnd := cal.Day(now)
	monthStart, monthEnd := cal.Period(now)
	var out []quota.LimitState
	for i, q := range qs {
		var du, mu int64
		if f := res[2+i]; f != "" {
			v, err := parseMeterField(f)
			if err != nil {
				return nil, fmt.Errorf("ratelimit: peek meter quotas: %s: %w", q.Meter, err)
			}
			if v[0] == dayID {
				du = v[1]
			}
			if v[2] == monthID {
				mu = v[3]
			}
		}
		daily, monthly := q.Names()
		if q.DailyQuota != nil {
			out = append(out, quota.LimitState{Name: daily, Limit: *q.DailyQuota, Remaining: max(0, *q.DailyQuota-du),
				Reset: dayEnd, Window: dayEnd.Sub(dayStart)})
		}
		if q.MonthlyQuota != nil {
			out = append(out, quota.LimitState{Name: monthly, Limit: *q.MonthlyQuota, Remaining: max(0, *q.MonthlyQuota-mu),
				Reset: monthEnd, Window: monthEnd.Sub(monthStart)})
		}
	}
	return out, nil
}

// orRedisTime is now, or when it is zero the Redis TIME a peek script
// answered (seconds and microseconds), in UTC.
func orRedisTime(now time.Time, sec, usec string) (time.Time, error) {
	if now.IsZero() {
		s, err1 := strconv.ParseInt(sec, 10, 64)
		us, err2 := strconv.ParseInt(usec, 10, 64)
		if err1 != nil || err2 != nil {
			return now, fmt.Errorf("TIME %q %q", sec, usec)
		}
		now = time.Unix(s, us*1000)
	}
	return now.UTC(), nil
}

// parseMeterField reads a meter's field "d,du,m,mu,mo" of the meter quota
// hash.
func parseMeterField(f string) ([5]int64, error) {
	var v [5]int64
	parts := strings.Split(f, ",")
	if len(parts) != 5 {
		return v, fmt.Errorf("field %q", f)
	}
	for i, p := range parts {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return v, fmt.Errorf("field %q", f)
		}
		v[i] = n
	}
	return v, nil
}
