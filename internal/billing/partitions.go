package billing

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/quota"
)

// PartitionsAhead is how many months after the current one Partitions
// keeps a usage partition ready for.
const PartitionsAhead = 2

// partitionsLock is the advisory lock that lets one worker at a time
// create or drop usage partitions.
const partitionsLock = 0x7467_7573_6167_6570 // "tgusagep"

// Partitions keeps the usage ledger's monthly partitions (migration
// 000016): the current month's and the next PartitionsAhead months' exist
// before any usage reaches them, and, with a retention, the hourly detail
// of the months past it is rolled up into usage_monthly (one row per
// tenant, meter and month) and dropped, in one transaction, so that every
// unit stays in exactly one of the two tables.
//
// A row whose month has no partition (late usage of a month already
// dropped, a clock far ahead) lands in usage_default: a partition created
// later takes that month's rows from it, and the retention rolls up the
// default's rows past it like a partition's.
type Partitions struct {
	db  *pgxpool.Pool
	now func() time.Time
	// retention is the months of hourly detail kept before the current
	// month; 0 keeps all.
	retention int

	mu       sync.Mutex
	doneHour time.Time // the hour of the last Run that did everything
}

// NewPartitions returns a Partitions on db that reads the time from now and
// keeps the hourly detail of the current month and the retentionMonths
// months before it (0: every month, forever).
func NewPartitions(db *pgxpool.Pool, now func() time.Time, retentionMonths int) *Partitions {
	return &Partitions{db: db, now: now, retention: max(retentionMonths, 0)}
}

// usageFillfactor is the fill factor of every usage partition (migration
// 000018 sets it on those made before): a row of the current hour is
// updated by every flush of its tenant, and the room left on its page lets
// each update stay HOT (a new version on the same page, no index entry).
const usageFillfactor = "70"

// PartitionName is the name of the usage partition of the UTC month
// containing month: usage_pYYYYMM.
func PartitionName(month time.Time) string {
	return "usage_p" + month.UTC().Format("200601")
}

// Run is one idempotent worker step: it creates the partitions missing
// from the current month to PartitionsAhead months ahead, then rolls up
// and drops the months past the retention. It does the work at most once
// an hour (by the injected clock); other calls return at once.
func (p *Partitions) Run(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UTC()
	hour := now.Truncate(time.Hour)
	if hour.Equal(p.doneHour) {
		return nil
	}
	cur := quota.MonthStart(now)
	for k := 0; k <= PartitionsAhead; k++ {
		if err := p.Ensure(ctx, cur.AddDate(0, k, 0)); err != nil {
			return err
		}
	}
	if p.retention > 0 {
		if _, err := p.DropBefore(ctx, cur.AddDate(0, -p.retention, 0)); err != nil {
			return err
		}
	}
	p.doneHour = hour
	return nil
}

// Ensure creates the partition of the UTC month containing month unless it
// exists, moving that month's rows out of usage_default into it. Writes
// to usage wait for it (milliseconds when the default is empty, as it is
// when partitions are made ahead); reads go on.
func (p *Partitions) Ensure(ctx context.Context, month time.Time) error {
	from := quota.MonthStart(month)
	to := from.AddDate(0, 1, 0)
	name := PartitionName(from)
	err := pgx.BeginFunc(ctx, p.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(partitionsLock)); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil || exists {
			return err
		}
		// SHARE ROW EXCLUSIVE on usage holds back writes (reads go on)
		// until the partition is attached: a write already routed to the
		// default partition would otherwise fail its new constraint. The
		// default is then locked so that the rows moved are all of them.
		ident := pgx.Identifier{name}.Sanitize()
		for _, sql := range []string{
			`LOCK TABLE usage IN SHARE ROW EXCLUSIVE MODE`,
			`LOCK TABLE usage_default IN ACCESS EXCLUSIVE MODE`,
			`CREATE TABLE ` + ident + ` (LIKE usage INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)` +
				` WITH (fillfactor = ` + usageFillfactor + `)`,
		} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `
			WITH moved AS (DELETE FROM usage_default WHERE hour >= $1 AND hour < $2 RETURNING *)
			INSERT INTO `+ident+` SELECT * FROM moved`, from, to); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `ALTER TABLE usage ATTACH PARTITION `+ident+
			` FOR VALUES FROM ('`+from.Format(time.RFC3339)+`') TO ('`+to.Format(time.RFC3339)+`')`)
		return err
	})
	if err != nil {
		return fmt.Errorf("billing: create usage partition %s: %w", name, err)
	}
	return nil
}

// rollupSQL adds the usage rows the WHERE clause appended to it selects
// (from the table named where the placeholder FROM is) to usage_monthly,
// per tenant, UTC month and meter.
const rollupSQL = `
	INSERT INTO usage_monthly AS m (tenant_id, month, meter, units, requests, rejected, overage_units,
	                                shadow_refused, degraded, meter_overage_units)
	SELECT tenant_id, date_trunc('month', hour AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', meter,
	       sum(units), sum(requests), sum(rejected), sum(overage_units),
	       sum(shadow_refused), sum(degraded), sum(meter_overage_units)
	FROM %s %s
	GROUP BY 1, 2, 3
	ON CONFLICT (tenant_id, month, meter) DO UPDATE SET
	    units = m.units + EXCLUDED.units, requests = m.requests + EXCLUDED.requests,
	    rejected = m.rejected + EXCLUDED.rejected, overage_units = m.overage_units + EXCLUDED.overage_units,
	    shadow_refused = m.shadow_refused + EXCLUDED.shadow_refused, degraded = m.degraded + EXCLUDED.degraded,
	    meter_overage_units = m.meter_overage_units + EXCLUDED.meter_overage_units`

// DropBefore rolls up the hourly detail of every UTC month before cutoff
// (a month's first instant) into usage_monthly and drops it: whole
// partitions, and the default partition's rows of those months. Each
// month is one transaction. It returns the partitions dropped.
func (p *Partitions) DropBefore(ctx context.Context, cutoff time.Time) ([]string, error) {
	cutoff = quota.MonthStart(cutoff)
	rows, err := p.db.Query(ctx, `
		SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'usage'::regclass AND c.relname ~ '^usage_p[0-9]{6}$' AND c.relname < $1
		ORDER BY c.relname`, PartitionName(cutoff))
	if err != nil {
		return nil, fmt.Errorf("billing: usage partitions: %w", err)
	}
	old, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("billing: usage partitions: %w", err)
	}
	var dropped []string
	for _, name := range old {
		err := pgx.BeginFunc(ctx, p.db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(partitionsLock)); err != nil {
				return err
			}
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil || !exists {
				return err
			}
			ident := pgx.Identifier{name}.Sanitize()
			// SHARE ROW EXCLUSIVE on usage holds back writes while reads
			// go on, so that the rollup counts every row the drop removes
			// and no write is routed to the partition dropped. Dropping it
			// then takes ACCESS EXCLUSIVE on usage, for a moment: bounded
			// by lock_timeout, a busy ledger makes this month wait for the
			// next Run rather than queue every read behind the drop.
			for _, sql := range []string{
				`LOCK TABLE usage IN SHARE ROW EXCLUSIVE MODE`,
				fmt.Sprintf(rollupSQL, ident, ""),
				`SET LOCAL lock_timeout = '5s'`,
				`LOCK TABLE usage IN ACCESS EXCLUSIVE MODE`,
				`DROP TABLE ` + ident,
			} {
				if _, err := tx.Exec(ctx, sql); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return dropped, fmt.Errorf("billing: drop usage partition %s: %w", name, err)
		}
		dropped = append(dropped, name)
	}
	err = pgx.BeginFunc(ctx, p.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `LOCK TABLE usage IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(rollupSQL, "usage_default", "WHERE hour < $1"), cutoff); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM usage_default WHERE hour < $1`, cutoff); err != nil {
			return err
		}
		// The months rolled up leave usage_month_totals with their hourly
		// rows (the drops and the delete above, of partitions, fire none of
		// usage's triggers).
		_, err := tx.Exec(ctx, `DELETE FROM usage_month_totals WHERE month < $1`, cutoff)
		return err
	})
	if err != nil {
		return dropped, fmt.Errorf("billing: roll up old usage: %w", err)
	}
	return dropped, nil
}
