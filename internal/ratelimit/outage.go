package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// outageArgs is how many ARGV one row of outage (lua/outage.lua) takes.
const outageArgs = 11

// RecoverOutage records the usage an API node admitted in process while
// Redis was away (lua/outage.lua): the tenant's day and month counters and
// meter quotas take its units (those of its rows' day and month: the
// state's, or the month before it, never a later one), the units past the
// month's quotas are overage (up to that month's spend cap), and its
// pending usage gets units, requests and overage, for the worker to flush
// into the ledger. The
// batch is applied once under b.ID: a second call with the same id
// changes nothing. On success the rows' Overage and MeterOverage hold
// what was counted (those of the first call, for a repeat). An error that
// wraps quota.ErrNotSent never reached Redis; any other may hide a call
// that was applied, and must be retried with the same id.
func (r *Runner) RecoverOutage(ctx context.Context, b *quota.OutageBatch) error {
	req := b.Request
	if err := redisfn.CheckTenant(req.TenantID); err != nil {
		return err
	}
	if err := checkBatchID(b.ID); err != nil {
		return err
	}
	if len(b.Rows) == 0 || len(b.Rows) > quota.MaxOutageRows {
		return quota.FieldError("rows", "must be 1 to %d", quota.MaxOutageRows)
	}
	bill, mq, tprice := "0", int64(-1), int64(0)
	if req.Overage == quota.OverageBill {
		bill, tprice = "1", req.OveragePriceCentsPer1K
	}
	if req.Limits.MonthlyQuota != nil {
		mq = *req.Limits.MonthlyQuota
	}
	cal := "0"
	if !req.Calendar.IsDefault() {
		cal = "1"
	}
	args := make([]any, 0, 1+outageArgs*len(b.Rows))
	// (the spend cap whenever the tier has one: outage.lua bounds billed
	// overage by it, tier's and meters' alike, as admit.lua does with
	// ARGV[18] and settle.lua with a settle entry's)
	args = append(args, bill+","+strconv.FormatInt(mq, 10)+","+strconv.FormatInt(tprice, 10)+","+
		strconv.FormatInt(redisfn.CapMillicents(req), 10)+","+cal)
	for _, row := range b.Rows {
		if n := len(row.Meter); n == 0 || n > maxMeterLen || strings.Contains(row.Meter, "|") {
			return quota.FieldError("meter", "must be 1 to %d characters without '|'", maxMeterLen)
		}
		_, dayEnd := req.Calendar.Day(row.At)
		_, periodEnd := req.Calendar.Period(row.At)
		day, month := redisfn.PeriodIDs(req.Calendar, row.At)
		give := [2]int64{}
		if row.Units < 0 {
			give = [2]int64{max(row.Overage, 0), max(row.MeterOverage, 0)}
		}
		args = append(args, row.Hour.Truncate(time.Hour).Unix(), row.Meter, day, dayEnd.Unix(), month, periodEnd.Unix(),
			row.Units, row.Requests, outageMeterSpec(req, row.Meter), give[0], give[1])
	}
	keys := r.StateKeys(req.TenantID, "pending", "mq", "outage:"+b.ID)
	res, err := r.Call(ctx, redisfn.FnOutage, keys, args...).Int64Slice()
	if err != nil {
		if notSent(err) {
			err = errors.Join(quota.ErrNotSent, err)
		}
		return fmt.Errorf("ratelimit: recover outage usage: %w", err)
	}
	for i := range b.Rows {
		b.Rows[i].Overage, b.Rows[i].MeterOverage = 0, 0
		if j := 1 + 2*i; j+1 < len(res) {
			b.Rows[i].Overage, b.Rows[i].MeterOverage = res[j], res[j+1]
		}
	}
	r.MarkActive(req.TenantID)
	return nil
}

// outageMeterSpec is outage.lua's meter quota of a row: '-' for none, else
// "<monthly quota, -1 none>,<overage price, -1 not billed>".
func outageMeterSpec(req quota.Request, meter string) string {
	q := quota.MeterQuotaFor(req.MeterQuotas, meter)
	if q == nil {
		return "-"
	}
	mq, price := int64(-1), int64(-1)
	if q.MonthlyQuota != nil {
		mq = *q.MonthlyQuota
	}
	if q.Bills() {
		price = q.OveragePriceCentsPer1K
	}
	return strconv.FormatInt(mq, 10) + "," + strconv.FormatInt(price, 10)
}

// checkBatchID bounds a batch id used in a key.
func checkBatchID(id string) error {
	if id == "" || len(id) > 64 {
		return quota.FieldError("batch_id", "must be 1 to 64 characters")
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'z') && c != '-' {
			return quota.FieldError("batch_id", "must be of 0-9, a-z and -")
		}
	}
	return nil
}

// notSent reports whether err is one of a call that never reached Redis:
// no connection could be made (a dial failed, the pool had none to give,
// the client is closed).
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed)
}
