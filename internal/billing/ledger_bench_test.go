package billing

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The ledger at scale: 100,000 tenants and about 10 million usage rows
// over four months (the current one and three before), loaded into a
// database of the benchmark's own with INSERT ... SELECT generate_series.
// 99,990 small tenants have 25 hourly rows a month; 10 heavy ones every
// hour of every month on 3 meters. Too slow for `make test`: it runs only
// with TOLLGATE_BENCH_LEDGER=1, e.g.
//
//	TOLLGATE_BENCH_LEDGER=1 go test ./internal/billing -run '^$' -bench BenchmarkLedgerAtScale -benchtime 20x -timeout 30m
//
// TOLLGATE_BENCH_LEDGER_KEEP=1 keeps the database (its URL is logged), to
// EXPLAIN its queries afterwards.
const (
	benchTenants      = 100_000
	benchHeavy        = 10
	benchSmallPerMo   = 25
	benchMonths       = 4
	benchHeavyMeters  = 3
	benchDashboardIDs = 50 // the console's tenants page
)

// benchNow is the benchmark's clock: the 20th of its current month.
var benchNow = time.Date(2031, 3, 20, 12, 0, 0, 0, time.UTC)

type ledgerBench struct {
	db           *pgxpool.Pool
	heavy, small string
	page         []string
	rows         int64
}

// benchLedgerDB creates the benchmark's database, migrated, and loads it.
func benchLedgerDB(b *testing.B) *ledgerBench {
	b.Helper()
	if os.Getenv("TOLLGATE_BENCH_LEDGER") != "1" {
		b.Skip("loads 10 million usage rows (minutes): set TOLLGATE_BENCH_LEDGER=1 to run it")
	}
	ctx := context.Background()
	base := testenv.DatabaseURL(b)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	name := "tg_bench_ledger_" + testenv.RandomHex(4)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		b.Fatal(err)
	}
	u, _ := url.Parse(base)
	u.Path = "/" + name
	dbURL := u.String()
	if os.Getenv("TOLLGATE_BENCH_LEDGER_KEEP") == "1" {
		b.Logf("database kept: %s", dbURL)
	} else {
		b.Cleanup(func() {
			c, err := pgx.Connect(context.Background(), base)
			if err != nil {
				b.Errorf("drop %s: %v", name, err)
				return
			}
			defer c.Close(context.Background())
			if _, err := c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
				b.Errorf("drop %s: %v", name, err)
			}
		})
	}
	if err := pgdb.MigrateUp(dbURL); err != nil {
		b.Fatal(err)
	}
	db, err := pgdb.Open(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(db.Close)

	start := time.Now()
	cur := quota.MonthStart(benchNow)
	first := cur.AddDate(0, -(benchMonths - 1), 0)
	parts := NewPartitions(db, func() time.Time { return benchNow }, 0)
	for m := first; m.Before(cur.AddDate(0, PartitionsAhead+1, 0)); m = m.AddDate(0, 1, 0) {
		if err := parts.Ensure(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
	created := first.AddDate(0, -1, 0)
	for _, sql := range []string{
		`CREATE TABLE bench_tenants (seq int PRIMARY KEY, id uuid NOT NULL)`,
		fmt.Sprintf(`INSERT INTO bench_tenants SELECT g, gen_random_uuid() FROM generate_series(1, %d) g`, benchTenants),
		`INSERT INTO tenants (id, name, tier, webhook_secret, created_at, updated_at)
		 SELECT id, 'tenant ' || seq, CASE WHEN seq % 3 = 0 THEN 'pro' ELSE 'free' END,
		        decode(md5(seq::text) || md5(seq::text), 'hex'), '` + created.Format(time.RFC3339) + `', '` + created.Format(time.RFC3339) + `'
		 FROM bench_tenants ORDER BY seq`,
		`INSERT INTO tenant_tier_history (tenant_id, tier, valid_from) SELECT id, tier, created_at FROM tenants`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	// One month per connection, rows in key order (tenant, hour, meter) so
	// that each partition's index grows at its right edge.
	var wg sync.WaitGroup
	errs := make(chan error, benchMonths)
	for m := first; !m.After(cur); m = m.AddDate(0, 1, 0) {
		wg.Add(1)
		go func(m time.Time) {
			defer wg.Done()
			hours := int(m.AddDate(0, 1, 0).Sub(m) / time.Hour)
			_, err := db.Exec(ctx, fmt.Sprintf(`
				INSERT INTO usage (tenant_id, hour, meter, units, requests, rejected)
				SELECT t.id, $1::timestamptz + make_interval(hours => r.h), r.meter, 1 + (t.seq + r.h) %% 97, 1 + (t.seq + r.h) %% 97, (t.seq + r.h) %% 3
				FROM (SELECT id, seq FROM bench_tenants ORDER BY id) t,
				LATERAL (
					SELECT k * 29 + t.seq %% 24 AS h, 'api' AS meter FROM generate_series(0, %d) k WHERE t.seq > %d
					UNION ALL
					SELECT h, meter FROM generate_series(0, %d) h, unnest(ARRAY['api', 'gpu', 'storage']) meter WHERE t.seq <= %d
					ORDER BY 1, 2
				) r`, benchSmallPerMo-1, benchHeavy, hours-1, benchHeavy), m)
			if err != nil {
				errs <- fmt.Errorf("load %s: %w", m.Format("2006-01"), err)
			}
		}(m)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	if _, err := db.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		b.Fatal(err)
	}
	lb := &ledgerBench{db: db}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM usage`).Scan(&lb.rows); err != nil {
		b.Fatal(err)
	}
	if err := db.QueryRow(ctx, `SELECT id::text FROM bench_tenants WHERE seq = 1`).Scan(&lb.heavy); err != nil {
		b.Fatal(err)
	}
	if err := db.QueryRow(ctx, `SELECT id::text FROM bench_tenants WHERE seq = 54321`).Scan(&lb.small); err != nil {
		b.Fatal(err)
	}
	rows, err := db.Query(ctx, `SELECT id::text FROM tenants ORDER BY created_at, id LIMIT $1`, benchDashboardIDs)
	if err != nil {
		b.Fatal(err)
	}
	if lb.page, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded %d tenants and %d usage rows in %s", benchTenants, lb.rows, time.Since(start).Round(time.Second))
	return lb
}

// BenchmarkLedgerAtScale times each page's ledger queries on 10 million
// usage rows and 100,000 tenants, then the invoice sweep of every tenant.
func BenchmarkLedgerAtScale(b *testing.B) {
	lb := benchLedgerDB(b)
	ctx := context.Background()
	now := func() time.Time { return benchNow }
	led := NewLedger(lb.db)
	store := catalogdb.NewStore(lb.db)
	from := quota.MonthStart(benchNow)
	to := from.AddDate(0, 1, 0)
	ms := func(b *testing.B) { b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/op") }
	each := func(b *testing.B, tenant, gran string) {
		n := 0
		for b.Loop() {
			n = 0
			if err := led.EachUsage(ctx, tenant, from, to, gran, "", func(UsageRow) error { n++; return nil }); err != nil {
				b.Fatal(err)
			}
		}
		if n == 0 {
			b.Fatal("no usage rows read")
		}
		ms(b)
	}

	// /v1/usage, the tenant's dashboard and the admin summary: the month
	// by day (usage.Reader.For's one ledger query).
	b.Run("usage-month-by-day/heavy", func(b *testing.B) { each(b, lb.heavy, "day") })
	b.Run("usage-month-by-day/small", func(b *testing.B) { each(b, lb.small, "day") })
	// The admin's usage export: the month by hour.
	b.Run("usage-month-by-hour/heavy", func(b *testing.B) { each(b, lb.heavy, "hour") })
	// The console's tenants page: 50 tenants, then their month's totals.
	b.Run("console-tenants-page", func(b *testing.B) {
		for b.Loop() {
			ts, _, err := store.ListTenants(ctx, quota.TenantFilter{}, quota.Page{Limit: benchDashboardIDs})
			if err != nil || len(ts) != benchDashboardIDs {
				b.Fatalf("%d tenants, %v", len(ts), err)
			}
			ids := make([]string, len(ts))
			for k, t := range ts {
				ids[k] = t.ID
			}
			if _, err := led.TenantTotals(ctx, ids, from, to); err != nil {
				b.Fatal(err)
			}
		}
		ms(b)
	})
	b.Run("console-tenants-search", func(b *testing.B) {
		for b.Loop() {
			ts, _, err := store.ListTenants(ctx, quota.TenantFilter{Query: "tenant 4242"}, quota.Page{Limit: benchDashboardIDs})
			if err != nil || len(ts) == 0 {
				b.Fatalf("%d tenants, %v", len(ts), err)
			}
		}
		ms(b)
	})
	b.Run("console-month-totals-50", func(b *testing.B) {
		for b.Loop() {
			got, err := led.TenantTotals(ctx, lb.page, from, to)
			if err != nil || len(got) != len(lb.page) {
				b.Fatalf("%d totals, %v", len(got), err)
			}
		}
		ms(b)
	})
	// Invoice generation for one tenant (GET /v1/invoices/current).
	gen := NewInvoicer(lb.db, now, 48*time.Hour)
	b.Run("invoice-one-tenant/heavy", func(b *testing.B) {
		for b.Loop() {
			if _, err := gen.Generate(ctx, lb.heavy, from); err != nil {
				b.Fatal(err)
			}
		}
		ms(b)
	})
	b.Run("invoice-one-tenant/small", func(b *testing.B) {
		for b.Loop() {
			if _, err := gen.Generate(ctx, lb.small, from); err != nil {
				b.Fatal(err)
			}
		}
		ms(b)
	})

	// The sweeps of every tenant, each done once however many times the
	// framework calls the sub-benchmark: the current month's first sweep
	// (a draft created for each tenant), a sweep that finds nothing
	// changed, then closing the previous month (an invoice created and
	// finalized for each) with the current month's sweep after it.
	var once sync.Once
	var create, resweep, closing time.Duration
	sweep := func(b *testing.B, inv *Invoicer) time.Duration {
		inv.TenantsPerRun = 3 * benchTenants
		start := time.Now()
		if err := inv.Run(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	count := func(b *testing.B, status string) int64 {
		var n int64
		if err := lb.db.QueryRow(ctx, `SELECT count(*) FROM invoices WHERE status = $1`, status).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	b.Run("invoice-sweeps", func(b *testing.B) {
		once.Do(func() {
			drafts := NewInvoicer(lb.db, now, 100*365*24*time.Hour) // no month closes
			create = sweep(b, drafts)
			if n := count(b, "draft"); n != benchTenants {
				b.Fatalf("%d drafts after the first sweep, want %d", n, benchTenants)
			}
			// Autovacuum analyzes the 100,000 new invoices within minutes,
			// long before the next sweep (15 minutes on) or the month's
			// close; without it the planner still sees an empty month.
			if _, err := lb.db.Exec(ctx, `ANALYZE invoices, invoice_lines`); err != nil {
				b.Fatal(err)
			}
			resweep = sweep(b, drafts)
			closing = sweep(b, NewInvoicer(lb.db, now, 48*time.Hour))
			if n := count(b, "final"); n != benchTenants {
				b.Fatalf("%d final invoices after closing the previous month, want %d", n, benchTenants)
			}
			b.Logf("%d usage rows, %d tenants: first sweep %s, unchanged sweep %s, closing the previous month plus a sweep %s",
				lb.rows, benchTenants, create.Round(time.Millisecond), resweep.Round(time.Millisecond), closing.Round(time.Millisecond))
		})
		for b.Loop() {
		}
		b.ReportMetric(create.Seconds(), "first-sweep-s")
		b.ReportMetric(resweep.Seconds(), "unchanged-sweep-s")
		b.ReportMetric(closing.Seconds(), "close+sweep-s")
	})
	// The console's invoices page, once every tenant has invoices: a page
	// of the current month's and the month's count and total.
	b.Run("console-invoices-page", func(b *testing.B) {
		for b.Loop() {
			page, more, err := led.InvoicePage(ctx, from, "", 100)
			if err != nil || len(page) != 100 || !more {
				b.Fatalf("%d invoices (more %t), %v", len(page), more, err)
			}
			if _, _, err := led.InvoiceSummary(ctx, from); err != nil {
				b.Fatal(err)
			}
		}
		ms(b)
	})
}
