package pending

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// ParsePending turns a pending-usage hash ("<hour unix s>|<meter>|<kind>"
// to counts; kind u units, r requests, x refused, o overage units, s shadow
// refusals, d degraded: lua/admit.lua) into rows ordered by hour and meter.
// Fields it cannot read are returned as an error, never silently dropped:
// they are billing data.
func ParsePending(h map[string]string) ([]quota.PendingRow, error) {
	type key struct {
		hour  int64
		meter string
	}
	rows := map[key]*quota.PendingRow{}
	for f, v := range h {
		parts := strings.Split(f, "|")
		if len(parts) != 3 {
			return nil, fmt.Errorf("ratelimit: pending field %q", f)
		}
		hour, err1 := strconv.ParseInt(parts[0], 10, 64)
		n, err2 := strconv.ParseInt(v, 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("ratelimit: pending field %q = %q", f, v)
		}
		k := key{hour, parts[1]}
		r := rows[k]
		if r == nil {
			r = &quota.PendingRow{Hour: time.Unix(hour, 0).UTC(), Meter: parts[1]}
			rows[k] = r
		}
		switch parts[2] {
		case "u":
			r.Units += n
		case "r":
			r.Requests += n
		case "x":
			r.Rejected += n
		case "o":
			r.Overage += n
		case "s":
			r.ShadowRefused += n
		case "d":
			r.Degraded += n
		case "m":
			r.MeterOverage += n
		default:
			return nil, fmt.Errorf("ratelimit: pending field %q", f)
		}
	}
	out := make([]quota.PendingRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Hour.Equal(out[j].Hour) {
			return out[i].Hour.Before(out[j].Hour)
		}
		return out[i].Meter < out[j].Meter
	})
	return out, nil
}

// Pending returns the tenant's usage counted in Redis and not yet flushed.
func (r *Usage) Pending(ctx context.Context, tenantID string) ([]quota.PendingRow, error) {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return nil, err
	}
	flat, err := r.Call(ctx, redisfn.FnPending, r.PendingKeys(tenantID), "get").StringSlice()
	if err != nil {
		return nil, fmt.Errorf("ratelimit: pending: %w", err)
	}
	return ParsePending(pairs(flat))
}

// pairs turns a flat field, value list into a map.
func pairs(flat []string) map[string]string {
	h := make(map[string]string, len(flat)/2)
	for j := 0; j+1 < len(flat); j += 2 {
		h[flat[j]] = flat[j+1]
	}
	return h
}

// PendingMany returns the pending usage of each tenant of ids, in one
// pipelined round trip (the dashboard's tenant list). Tenants with nothing
// pending are absent from the map.
func (r *Usage) PendingMany(ctx context.Context, ids []string) (map[string][]quota.PendingRow, error) {
	for _, id := range ids {
		if err := redisfn.CheckTenant(id); err != nil {
			return nil, err
		}
	}
	cmds, err := r.Pipelined(ctx, len(ids), func(i int) (redisfn.Fn, []string, []any) {
		return redisfn.FnPending, r.PendingKeys(ids[i]), []any{"get"}
	})
	if err != nil {
		return nil, fmt.Errorf("ratelimit: pending: %w", err)
	}
	out := make(map[string][]quota.PendingRow, len(ids))
	for i, id := range ids {
		flat, err := cmds[i].StringSlice()
		if err != nil {
			return nil, fmt.Errorf("ratelimit: pending: %w", err)
		}
		rows, err := ParsePending(pairs(flat))
		if err != nil {
			return nil, err
		}
		if len(rows) > 0 {
			out[id] = rows
		}
	}
	return out, nil
}

// Refund gives back cost units (and the overage units among them) of a
// request admitted at time at, whose upstream failed: see lua/refund.lua.
// The day and month are those of the default calendar: RefundIn takes the
// tenant's.
func (r *Usage) Refund(ctx context.Context, tenantID, meter string, cost, overage int64, at time.Time) error {
	return r.RefundIn(ctx, tenantID, meter, quota.Calendar{}, cost, overage, at)
}

// RefundIn is Refund for a tenant whose billing calendar is cal: the
// counters are given back while they are still those of at's local day
// and billing month.
func (r *Usage) RefundIn(ctx context.Context, tenantID, meter string, cal quota.Calendar, cost, overage int64, at time.Time) error {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return err
	}
	return r.refund(ctx, tenantID, meter, cal, cost, overage, at, nil, -1, "", 0)
}

// RefundRequest gives back the units of req, admitted by d, whose upstream
// failed: RefundIn with req's calendar, and, when req's meter has a quota
// (quota.MeterQuota), that quota's units too, with the meter overage d
// admitted (see lua/refund.lua).
func (r *Usage) RefundRequest(ctx context.Context, req quota.Request, d quota.Decision) error {
	if err := redisfn.CheckTenant(req.TenantID); err != nil {
		return err
	}
	q := quota.MeterQuotaFor(req.MeterQuotas, req.Meter)
	price := int64(-1)
	if q != nil && q.Bills() && redisfn.SpendCapMillicents(req) >= 0 {
		price = q.OveragePriceCentsPer1K // the spend cap counts the meters' overage
	}
	pp := ""
	if req.Prepaid != nil && req.Overage == quota.OverageBill {
		mp := int64(0)
		if q != nil && q.Bills() {
			mp = q.OveragePriceCentsPer1K
		}
		pp = strconv.FormatInt(req.OveragePriceCentsPer1K, 10) + "," + strconv.FormatInt(mp, 10)
	}
	return r.refund(ctx, req.TenantID, req.Meter, req.Calendar, req.Cost, d.OverageUnits, d.Now, q, price, pp, d.MeterOverageUnits)
}

// refund runs refund (lua/refund.lua); q, when not nil, is the meter's
// quota, and price its overage price when the spend cap counts it (else
// -1); pp, for a prepaid tenant, the tier's and the meter's overage prices
// (ARGV[8]);
// mover the meter overage units the admission took.
func (r *Usage) refund(ctx context.Context, tenantID, meter string, cal quota.Calendar, cost, overage int64, at time.Time,
	q *quota.MeterQuota, price int64, pp string, mover int64) error {
	day, month := redisfn.PeriodIDs(cal, at)
	keys := r.StateKeys(tenantID, "pending")
	args := []any{day, month, at.Truncate(time.Hour).Unix(), meter, cost, overage}
	if q != nil || pp != "" {
		hasQuota := 0 // (refund.lua's ARGV[10])
		if q != nil {
			hasQuota = 1
		}
		keys = append(keys, r.Key(tenantID, "mq"))
		args = append(args, price, pp, mover, hasQuota)
	}
	if err := r.Call(ctx, redisfn.FnRefund, keys, args...).Err(); err != nil {
		return fmt.Errorf("ratelimit: refund: %w", err)
	}
	r.MarkActive(tenantID)
	return nil
}
