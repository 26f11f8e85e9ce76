package billing

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/ratelimit"
)

// chunk is how many tenants one Redis pipeline and one Postgres transaction
// carry.
const chunk = 500

// Reconciler moves usage counted in Redis into the usage ledger, exactly
// once, and repairs Redis' quota counters after Redis lost data.
//
// Exactly once: a tenant's pending usage is claimed in Redis as a batch with
// an id (lua/claim.lua); the batch id is inserted into usage_batches in the
// same transaction as the batch's usage rows, and only a batch whose id was
// new adds its rows; the batch is dropped from Redis only after the commit
// (lua/finish.lua). A crash between any two steps leaves the batch in
// flight, and the next cycle (of this or another worker) flushes that same
// batch again, which Postgres then counts once. Two workers claiming the
// same tenant get the same batch.
type Reconciler struct {
	db  *pgxpool.Pool
	rl  *ratelimit.Runner
	now func() time.Time
	log *slog.Logger
	// SweepEvery is how often the keyspace is scanned for tenants no API
	// node reported (their node died first).
	SweepEvery time.Duration
	lastSweep  time.Time

	// hook, in tests, runs between the steps of a flush; an error stops the
	// flush there, as a crash would.
	hook func(step string) error

	// Counters for the worker's metrics.
	TenantsFlushed, UnitsFlushed, Batches atomic.Int64

	flushedMu sync.Mutex
	flushed   map[string]struct{} // tenants recorded since the last TakeFlushed
}

// TakeFlushed returns the tenants whose usage was recorded since the last
// call (the invoices step refreshes their drafts).
func (r *Reconciler) TakeFlushed() []string {
	r.flushedMu.Lock()
	defer r.flushedMu.Unlock()
	out := make([]string, 0, len(r.flushed))
	for id := range r.flushed {
		out = append(out, id)
	}
	r.flushed = nil
	return out
}

// NewReconciler returns a Reconciler on the ledger db and the Redis runner rl.
func NewReconciler(db *pgxpool.Pool, rl *ratelimit.Runner, now func() time.Time, log *slog.Logger) *Reconciler {
	return &Reconciler{db: db, rl: rl, now: now, log: log, SweepEvery: 5 * time.Minute, hook: func(string) error { return nil }}
}

// Flush flushes every tenant reported active (and, every SweepEvery, every
// tenant with usage left in Redis). Its work grows with the tenants active
// since the last cycle, not with all tenants.
func (r *Reconciler) Flush(ctx context.Context) error {
	ids, err := r.rl.ActiveTenants(ctx)
	if err != nil {
		return err
	}
	if now := r.now(); now.Sub(r.lastSweep) >= r.SweepEvery {
		swept, err := r.rl.SweepTenants(ctx)
		if err != nil {
			return err
		}
		ids = union(ids, swept)
		r.lastSweep = now
	}
	for start := 0; start < len(ids); start += chunk {
		end := min(start+chunk, len(ids))
		if err := r.flushChunk(ctx, ids[start:end]); err != nil {
			return err
		}
	}
	return nil
}

func union(a, b []string) []string {
	seen := make(map[string]struct{}, len(a)+len(b))
	out := make([]string, 0, len(a)+len(b))
	for _, s := range append(a, b...) {
		if _, ok := seen[s]; !ok {
			seen[s] = struct{}{}
			out = append(out, s)
		}
	}
	return out
}

// flushChunk flushes the tenants' usage. A tenant whose claim resumed a
// batch left in flight gets a second claim in the same cycle, so its newer
// pending usage does not wait for another cycle.
func (r *Reconciler) flushChunk(ctx context.Context, ids []string) error {
	for round := 0; len(ids) > 0 && round < 3; round++ {
		resumed, err := r.flushOnce(ctx, ids)
		if err != nil {
			return err
		}
		ids = resumed
	}
	return nil
}

func (r *Reconciler) flushOnce(ctx context.Context, ids []string) (resumed []string, err error) {
	batches, err := r.rl.Claim(ctx, ids)
	if err != nil {
		return nil, err
	}
	for _, b := range batches {
		if b.Resumed {
			resumed = append(resumed, b.TenantID)
		}
	}
	if err := r.hook("claimed"); err != nil {
		return nil, err
	}
	if len(batches) > 0 {
		if err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error { return r.record(ctx, tx, batches) }); err != nil {
			return nil, err
		}
		r.flushedMu.Lock()
		if r.flushed == nil {
			r.flushed = map[string]struct{}{}
		}
		for _, b := range batches {
			r.flushed[b.TenantID] = struct{}{}
		}
		r.flushedMu.Unlock()
		if err := r.hook("committed"); err != nil {
			return nil, err
		}
		if err := r.rl.Finish(ctx, batches); err != nil {
			return nil, err
		}
		if err := r.hook("finished"); err != nil {
			return nil, err
		}
	}
	return resumed, r.rl.Done(ctx, ids)
}

// record inserts the batches' ids and, for the ids that are new, their usage
// rows; then writes the threshold crossings those rows cause to the alerts
// outbox. All in the caller's transaction.
func (r *Reconciler) record(ctx context.Context, tx pgx.Tx, batches []ratelimit.Batch) error {
	var (
		bIDs, bTenants            []string
		bUnits, bRequests         []int64
		rBatch, rTenant, rMeter   []string
		rHour                     []time.Time
		rUnits, rReq, rRej, rOver []int64
		units                     int64
	)
	for _, b := range batches {
		tenant := b.TenantID
		if !validUUID(tenant) {
			// Recorded as flushed (so it is not retried forever) under the
			// zero id; its rows are dropped.
			r.log.Warn("pending usage of a tenant id that is no UUID, dropped", "tenant_id", tenant, "batch", b.ID)
			tenant = "00000000-0000-0000-0000-000000000000"
		}
		var u, q int64
		for _, row := range b.Rows {
			u += row.Units
			q += row.Requests
			rBatch = append(rBatch, b.ID)
			rTenant = append(rTenant, tenant)
			rHour = append(rHour, row.Hour)
			rMeter = append(rMeter, row.Meter)
			rUnits, rReq = append(rUnits, row.Units), append(rReq, row.Requests)
			rRej, rOver = append(rRej, row.Rejected), append(rOver, row.Overage)
		}
		bIDs, bTenants = append(bIDs, b.ID), append(bTenants, tenant)
		bUnits, bRequests = append(bUnits, max(u, 0)), append(bRequests, max(q, 0))
		units += u
	}
	// Batches of tenants deleted meanwhile (or malformed ids) are recorded
	// as flushed so they are not retried forever; their rows are dropped.
	tag, err := tx.Exec(ctx, `
		WITH new AS (
			INSERT INTO usage_batches (batch_id, tenant_id, units, requests)
			SELECT b.id, b.tenant, b.units, b.requests
			FROM unnest($1::text[], $2::uuid[], $3::bigint[], $4::bigint[]) AS b(id, tenant, units, requests)
			ON CONFLICT (batch_id) DO NOTHING
			RETURNING batch_id
		)
		INSERT INTO usage AS u (tenant_id, hour, meter, units, requests, rejected, overage_units)
		SELECT t.id, r.hour, r.meter, sum(r.units), sum(r.requests), sum(r.rejected), sum(r.overage)
		FROM unnest($5::text[], $6::uuid[], $7::timestamptz[], $8::text[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[])
		     AS r(batch, tenant, hour, meter, units, requests, rejected, overage)
		JOIN new ON new.batch_id = r.batch
		JOIN tenants t ON t.id = r.tenant
		GROUP BY t.id, r.hour, r.meter
		ON CONFLICT (tenant_id, hour, meter) DO UPDATE SET
			units = u.units + EXCLUDED.units, requests = u.requests + EXCLUDED.requests,
			rejected = u.rejected + EXCLUDED.rejected, overage_units = u.overage_units + EXCLUDED.overage_units`,
		bIDs, bTenants, bUnits, bRequests, rBatch, rTenant, rHour, rMeter, rUnits, rReq, rRej, rOver)
	if err != nil {
		return fmt.Errorf("billing: record usage: %w", err)
	}
	if err := r.recordCrossings(ctx, tx, bTenants); err != nil {
		return err
	}
	r.Batches.Add(int64(len(batches)))
	r.TenantsFlushed.Add(int64(len(batches)))
	if tag.RowsAffected() > 0 {
		r.UnitsFlushed.Add(units)
	}
	return nil
}

// recordCrossings writes an alert for every tenant among ids whose usage
// this month reached 80 % or 100 % of its monthly quota (tier or override,
// plus the month's grants), once per tenant, threshold and month.
func (r *Reconciler) recordCrossings(ctx context.Context, tx pgx.Tx, ids []string) error {
	month := quota.MonthStart(r.now())
	_, err := tx.Exec(ctx, `
		WITH q AS (
			SELECT t.id,
			       CASE WHEN t.overrides ? 'monthly_quota' THEN (t.overrides->>'monthly_quota')::bigint
			            ELSE tr.monthly_quota END
			       + coalesce((SELECT sum(g.units) FROM grants g WHERE g.tenant_id = t.id
			                   AND g.period = 'month' AND g.period_start = $2::date), 0) AS quota
			FROM tenants t JOIN tiers tr ON tr.slug = t.tier
			WHERE t.id = ANY($1::uuid[])
		), used AS (
			SELECT q.id, q.quota, coalesce(sum(u.units), 0)::bigint AS units
			FROM q LEFT JOIN usage u ON u.tenant_id = q.id AND u.hour >= $2 AND u.hour < $3
			WHERE q.quota IS NOT NULL AND q.quota > 0
			GROUP BY q.id, q.quota
		)
		INSERT INTO alerts (tenant_id, period, threshold, units, quota)
		SELECT used.id, $2::date, th.pct, used.units, used.quota
		FROM used CROSS JOIN (VALUES (80), (100)) AS th(pct)
		WHERE used.units * 100 >= used.quota * th.pct
		ON CONFLICT (tenant_id, period, threshold) DO NOTHING`,
		ids, month, month.AddDate(0, 1, 0))
	if err != nil {
		return fmt.Errorf("billing: record crossings: %w", err)
	}
	return nil
}

// Repair restores the quota counters of every tenant with usage or grants
// this month when Redis lost its data, from the ledger plus what is still
// pending in Redis. Usage admitted during the last interval before the loss
// and not yet flushed is gone from billing, at most one interval's worth.
func (r *Reconciler) Repair(ctx context.Context) error {
	lost, err := r.rl.EpochLost(ctx)
	if err != nil || !lost {
		return err
	}
	now := r.now().UTC()
	day, month := quota.DayStart(now), quota.MonthStart(now)
	r.log.Warn("redis lost its data (or this is the first start): restoring quota counters from the ledger")
	rows, err := r.db.Query(ctx, `
		WITH u AS (
			SELECT tenant_id,
			       coalesce(sum(units) FILTER (WHERE hour >= $2), 0)::bigint AS day_units,
			       sum(units)::bigint AS month_units
			FROM usage WHERE hour >= $1 AND hour < $3 GROUP BY tenant_id
		), g AS (
			SELECT tenant_id,
			       coalesce(sum(units) FILTER (WHERE period = 'day' AND period_start = $2::date), 0)::bigint AS day_grant,
			       coalesce(sum(units) FILTER (WHERE period = 'month' AND period_start = $1::date), 0)::bigint AS month_grant
			FROM grants WHERE period_start >= $1::date GROUP BY tenant_id
		)
		SELECT coalesce(u.tenant_id, g.tenant_id)::text, coalesce(u.day_units, 0), coalesce(u.month_units, 0),
		       coalesce(g.day_grant, 0), coalesce(g.month_grant, 0)
		FROM u FULL JOIN g ON g.tenant_id = u.tenant_id`, month, day, month.AddDate(0, 1, 0))
	if err != nil {
		return fmt.Errorf("billing: repair: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ratelimit.Recorded, error) {
		var rec ratelimit.Recorded
		return rec, row.Scan(&rec.TenantID, &rec.DayUnits, &rec.MonthUnits, &rec.DayGrant, &rec.MonthGrant)
	})
	if err != nil {
		return fmt.Errorf("billing: repair: %w", err)
	}
	for start := 0; start < len(recs); start += chunk {
		if err := r.rl.Restore(ctx, now, recs[start:min(start+chunk, len(recs))]); err != nil {
			return err
		}
	}
	r.log.Info("quota counters restored", "tenants", len(recs))
	return nil
}

func validUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return false
			}
		} else if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}
