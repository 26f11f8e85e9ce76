package billing

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/pgdb"
)

// monthTotalsCheck compares usage_month_totals with the sums of the usage
// rows, per tenant, UTC month and meter, both ways (a sum without its row,
// a row whose sum is not its units; a row left at 0 units by deletions
// equals no rows), and returns how many sums it compared.
func monthTotalsCheck(tb testing.TB, db *pgxpool.Pool, when string) int {
	tb.Helper()
	rows, err := db.Query(context.Background(), `
		WITH u AS (
			SELECT tenant_id, date_trunc('month', hour, 'UTC') AS month, meter, sum(units) AS units
			FROM usage GROUP BY 1, 2, 3
		)
		SELECT coalesce(u.tenant_id, s.tenant_id)::text, coalesce(u.month, s.month), coalesce(u.meter, s.meter),
		       coalesce(u.units, 0)::bigint, coalesce(s.units, -1)
		FROM u FULL JOIN usage_month_totals s ON s.tenant_id = u.tenant_id AND s.month = u.month AND s.meter = u.meter`)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			tenant, meter string
			month         time.Time
			sum, kept     int64
		)
		if err := rows.Scan(&tenant, &month, &meter, &sum, &kept); err != nil {
			tb.Fatal(err)
		}
		n++
		if sum != kept && (sum != 0 || kept > 0) {
			tb.Errorf("%s: tenant %s, %s, meter %s: usage rows sum to %d, usage_month_totals holds %d (-1: no row)",
				when, tenant, month.UTC().Format("2006-01"), meter, sum, kept)
		}
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestUsageMonthTotalsStayExact writes the ledger in every way the product
// does, and some it does not (the flush's upserts with a refund's
// correction, direct inserts, updates and deletes over several months and
// meters, a tenant deleted, partitions created and dropped by the
// retention, TRUNCATE) and after each compares usage_month_totals with the
// usage rows.
func TestUsageMonthTotalsStayExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	ids := r.tenants(t, 3, "pro")
	a, b, c := ids[0], ids[1], ids[2]

	// Flushes: admissions, then a refund of units already recorded (a
	// correction row of the next batch).
	want := r.admit(t, ids, 60, 7)
	rc := r.reconciler()
	if err := rc.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	monthTotalsCheck(t, r.db, "after a flush")
	if err := r.rl.Refund(ctx, a, "demo", 2, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := r.rl.ReportActive(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rc.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var units int64
	if err := r.db.QueryRow(ctx, `SELECT coalesce(sum(units), 0) FROM usage_month_totals WHERE tenant_id = $1`, a).Scan(&units); err != nil {
		t.Fatal(err)
	}
	if units != max(want[a]-2, 0) {
		t.Fatalf("tenant a's month total after the refund: %d, want %d", units, max(want[a]-2, 0))
	}
	monthTotalsCheck(t, r.db, "after a refund's correction")

	// Direct writes over three months (one in the default partition) and
	// two meters, in single and multi-row statements.
	p := NewPartitions(r.db, time.Now, 0)
	jan := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := p.Ensure(ctx, jan); err != nil {
		t.Fatal(err)
	}
	for h := range 30 {
		at := jan.Add(time.Duration(h*13) * time.Hour)
		invUsage(t, r.db, b, at, int64(h+1), 0)
		invUsage(t, r.db, b, at.AddDate(0, 1, 0), 5, 0) // February 2031: no partition yet, usage_default
	}
	invExec(t, r.db, `INSERT INTO usage (tenant_id, hour, meter, units, requests)
		SELECT $1, $2::timestamptz + make_interval(hours => g), m, g, 1
		FROM generate_series(0, 47) g, unnest(ARRAY['demo', 'gpu']) m`, c, jan)
	invUsage(t, r.db, b, jan, 1000, 0) // an upsert's update of an existing row
	monthTotalsCheck(t, r.db, "after direct inserts")
	invExec(t, r.db, `UPDATE usage SET units = units * 2 WHERE tenant_id = $1 AND meter = 'gpu'`, c)
	invExec(t, r.db, `UPDATE usage SET units = 0, overage_units = 0 WHERE tenant_id = $1 AND hour < $2`, b, jan.Add(100*time.Hour))
	invExec(t, r.db, `DELETE FROM usage WHERE tenant_id = $1 AND hour >= $2`, c, jan.Add(24*time.Hour))
	if n := monthTotalsCheck(t, r.db, "after updates and deletes"); n < 5 {
		t.Fatalf("%d sums compared, want at least 5", n)
	}

	// February's partition takes its rows from the default; the retention
	// then rolls up and drops January 2031 and everything before.
	if err := p.Ensure(ctx, jan.AddDate(0, 1, 0)); err != nil {
		t.Fatal(err)
	}
	monthTotalsCheck(t, r.db, "after February's partition took its rows")
	var ff string
	if err := r.db.QueryRow(ctx, `SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname = $1`,
		PartitionName(jan.AddDate(0, 1, 0))).Scan(&ff); err != nil || ff != "fillfactor="+usageFillfactor {
		t.Fatalf("a new partition's options: %q (%v), want fillfactor=%s", ff, err, usageFillfactor)
	}
	if _, err := p.DropBefore(ctx, jan.AddDate(0, 1, 0)); err != nil {
		t.Fatal(err)
	}
	var left int64
	if err := r.db.QueryRow(ctx, `SELECT count(*) FROM usage_month_totals WHERE month < $1`, jan.AddDate(0, 1, 0)).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d sums of months rolled up are left", left)
	}
	if n := monthTotalsCheck(t, r.db, "after the retention"); n != 1 {
		t.Fatalf("%d sums after the retention, want February 2031's alone", n)
	}

	invExec(t, r.db, `DELETE FROM tenants WHERE id = $1`, b)
	monthTotalsCheck(t, r.db, "after a tenant was deleted")
	invExec(t, r.db, `INSERT INTO usage (tenant_id, hour, meter, units) VALUES ($1, $2, 'demo', 9)`, a, jan.AddDate(0, 1, 3))
	invExec(t, r.db, `TRUNCATE usage`)
	if n := monthTotalsCheck(t, r.db, "after TRUNCATE"); n != 0 {
		t.Fatalf("%d sums after TRUNCATE, want none", n)
	}
}

// TestUsageMonthTotalsMigration: 000018 up fills usage_month_totals from
// the rows already there and gives every usage partition its fill factor;
// down drops the table and its triggers and resets the partitions'; up
// again adds what was written in between.
func TestUsageMonthTotalsMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, m := migratablePool(t)
	a := invTenant(t, db, "pro", invNov)
	invUsage(t, db, a, invNov.Add(time.Hour), 7, 0)
	monthTotalsCheck(t, db, "before down")

	if err := m.Migrate(17); err != nil {
		t.Fatalf("down to 17: %v", err)
	}
	var tables, triggers, filled int
	if err := db.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM information_schema.tables WHERE table_name = 'usage_month_totals'),
		(SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'usage_month_totals%'),
		(SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		 WHERE i.inhparent = 'usage'::regclass AND c.reloptions IS NOT NULL)`).Scan(&tables, &triggers, &filled); err != nil {
		t.Fatal(err)
	}
	if tables != 0 || triggers != 0 || filled != 0 {
		t.Fatalf("after down: %d tables, %d triggers, %d partitions with options; want none", tables, triggers, filled)
	}
	// Written at 17: more of November, a month of its own, a change.
	invUsage(t, db, a, invNov.Add(2*time.Hour), 5, 0)
	invUsage(t, db, a, invDec.Add(3*time.Hour), 11, 0)
	invExec(t, db, `UPDATE usage SET units = units + 1 WHERE tenant_id = $1 AND hour = $2`, a, invNov.Add(time.Hour))

	for range 2 { // up, then up again: no change
		if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
			t.Fatalf("up again: %v", err)
		}
	}
	if err := pgdb.SchemaCurrent(ctx, db); err != nil {
		t.Fatal(err)
	}
	if n := monthTotalsCheck(t, db, "after down and up"); n != 2 {
		t.Fatalf("%d sums compared, want November and December", n)
	}
	var nov int64
	if err := db.QueryRow(ctx, `SELECT units FROM usage_month_totals WHERE tenant_id = $1 AND month = $2`, a, invNov).Scan(&nov); err != nil || nov != 13 {
		t.Fatalf("November's sum after down and up: %d (%v), want 13", nov, err)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'usage'::regclass AND NOT coalesce(c.reloptions @> ARRAY['fillfactor=70'], false)`).Scan(&filled); err != nil {
		t.Fatal(err)
	}
	if filled != 0 {
		t.Fatalf("%d usage partitions without fillfactor=70 after up", filled)
	}
	invUsage(t, db, a, invDec.Add(4*time.Hour), 1, 0)
	monthTotalsCheck(t, db, "a write after up")
}
