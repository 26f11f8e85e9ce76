package ratelimit

import (
	"context"
	"fmt"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// ResetQuotas empties the tenant's day and month counters (their used
// units; grants stay, and so does the month's overage, which the spend
// cap keeps bounding) for a tier change with quota reset
// made at at, which names the reset: the day and month of at are emptied
// if they are still the counters' current ones, and a reset is applied
// once however often it is sent (lua/reset.lua keeps the latest stamp), so
// that a retry never empties usage counted since. It reports whether the
// counters hold the reset (now or before); false means there was nothing
// to empty (no state, or its periods are later ones).
//
// The day and month are those of the default calendar: ResetQuotasIn
// takes the tenant's.
func (r *Runner) ResetQuotas(ctx context.Context, tenantID string, at time.Time) (bool, error) {
	return r.ResetQuotasIn(ctx, tenantID, quota.Calendar{}, at)
}

// ResetQuotasIn is ResetQuotas for a tenant whose billing calendar is cal:
// the local day and billing month of at are emptied.
func (r *Runner) ResetQuotasIn(ctx context.Context, tenantID string, cal quota.Calendar, at time.Time) (bool, error) {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return false, err
	}
	if at.UnixMicro() <= 0 {
		return false, quota.FieldError("at", "must be after 1970-01-01")
	}
	day, month := redisfn.PeriodIDs(cal, at)
	res, err := r.Call(ctx, redisfn.FnReset, r.StateKeys(tenantID, "mq"), 0, at.UnixMicro(), day, month).Int64Slice()
	if err != nil {
		return false, fmt.Errorf("ratelimit: reset: %w", err)
	}
	if len(res) != 4 {
		return false, fmt.Errorf("ratelimit: reset: script answered %d values, want 4", len(res))
	}
	return res[0] >= 0, nil
}
