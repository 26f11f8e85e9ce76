package settlement

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// settleKey holds a reservation of a settle route, under the tenant's hash
// tag (settle.lua reads it atomically with the tenant's state).
func (r *Settler) settleKey(tenantID, requestID string) string {
	return r.Key(tenantID, "settle:"+requestID)
}

// checkRequestID bounds a request id used in keys.
func checkRequestID(id string) error {
	if id == "" || len(id) > 128 {
		return quota.FieldError("request_id", "must be 1 to 128 characters")
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c >= 0x7f {
			return quota.FieldError("request_id", "must be printable ASCII without spaces")
		}
	}
	return nil
}

// Reserve records the reservation of req, admitted by d on a route with
// settle: true, under requestID (random: the API answers it in
// Tollgate-Request-Id) and req's tenant, for quota.SettleWindow: its
// meter, cost, the admission's hour, day and month (ids of req.Calendar)
// and its overage units, which Settle needs to apply a difference. It is
// one round trip beside the admission, made only for settle routes. The
// entry is found by the tenant and the id together: a settle naming
// another tenant finds nothing. (Nodes before this version also wrote an
// index naming the tenant by the id alone, <prefix>:v1:settle:{r:<id>},
// which this version neither writes nor reads: it expires with its
// entry.)
func (r *Settler) Reserve(ctx context.Context, requestID string, req quota.Request, d quota.Decision) error {
	if err := redisfn.CheckTenant(req.TenantID); err != nil {
		return err
	}
	if err := checkRequestID(requestID); err != nil {
		return err
	}
	at := d.Now.UTC()
	day, month := redisfn.PeriodIDs(req.Calendar, at)
	bill, mq := 0, int64(-1)
	if req.Overage == quota.OverageBill {
		bill = 1
	}
	if req.Limits.MonthlyQuota != nil {
		mq = *req.Limits.MonthlyQuota
	}
	entry := strconv.FormatInt(req.Cost, 10) + "|" + strconv.FormatInt(at.Truncate(time.Hour).Unix(), 10) + "|" +
		strconv.FormatInt(day, 10) + "|" + strconv.FormatInt(month, 10) + "|" +
		strconv.FormatInt(d.OverageUnits, 10) + "|" + strconv.Itoa(bill) + "|" + strconv.FormatInt(mq, 10) + "|" +
		settleMoney(req, d) + "|" + req.Meter
	if err := r.Client().Set(ctx, r.settleKey(req.TenantID, requestID), entry, quota.SettleWindow).Err(); err != nil {
		return fmt.Errorf("ratelimit: reserve: %w", err)
	}
	return nil
}

// settleMoney is the settle entry's money (lua/settle.lua): "-" when
// req's meter has no quota, the tenant is postpaid and the tier has no
// spend cap; else its meter's quota, price and whether the cap counts the
// meters' overage, the meter overage units d admitted, a prepaid tenant's
// tier overage price (whose credit draws the difference's overage too),
// and the spend cap in millicents with the tier's overage price (a
// charge's overage is billed within the cap's room).
func settleMoney(req quota.Request, d quota.Decision) string {
	q := quota.MeterQuotaFor(req.MeterQuotas, req.Meter)
	capm := redisfn.CapMillicents(req)
	if q == nil && req.Prepaid == nil && capm < 0 {
		return "-"
	}
	hasq, mq, price, capped := "0", int64(-1), int64(-1), "0"
	if q != nil {
		hasq = "1"
		if q.MonthlyQuota != nil {
			mq = *q.MonthlyQuota
		}
		if q.Bills() {
			price = q.OveragePriceCentsPer1K
			if redisfn.SpendCapMillicents(req) >= 0 {
				capped = "1"
			}
		}
	}
	tpp, tprice := int64(-1), int64(0)
	if req.Overage == quota.OverageBill {
		tprice = req.OveragePriceCentsPer1K
		if req.Prepaid != nil {
			tpp = tprice
		}
	}
	return hasq + "," + strconv.FormatInt(mq, 10) + "," + strconv.FormatInt(price, 10) + "," + capped + "," +
		strconv.FormatInt(d.MeterOverageUnits, 10) + "," + strconv.FormatInt(tpp, 10) + "," +
		strconv.FormatInt(capm, 10) + "," + strconv.FormatInt(tprice, 10)
}

// Settle settles the reservation under requestID to actual units
// (0..quota.MaxQuantity) exactly once, in one atomic script run
// (lua/settle.lua): the first call applies actual - cost (a refund or a
// charge that may pass the quota); later calls, from any node, and calls
// after quota.SettleWindow change nothing and say so.
func (r *Settler) Settle(ctx context.Context, tenantID, requestID string, actual int64) (quota.Settlement, error) {
	return r.settle(ctx, tenantID, requestID, actual, settledMark)
}

// RefundReserved refunds a reserved request whole, exactly once: a settle
// to 0 that marks the entry refunded, so that a later settle or refund
// answers SettleRefunded and changes nothing.
func (r *Settler) RefundReserved(ctx context.Context, tenantID, requestID string) (quota.Settlement, error) {
	return r.settle(ctx, tenantID, requestID, 0, refundedMark)
}

// The marks a settle entry is left with (lua/settle.lua's ARGV[2]).
const (
	settledMark  = "done"
	refundedMark = "refunded"
)

func (r *Settler) settle(ctx context.Context, tenantID, requestID string, actual int64, mark string) (quota.Settlement, error) {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return quota.Settlement{}, err
	}
	if err := checkRequestID(requestID); err != nil {
		return quota.Settlement{}, err
	}
	if actual < 0 || actual > quota.MaxQuantity {
		return quota.Settlement{}, quota.FieldError("actual_cost", "must be an integer between 0 and %d", quota.MaxQuantity)
	}
	keys := r.StateKeys(tenantID, "pending", "settle:"+requestID, "mq")
	res, err := r.Call(ctx, redisfn.FnSettle, keys, actual, mark).Int64Slice()
	if err != nil {
		return quota.Settlement{}, fmt.Errorf("ratelimit: settle: %w", err)
	}
	if len(res) != 3 {
		return quota.Settlement{}, fmt.Errorf("ratelimit: settle: script answered %d values, want 3", len(res))
	}
	switch res[0] {
	case 1:
		if res[1] != 0 {
			r.MarkActive(tenantID)
		}
		return quota.Settlement{Status: quota.SettleApplied, Delta: res[1], OverageDelta: res[2]}, nil
	case -1:
		return quota.Settlement{Status: quota.SettleAlready}, nil
	case -2:
		return quota.Settlement{Status: quota.SettleRefunded}, nil
	}
	return quota.Settlement{Status: quota.SettleUnknown}, nil
}

// Hold records the concurrency leases a reserved request holds (value, as
// admission.Gate encodes them) until TakeHold or ttl, the longest of their
// leases.
func (r *Settler) Hold(ctx context.Context, tenantID, requestID, value string, ttl time.Duration) error {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return err
	}
	if err := checkRequestID(requestID); err != nil {
		return err
	}
	if err := r.Client().Set(ctx, r.Key(tenantID, "hold:"+requestID), value, ttl).Err(); err != nil {
		return fmt.Errorf("ratelimit: hold: %w", err)
	}
	return nil
}

// TakeHold reads and removes, atomically, what Hold recorded: the first
// of concurrent calls gets it, the others none.
func (r *Settler) TakeHold(ctx context.Context, tenantID, requestID string) (string, bool, error) {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return "", false, err
	}
	if err := checkRequestID(requestID); err != nil {
		return "", false, err
	}
	v, err := r.Client().GetDel(ctx, r.Key(tenantID, "hold:"+requestID)).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("ratelimit: take hold: %w", err)
	}
	return v, true, nil
}

// noteRequestID writes a request id into an idempotency record that
// exists (never makes one: it would have no expiry).
var noteRequestID = redis.NewScript(`if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('HSET', KEYS[1], 'rid', ARGV[1]) end return 0`)

// NoteRequestID records, in the idempotency record of a counted check
// (key), the request id it was reserved under, so that a repeat of the
// key answers the same id.
func (r *Settler) NoteRequestID(ctx context.Context, tenantID, key, requestID string) error {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return err
	}
	if err := checkRequestID(requestID); err != nil {
		return err
	}
	if err := noteRequestID.Run(ctx, r.Client(), []string{r.Key(tenantID, "idem2:"+redisfn.IdemHash(key))}, requestID).Err(); err != nil {
		return fmt.Errorf("ratelimit: note request id: %w", err)
	}
	return nil
}

// RequestIDOf reads what NoteRequestID wrote for key: "" when nothing.
func (r *Settler) RequestIDOf(ctx context.Context, tenantID, key string) (string, error) {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return "", err
	}
	v, err := r.Client().HGet(ctx, r.Key(tenantID, "idem2:"+redisfn.IdemHash(key)), "rid").Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("ratelimit: read request id: %w", err)
	}
	return v, nil
}
