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

// PeekSpendCap reports the spend cap of req's tenant as it stands: a
// quota.LimitSpendCap state whose Limit is the cap and Remaining what the
// month's overage may still cost, in cents (rounded down), reset at the
// end of the tenant's billing month; false when req has no cap that
// applies (none, or nothing of its tier bills overage). The month's
// overage cost is the script's: the tier's overage units at its price plus
// the meters' overage (lua/admit.lua, "Meter quotas").
func (r *Runner) PeekSpendCap(ctx context.Context, req quota.Request, now time.Time) (quota.LimitState, bool, error) {
	if err := redisfn.CheckTenant(req.TenantID); err != nil {
		return quota.LimitState{}, false, err
	}
	capCents := req.Limits.MaxOverageCents
	tierBills := req.Overage == quota.OverageBill && req.OveragePriceCentsPer1K > 0
	if capCents == nil || !tierBills && redisfn.SpendCapMillicents(req) < 0 {
		return quota.LimitState{}, false, nil
	}
	// what the cap is checked against, with the function's clock (lua/peek.lua)
	res, err := r.Call(ctx, redisfn.FnSpendPeek, []string{r.StateKey(req.TenantID), r.Key(req.TenantID, "mq")}).StringSlice()
	if err != nil {
		return quota.LimitState{}, false, fmt.Errorf("ratelimit: peek spend cap: %w", err)
	}
	if len(res) != 4 {
		return quota.LimitState{}, false, fmt.Errorf("ratelimit: peek spend cap: script answered %d values, want 4", len(res))
	}
	if now, err = orRedisTime(now, res[0], res[1]); err != nil {
		return quota.LimitState{}, false, fmt.Errorf("ratelimit: peek spend cap: %w", err)
	}
	_, month := redisfn.PeriodIDs(req.Calendar, now)
	var spent int64 // millicents
	if q := strings.Split(res[2], ","); tierBills && len(q) == 8 {
		m, err1 := strconv.ParseInt(q[3], 10, 64)
		mo, err2 := strconv.ParseInt(q[6], 10, 64)
		if err1 != nil || err2 != nil {
			return quota.LimitState{}, false, fmt.Errorf("ratelimit: peek spend cap: state q %q", res[2])
		}
		if m == month {
			spent += mo * req.OveragePriceCentsPer1K
		}
	}
	if c := strings.Split(res[3], ","); len(c) == 2 {
		m, err1 := strconv.ParseInt(c[0], 10, 64)
		mc, err2 := strconv.ParseInt(c[1], 10, 64)
		if err1 != nil || err2 != nil {
			return quota.LimitState{}, false, fmt.Errorf("ratelimit: peek spend cap: meter overage %q", res[3])
		}
		if m == month {
			spent += mc
		}
	}
	start, end := req.Calendar.Period(now)
	return quota.LimitState{Name: quota.LimitSpendCap, Limit: *capCents, Remaining: max(0, *capCents*1000-spent) / 1000,
		Reset: end, Window: end.Sub(start)}, true, nil
}
