package pgdb_test

import (
	"context"
	"strings"
	"testing"
)

// TestUsagePartitionsMigrationDownAndUp: 000016 up moves the usage rows
// into monthly partitions (a month without one into usage_default), down
// puts every row back into one table with the monthly totals of the months
// whose detail was dropped, and up again partitions the same rows: no row
// is lost either way, and the key the flush's upserts rely on holds.
func TestUsagePartitionsMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, db := migratedPool(t)
	kind := func() string {
		t.Helper()
		var k string
		if err := db.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'usage'::regclass`).Scan(&k); err != nil {
			t.Fatal(err)
		}
		return k
	}
	type sums struct{ rows, units, requests, overage, meterOverage int64 }
	total := func() sums {
		t.Helper()
		var s sums
		if err := db.QueryRow(ctx, `SELECT count(*), coalesce(sum(units), 0), coalesce(sum(requests), 0),
			coalesce(sum(overage_units), 0), coalesce(sum(meter_overage_units), 0) FROM usage`).
			Scan(&s.rows, &s.units, &s.requests, &s.overage, &s.meterOverage); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if k := kind(); k != "p" {
		t.Fatalf("usage is relkind %q after the migrations, want a partitioned table (p)", k)
	}
	indexes := func() int {
		t.Helper()
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE indexname IN
			('tenants_id_text_idx', 'tenants_created_idx', 'tenants_name_trgm_idx', 'invoices_period_tenant_idx')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := indexes(); n != 4 {
		t.Fatalf("%d of the 4 indexes of 000016 after the migrations", n)
	}

	var tenant string
	if err := db.QueryRow(ctx, `INSERT INTO tenants (name, tier, webhook_secret) VALUES ('acme', 'pro', decode(md5('a') || md5('a'), 'hex'))
		RETURNING id::text`).Scan(&tenant); err != nil {
		t.Fatal(err)
	}
	// 3 months × 200 hours × 2 meters in partitions the test creates, and
	// 5 rows in 2019 that only the default partition takes.
	for _, m := range []string{"2025-01", "2025-02", "2025-03"} {
		if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS usage_p`+m[:4]+m[5:]+` PARTITION OF usage
			FOR VALUES FROM ('`+m+`-01 00:00+00') TO (('`+m+`-01 00:00+00'::timestamptz AT TIME ZONE 'UTC' + interval '1 month') AT TIME ZONE 'UTC')`); err != nil {
			t.Fatalf("partition %s: %v", m, err)
		}
	}
	if _, err := db.Exec(ctx, `
		INSERT INTO usage (tenant_id, hour, meter, units, requests, overage_units, meter_overage_units)
		SELECT $1, m + make_interval(hours => h), meter, h + 1, h + 2, h / 2, 1
		FROM unnest(ARRAY['2025-01-01 00:00+00', '2025-02-01 00:00+00', '2025-03-01 00:00+00']::timestamptz[]) AS m,
		     generate_series(0, 199) AS h, unnest(ARRAY['api', 'gpu']) AS meter`, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `
		INSERT INTO usage (tenant_id, hour, meter, units, requests)
		SELECT $1, '2019-06-01 00:00+00'::timestamptz + make_interval(hours => h), 'api', 3, 3 FROM generate_series(0, 4) AS h`, tenant); err != nil {
		t.Fatal(err)
	}
	// A month whose detail the retention dropped: its totals only.
	if _, err := db.Exec(ctx, `INSERT INTO usage_monthly (tenant_id, month, meter, units, requests, rejected, overage_units,
		shadow_refused, degraded, meter_overage_units) VALUES ($1, '2018-03-01 00:00+00', 'api', 1000, 900, 7, 10, 0, 0, 4)`, tenant); err != nil {
		t.Fatal(err)
	}
	var inDefault int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM usage_default`).Scan(&inDefault); err != nil || inDefault != 5 {
		t.Fatalf("usage_default holds %d rows (%v), want the 5 of 2019", inDefault, err)
	}
	before := total()
	if before.rows != 3*200*2+5 {
		t.Fatalf("%d rows before down, want %d", before.rows, 3*200*2+5)
	}

	m := migrator(t, url)
	if err := m.Migrate(15); err != nil {
		t.Fatalf("down to 15: %v", err)
	}
	if k := kind(); k != "r" {
		t.Fatalf("usage is relkind %q after down, want one plain table (r)", k)
	}
	var periodIdx int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE indexname = 'invoices_period_idx'`).Scan(&periodIdx); err != nil || periodIdx != 1 {
		t.Errorf("invoices_period_idx after down: %d (%v), want it back", periodIdx, err)
	}
	if n := indexes(); n != 0 {
		t.Errorf("%d of the indexes of 000016 left after down", n)
	}
	down := total()
	want := sums{before.rows + 1, before.units + 1000, before.requests + 900, before.overage + 10, before.meterOverage + 4}
	if down != want {
		t.Fatalf("after down: %+v, want %+v (every row, plus the monthly totals as one row)", down, want)
	}
	var left int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relkind IN ('r', 'p')
		AND (relname LIKE 'usage\_p%' OR relname IN ('usage_default', 'usage_monthly'))`).
		Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d partitions or rollup tables left after down (%v)", left, err)
	}

	if err := m.Up(); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if k := kind(); k != "p" {
		t.Fatalf("usage is relkind %q after up again, want p", k)
	}
	if n := indexes(); n != 4 {
		t.Errorf("%d of the 4 indexes of 000016 after up again", n)
	}
	if up := total(); up != want {
		t.Fatalf("after up again: %+v, want %+v", up, want)
	}
	// Every month with rows got its partition; nothing is left in the default.
	rows, err := db.Query(ctx, `SELECT tableoid::regclass::text, count(*) FROM usage GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for rows.Next() {
		var part string
		var n int64
		if err := rows.Scan(&part, &n); err != nil {
			t.Fatal(err)
		}
		got[part] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	wantParts := map[string]int64{"usage_p201803": 1, "usage_p201906": 5, "usage_p202501": 400, "usage_p202502": 400, "usage_p202503": 400}
	for p, n := range wantParts {
		if got[p] != n {
			t.Errorf("partition %s holds %d rows, want %d (all: %v)", p, got[p], n, got)
		}
	}
	if len(got) != len(wantParts) {
		t.Errorf("rows in partitions %v, want %v", got, wantParts)
	}

	// The flush's upsert key: a second write of a row adds to it.
	for range 2 {
		if _, err := db.Exec(ctx, `INSERT INTO usage AS u (tenant_id, hour, meter, units, requests) VALUES ($1, '2025-02-03 04:00+00', 'api', 5, 5)
			ON CONFLICT (tenant_id, hour, meter) DO UPDATE SET units = u.units + EXCLUDED.units`, tenant); err != nil {
			t.Fatal(err)
		}
	}
	var units int64
	if err := db.QueryRow(ctx, `SELECT units FROM usage WHERE tenant_id = $1 AND hour = '2025-02-03 04:00+00' AND meter = 'api'`, tenant).
		Scan(&units); err != nil || units != 53+5+5 {
		t.Errorf("units of the upserted row: %d (%v), want %d (hour 52's 53, and 5 twice)", units, err, 53+5+5)
	}
	// The checks are back under their names.
	if _, err := db.Exec(ctx, `INSERT INTO usage (tenant_id, hour, meter) VALUES ($1, '2025-02-03 05:00+00', '')`, tenant); err == nil ||
		!strings.Contains(err.Error(), "usage_meter_check") {
		t.Errorf("an empty meter: %v, want usage_meter_check", err)
	}
}
