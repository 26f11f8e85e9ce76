package billing

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

var (
	invNov     = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC) // 30 days
	invDec     = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	invNovSecs = int64(30 * 86400)
)

// invClock is an injected clock the test moves by hand.
type invClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *invClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *invClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func invExec(tb testing.TB, db *pgxpool.Pool, sql string, args ...any) {
	tb.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

// invTenant creates a tenant on tier through the Store, then moves its
// creation and its tier history's start to created, for determinism.
func invTenant(tb testing.TB, db *pgxpool.Pool, tier string, created time.Time) string {
	tb.Helper()
	t, err := catalogdb.NewStore(db).CreateTenant(context.Background(), "test", "Acme", tier)
	if err != nil {
		tb.Fatalf("create tenant: %v", err)
	}
	invExec(tb, db, `UPDATE tenants SET created_at = $2 WHERE id = $1`, t.ID, created)
	invExec(tb, db, `UPDATE tenant_tier_history SET valid_from = $2 WHERE tenant_id = $1`, t.ID, created)
	return t.ID
}

// invChangeTier moves the tenant to tier at the given time, as
// Store.UpdateTenant does but at a chosen instant.
func invChangeTier(tb testing.TB, db *pgxpool.Pool, tenantID, tier string, at time.Time) {
	tb.Helper()
	invExec(tb, db, `UPDATE tenant_tier_history SET valid_to = $2 WHERE tenant_id = $1 AND valid_to IS NULL`, tenantID, at)
	invExec(tb, db, `INSERT INTO tenant_tier_history (tenant_id, tier, valid_from) VALUES ($1, $2, $3)`, tenantID, tier, at)
	invExec(tb, db, `UPDATE tenants SET tier = $2 WHERE id = $1`, tenantID, tier)
}

func invUsage(tb testing.TB, db *pgxpool.Pool, tenantID string, hour time.Time, units, overage int64) {
	tb.Helper()
	invExec(tb, db, `INSERT INTO usage (tenant_id, hour, meter, units, requests, overage_units) VALUES ($1, $2, 'demo', $3, $3, $4)
		ON CONFLICT (tenant_id, hour, meter) DO UPDATE SET units = usage.units + $3, overage_units = usage.overage_units + $4`,
		tenantID, hour, units, overage)
}

func invGrant(tb testing.TB, db *pgxpool.Pool, tenantID, period string, start time.Time, units int64) {
	tb.Helper()
	if _, err := catalogdb.NewStore(db).CreateGrant(context.Background(), "test", tenantID, period, start, units); err != nil {
		tb.Fatalf("create grant: %v", err)
	}
}

func invGenerate(tb testing.TB, inv *Invoicer, tenantID string, month time.Time) Invoice {
	tb.Helper()
	got, err := inv.Generate(context.Background(), tenantID, month)
	if err != nil {
		tb.Fatalf("Generate(%s): %v", month.Format("2006-01"), err)
	}
	return got
}

func invCheckLines(tb testing.TB, got Invoice, want []InvoiceLine) {
	tb.Helper()
	if !reflect.DeepEqual(got.Lines, want) {
		tb.Errorf("lines:\n got %+v\nwant %+v", got.Lines, want)
	}
	if got, want := got.TotalCents, TotalCents(want); got != want {
		tb.Errorf("total_cents: got %d, want %d", got, want)
	}
}

func TestGenerate(t *testing.T) {
	t.Parallel()
	sub := func(desc string, secs, cents int64) InvoiceLine {
		return InvoiceLine{Kind: "subscription", Description: desc, Quantity: secs, AmountCents: cents}
	}
	proIncluded := func(units int64) InvoiceLine {
		return InvoiceLine{Kind: "included", Description: "Usage, included in Pro plan: 1,000,000 units per month", Quantity: units}
	}
	tests := []struct {
		name  string
		tier  string
		setup func(tb testing.TB, db *pgxpool.Pool) string // returns the tenant id
		want  []InvoiceLine
		total int64
	}{
		{
			name: "block tier, full month, no overage",
			setup: func(tb testing.TB, db *pgxpool.Pool) string {
				invExec(tb, db, `INSERT INTO tiers (slug, name, rank, price_cents, monthly_quota, overage)
					VALUES ('basic', 'Basic', 5, 1900, 50000, 'block')`)
				id := invTenant(tb, db, "basic", invNov)
				invUsage(tb, db, id, invNov.Add(5*time.Hour), 30000, 0)
				invUsage(tb, db, id, invDec.Add(-time.Hour), 10000, 0)
				invUsage(tb, db, id, invNov.Add(-time.Hour), 777, 0) // October
				invUsage(tb, db, id, invDec, 888, 0)                 // December
				return id
			},
			want: []InvoiceLine{
				sub("Basic plan, 2026-11-01 – 2026-12-01 (30.0 of 30 days)", invNovSecs, 1900),
				{Kind: "included", Description: "Usage, included in Basic plan: 50,000 units per month", Quantity: 40000},
			},
			total: 1900,
		},
		{
			name: "bill tier with overage",
			setup: func(tb testing.TB, db *pgxpool.Pool) string {
				id := invTenant(tb, db, "pro", invNov)
				invUsage(tb, db, id, invNov.Add(24*time.Hour), 1_000_000, 0)
				invUsage(tb, db, id, invNov.Add(25*time.Hour), 12_345, 12_345)
				return id
			},
			want: []InvoiceLine{
				sub("Pro plan, 2026-11-01 – 2026-12-01 (30.0 of 30 days)", invNovSecs, 4900),
				proIncluded(1_012_345),
				{Kind: "overage", Description: "Overage: 12,345 units at $0.50 per 1,000 (Pro plan)", Quantity: 12_345, AmountCents: 618},
			},
			total: 4900 + 618,
		},
		{
			name: "upgrade free to pro mid-month",
			setup: func(tb testing.TB, db *pgxpool.Pool) string {
				id := invTenant(tb, db, "free", invNov)
				invChangeTier(tb, db, id, "pro", time.Date(2026, 11, 16, 0, 0, 0, 0, time.UTC))
				return id
			},
			want: []InvoiceLine{
				sub("Free plan, 2026-11-01 – 2026-11-16 (15.0 of 30 days)", invNovSecs/2, 0),
				sub("Pro plan, 2026-11-16 – 2026-12-01 (15.0 of 30 days)", invNovSecs/2, 2450),
				proIncluded(0),
			},
			total: 2450,
		},
		{
			name: "tenant created mid-month pays from created_at",
			setup: func(tb testing.TB, db *pgxpool.Pool) string {
				return invTenant(tb, db, "pro", time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC))
			},
			want: []InvoiceLine{
				sub("Pro plan, 2026-11-11 – 2026-12-01 (20.0 of 30 days)", 20*86400, 3267), // 3266.67
				proIncluded(0),
			},
			total: 3267,
		},
		{
			name: "history before the month and a tier change after it are clipped",
			setup: func(tb testing.TB, db *pgxpool.Pool) string {
				id := invTenant(tb, db, "enterprise", invNov.AddDate(0, -3, 0))
				invChangeTier(tb, db, id, "pro", time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
				return id
			},
			want: []InvoiceLine{
				sub("Enterprise plan, 2026-11-01 – 2026-11-21 12:00 (20.5 of 30 days)", 20*86400+43200, 34098), // 49900 × 20.5/30 = 34098.33
				sub("Pro plan, 2026-11-21 12:00 – 2026-12-01 (9.5 of 30 days)", 9*86400+43200, 1552),           // 4900 × 9.5/30 = 1551.67
				proIncluded(0),
			},
			total: 34098 + 1552,
		},
		{
			name: "grants shown at amount 0",
			setup: func(tb testing.TB, db *pgxpool.Pool) string {
				id := invTenant(tb, db, "pro", invNov)
				invGrant(tb, db, id, "month", invNov, 5000)
				invGrant(tb, db, id, "day", time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC), 300)
				invGrant(tb, db, id, "month", invNov.AddDate(0, -1, 0), 1) // October
				invGrant(tb, db, id, "day", invDec, 2)                     // December
				return id
			},
			want: []InvoiceLine{
				sub("Pro plan, 2026-11-01 – 2026-12-01 (30.0 of 30 days)", invNovSecs, 4900),
				proIncluded(0),
				{Kind: "grant", Description: "Grant: 5,000 extra units for November 2026 (not charged)", Quantity: 5000},
				{Kind: "grant", Description: "Grant: 300 extra units for 2026-11-05 (not charged)", Quantity: 300},
			},
			total: 4900,
		},
		{
			name: "tier price changed mid-month: each part at the price in force then",
			setup: func(tb testing.TB, db *pgxpool.Pool) string {
				id := invTenant(tb, db, "pro", invNov)
				invPriceChange(tb, db, "pro", 5900, 50, time.Date(2026, 11, 16, 0, 0, 0, 0, time.UTC))
				return id
			},
			want: []InvoiceLine{
				sub("Pro plan, 2026-11-01 – 2026-11-16 (15.0 of 30 days)", 15*86400, 2450), // 4900 × 15/30
				sub("Pro plan, 2026-11-16 – 2026-12-01 (15.0 of 30 days)", 15*86400, 2950), // 5900 × 15/30
				proIncluded(0),
			},
			total: 2450 + 2950,
		},
		{
			name: "tier price changed around the store: the price history applies",
			setup: func(tb testing.TB, db *pgxpool.Pool) string {
				id := invTenant(tb, db, "pro", invNov)
				invExec(tb, db, `UPDATE tiers SET price_cents = 5900 WHERE slug = 'pro'`)
				return id
			},
			want: []InvoiceLine{
				sub("Pro plan, 2026-11-01 – 2026-12-01 (30.0 of 30 days)", invNovSecs, 4900),
				proIncluded(0),
			},
			total: 4900,
		},
		{
			name: "monthly quota override named in the included line",
			setup: func(tb testing.TB, db *pgxpool.Pool) string {
				id := invTenant(tb, db, "pro", invNov)
				invExec(tb, db, `UPDATE tenants SET overrides = '{"monthly_quota": null}' WHERE id = $1`, id)
				return id
			},
			want: []InvoiceLine{
				sub("Pro plan, 2026-11-01 – 2026-12-01 (30.0 of 30 days)", invNovSecs, 4900),
				{Kind: "included", Description: "Usage, included in Pro plan: unlimited units per month"},
			},
			total: 4900,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testenv.Postgres(t)
			id := tt.setup(t, db)
			clock := &invClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
			got := invGenerate(t, NewInvoicer(db, clock.Now, time.Hour), id, invNov)
			invCheckLines(t, got, tt.want)
			if got.TotalCents != tt.total {
				t.Errorf("total_cents: got %d, want %d", got.TotalCents, tt.total)
			}
			if got.Status != "draft" || got.FinalizedAt != nil || got.Period != "2026-11" || got.TenantID != id {
				t.Errorf("got status %q, finalized_at %v, period %q, tenant %s; want draft, nil, 2026-11, %s",
					got.Status, got.FinalizedAt, got.Period, got.TenantID, id)
			}
		})
	}
}

func TestGenerateIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	id := invTenant(t, db, "pro", invNov)
	invUsage(t, db, id, invNov.Add(time.Hour), 1_000_100, 100)
	invGrant(t, db, id, "month", invNov, 50)
	clock := &invClock{t: time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)}
	inv := NewInvoicer(db, clock.Now, time.Hour)

	first := invGenerate(t, inv, id, invNov)
	clock.Set(clock.Now().Add(time.Hour))
	second := invGenerate(t, inv, id, invNov)
	if !reflect.DeepEqual(first, second) {
		t.Fatalf("second Generate with the same data:\n got %+v\nwant %+v", second, first)
	}
	if err := inv.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got := invGenerate(t, inv, id, invNov); !reflect.DeepEqual(got, first) {
		t.Fatalf("Generate after Run with the same data:\n got %+v\nwant %+v", got, first)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM invoices`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("invoices: got %d, want 1", n)
	}

	// New usage changes the draft in place: same invoice, new lines and time.
	invUsage(t, db, id, invNov.Add(2*time.Hour), 1000, 1000)
	third := invGenerate(t, inv, id, invNov)
	if third.ID != first.ID || !third.CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("id, created_at: got %s, %v, want %s, %v", third.ID, third.CreatedAt, first.ID, first.CreatedAt)
	}
	if !third.UpdatedAt.Equal(clock.Now()) {
		t.Errorf("updated_at: got %v, want %v", third.UpdatedAt, clock.Now())
	}
	if got, want := third.TotalCents, int64(4900+55); got != want { // ceil(1100 × 50 / 1000)
		t.Errorf("total_cents: got %d, want %d", got, want)
	}
}

func TestGenerateErrors(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	id := invTenant(t, db, "pro", invDec)
	inv := NewInvoicer(db, (&invClock{t: invDec.Add(time.Hour)}).Now, time.Hour)
	tests := []struct {
		name     string
		tenantID string
		month    time.Time
		want     string
	}{
		{"unknown tenant", "0b4e8d1a-57c6-4b5f-9a4e-5bb1a3f1c2d7", invNov, quota.CodeNotFound},
		{"not a uuid", "acme", invNov, quota.CodeNotFound},
		{"tenant created after the month", id, invNov, quota.CodeNotFound},
		{"future month", id, invDec.AddDate(0, 1, 0), quota.CodeInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := inv.Generate(context.Background(), tt.tenantID, tt.month)
			if got := quota.ErrorCode(err); got != tt.want {
				t.Errorf("got %q (%v), want %q", got, err, tt.want)
			}
		})
	}
}

func TestRunFinalizes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	id := invTenant(t, db, "pro", invNov)
	invUsage(t, db, id, invNov.Add(time.Hour), 1_000_000, 0)
	const grace = 6 * time.Hour
	clock := &invClock{t: time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)}
	inv := NewInvoicer(db, clock.Now, grace)

	status := func(tenantID string, month time.Time) (string, *time.Time) {
		t.Helper()
		var s string
		var fin *time.Time
		err := db.QueryRow(ctx, `SELECT status, finalized_at FROM invoices WHERE tenant_id = $1 AND period = $2`, tenantID, month).Scan(&s, &fin)
		if err != nil {
			return "none", nil
		}
		return s, fin
	}
	run := func(at time.Time) {
		t.Helper()
		clock.Set(at)
		if err := inv.Run(ctx); err != nil {
			t.Fatalf("Run at %v: %v", at, err)
		}
	}

	run(time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC))
	if got, _ := status(id, invNov); got != "draft" {
		t.Fatalf("November after a Run in November: got %s, want draft", got)
	}
	invUsage(t, db, id, invDec.Add(-time.Hour), 2000, 2000)                         // flushed late
	late := invTenant(t, db, "pro", time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)) // never drafted in November

	run(invDec.Add(grace - time.Second))
	if got, _ := status(id, invNov); got != "draft" {
		t.Fatalf("November before its end + grace: got %s, want draft", got)
	}
	if got, _ := status(id, invDec); got != "draft" {
		t.Fatalf("December after a Run in December: got %s, want draft", got)
	}

	finalAt := invDec.Add(grace)
	run(finalAt)
	for _, tenant := range []string{id, late} {
		got, fin := status(tenant, invNov)
		if got != "final" || fin == nil || !fin.Equal(finalAt) {
			t.Fatalf("tenant %s November after its end + grace: got %s at %v, want final at %v", tenant, got, fin, finalAt)
		}
	}
	final := invGenerate(t, inv, id, invNov)
	if got, want := final.TotalCents, int64(4900+100); got != want { // the late usage counts
		t.Fatalf("final total_cents: got %d, want %d", got, want)
	}

	// A final invoice never changes, through Run (this Invoicer or a fresh
	// one) or Generate.
	invUsage(t, db, id, invNov.Add(3*time.Hour), 5000, 5000)
	invGrant(t, db, id, "month", invNov, 10)
	run(finalAt.Add(time.Hour))
	clock.Set(finalAt.Add(2 * time.Hour))
	if err := NewInvoicer(db, clock.Now, grace).Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got := invGenerate(t, inv, id, invNov); !reflect.DeepEqual(got, final) {
		t.Fatalf("final invoice changed:\n got %+v\nwant %+v", got, final)
	}

	// An old draft left by a worker that was down is finalized too.
	invExec(t, db, `UPDATE invoices SET status = 'draft', finalized_at = NULL WHERE tenant_id = $1 AND period = $2`, id, invNov)
	clock.Set(time.Date(2027, 1, 15, 0, 0, 0, 0, time.UTC))
	if err := NewInvoicer(db, clock.Now, grace).Run(ctx); err != nil {
		t.Fatal(err)
	}
	for _, month := range []time.Time{invNov, invDec} {
		if got, _ := status(id, month); got != "final" {
			t.Errorf("%s after a Run in January: got %s, want final", month.Format("2006-01"), got)
		}
	}
	if got, _ := status(id, invDec.AddDate(0, 1, 0)); got != "draft" {
		t.Errorf("January after a Run in January: got %s, want draft", got)
	}
}

func TestRunManyTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	const n = 2000
	invExec(t, db, `INSERT INTO tenants (name, tier, webhook_secret, created_at)
		SELECT 'tenant ' || g, CASE WHEN g % 2 = 0 THEN 'pro' ELSE 'free' END, decode(repeat('ab', 32), 'hex'), $2
		FROM generate_series(1, $1) g`, n, invNov)
	invExec(t, db, `INSERT INTO tenant_tier_history (tenant_id, tier, valid_from) SELECT id, tier, created_at FROM tenants`)
	invExec(t, db, `INSERT INTO usage (tenant_id, hour, meter, units, requests, overage_units)
		SELECT id, $1, 'demo', 10, 10, 0 FROM tenants`, invNov.Add(time.Hour))
	// Created after November: no invoice.
	invExec(t, db, `INSERT INTO tenants (name, tier, webhook_secret, created_at) VALUES ('later', 'pro', decode(repeat('ab', 32), 'hex'), $1)`, invDec)

	clock := &invClock{t: time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)}
	// Two workers at once, with batches that do not divide n.
	a, b := NewInvoicer(db, clock.Now, time.Hour), NewInvoicer(db, clock.Now, time.Hour)
	a.batch, b.batch = 300, 300
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for k, inv := range []*Invoicer{a, b} {
		wg.Go(func() { errs[k] = inv.Run(ctx) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("two concurrent Runs over %d tenants: %v", n, time.Since(start))

	type summary struct {
		Invoices, Drafts, Lines int
		Total                   int64
		LastUpdate              time.Time
	}
	sum := func() summary {
		t.Helper()
		var s summary
		err := db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'draft'), coalesce(sum(total_cents), 0)::bigint,
			max(updated_at), (SELECT count(*) FROM invoice_lines) FROM invoices WHERE period = $1`, invNov).
			Scan(&s.Invoices, &s.Drafts, &s.Total, &s.LastUpdate, &s.Lines)
		if err != nil {
			t.Fatal(err)
		}
		s.LastUpdate = s.LastUpdate.UTC()
		return s
	}
	first := sum()
	want := summary{Invoices: n, Drafts: n, Lines: 2 * n, Total: n / 2 * 4900, LastUpdate: clock.Now()}
	if first != want {
		t.Fatalf("after Run: got %+v, want %+v", first, want)
	}

	// Unchanged invoices are not rewritten.
	clock.Set(clock.Now().Add(time.Hour))
	if err := a.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sum(); got != first {
		t.Fatalf("after a second Run: got %+v, want %+v", got, first)
	}

	// A Run cut short or out of budget leaves the rest to the next Runs.
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Run(canceled); err == nil {
		t.Fatal("Run with a canceled context: got no error, want one")
	}
	a.TenantsPerRun = 700
	invExec(t, db, `UPDATE usage SET units = 20, requests = 20`)
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := db.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for k, want := range []int{700, 1400, 2000, 2000} {
		if err := a.Run(ctx); err != nil {
			t.Fatal(err)
		}
		if got := count(`SELECT count(*) FROM invoice_lines WHERE kind = 'included' AND quantity = 20`); got != want {
			t.Fatalf("Run %d with a budget of 700: got %d drafts updated, want %d", k+1, got, want)
		}
	}

	// Closing November is budgeted the same way, before December's drafts.
	clock.Set(invDec.Add(2 * time.Hour))
	for k, want := range []int{700, 1400, 2000} {
		if err := a.Run(ctx); err != nil {
			t.Fatal(err)
		}
		if got := count(`SELECT count(*) FROM invoices WHERE period = $1 AND status = 'final'`, invNov); got != want {
			t.Fatalf("Run %d after November's end + grace: got %d final, want %d", k+1, got, want)
		}
	}
	if got, want := count(`SELECT count(*) FROM invoices WHERE period = $1`, invDec), 100; got != want {
		t.Fatalf("December drafts after closing November: got %d, want %d", got, want)
	}
}

func TestRate(t *testing.T) {
	t.Parallel()
	day := func(d int) time.Time { return invNov.AddDate(0, 0, d-1) }
	seg := func(price int64, from, to time.Time) TierSegment {
		return TierSegment{Tier: "t", Name: "T", PriceCents: price, Overage: quota.OverageBlock, From: from, To: to}
	}
	jan := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC) // 31 days
	tests := []struct {
		name      string
		in        RatingInput
		wantSub   []int64 // subscription amounts
		wantOver  int64   // overage amount, -1 for no overage line
		wantTotal int64
	}{
		{"full month", RatingInput{Start: invNov, End: invDec, Segments: []TierSegment{seg(4900, invNov, invDec)}}, []int64{4900}, -1, 4900},
		{"half of 30 days", RatingInput{Start: invNov, End: invDec, Segments: []TierSegment{seg(4900, day(16), invDec)}}, []int64{2450}, -1, 2450},
		{"exactly half a cent rounds up", RatingInput{Start: invNov, End: invDec, Segments: []TierSegment{seg(1, day(16), invDec)}}, []int64{1}, -1, 1},
		{"1.5 cents rounds up", RatingInput{Start: invNov, End: invDec, Segments: []TierSegment{seg(3, day(16), invDec)}}, []int64{2}, -1, 2},
		{"a third rounds down", RatingInput{Start: invNov, End: invDec, Segments: []TierSegment{seg(100, day(21), invDec)}}, []int64{33}, -1, 33},
		{"two thirds rounds up", RatingInput{Start: invNov, End: invDec, Segments: []TierSegment{seg(100, day(11), invDec)}}, []int64{67}, -1, 67},
		{"10 of 31 days", RatingInput{Start: jan, End: jan.AddDate(0, 1, 0), Segments: []TierSegment{seg(1000, jan.AddDate(0, 0, 21), jan.AddDate(0, 1, 0))}}, []int64{323}, -1, 323},
		{"one second", RatingInput{Start: invNov, End: invDec, Segments: []TierSegment{seg(4900, invDec.Add(-time.Second), invDec)}}, []int64{0}, -1, 0},
		{"thirds each round down", RatingInput{Start: invNov, End: invDec, Segments: []TierSegment{
			seg(100, invNov, day(11)), {Tier: "u", Name: "U", PriceCents: 100, From: day(11), To: day(21)}, seg(100, day(21), invDec)}},
			[]int64{33, 33, 33}, -1, 99},
		{"contiguous segments of one tier merge", RatingInput{Start: invNov, End: invDec, Segments: []TierSegment{
			seg(100, day(11), day(21)), seg(100, invNov, day(11)), seg(100, day(21), invDec)}}, []int64{100}, -1, 100},
		{"segments clipped to the month", RatingInput{Start: invNov, End: invDec, Segments: []TierSegment{seg(4900, invNov.AddDate(0, -2, 0), invDec.AddDate(1, 0, 0))}}, []int64{4900}, -1, 4900},
		{"largest price, no overflow", RatingInput{Start: invNov, End: invDec, Segments: []TierSegment{seg(quota.MaxPrice, day(16), invDec)}}, []int64{quota.MaxPrice / 2}, -1, quota.MaxPrice / 2},
		{"overage rounds up", RatingInput{Start: invNov, End: invDec, OverageUnits: 12345, Segments: []TierSegment{
			{Name: "Pro", PriceCents: 0, Overage: quota.OverageBill, OveragePriceCentsPer1K: 50, From: invNov, To: invDec}}}, []int64{0}, 618, 618},
		{"overage exact", RatingInput{Start: invNov, End: invDec, OverageUnits: 1000, Segments: []TierSegment{
			{Name: "Pro", Overage: quota.OverageBill, OveragePriceCentsPer1K: 50, From: invNov, To: invDec}}}, []int64{0}, 50, 50},
		{"one overage unit is a cent", RatingInput{Start: invNov, End: invDec, OverageUnits: 1, Segments: []TierSegment{
			{Name: "Ent", Overage: quota.OverageBill, OveragePriceCentsPer1K: 20, From: invNov, To: invDec}}}, []int64{0}, 1, 1},
		{"overage at the month-end tier's price", RatingInput{Start: invNov, End: invDec, OverageUnits: 1000, Segments: []TierSegment{
			{Tier: "pro", Name: "Pro", Overage: quota.OverageBill, OveragePriceCentsPer1K: 50, From: invNov, To: day(16)},
			{Tier: "ent", Name: "Ent", Overage: quota.OverageBill, OveragePriceCentsPer1K: 20, From: day(16), To: invDec}}}, []int64{0, 0}, 20, 20},
		{"downgrade to a block tier keeps the last billing price", RatingInput{Start: invNov, End: invDec, OverageUnits: 1000, Segments: []TierSegment{
			{Tier: "pro", Name: "Pro", Overage: quota.OverageBill, OveragePriceCentsPer1K: 50, From: invNov, To: day(30)},
			{Tier: "free", Name: "Free", Overage: quota.OverageBlock, From: day(30), To: invDec}}}, []int64{0, 0}, 50, 50},
		{"huge overage saturates", RatingInput{Start: invNov, End: invDec, OverageUnits: math.MaxInt64, Segments: []TierSegment{
			{Name: "Pro", Overage: quota.OverageBill, OveragePriceCentsPer1K: quota.MaxPrice, From: invNov, To: invDec}}}, []int64{0}, math.MaxInt64, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lines := Rate(tt.in)
			var sub []int64
			over := int64(-1)
			for _, l := range lines {
				if l.AmountCents < 0 {
					t.Errorf("line %+v: negative amount", l)
				}
				switch l.Kind {
				case "subscription":
					sub = append(sub, l.AmountCents)
				case "overage":
					over = l.AmountCents
				}
			}
			if !reflect.DeepEqual(sub, tt.wantSub) {
				t.Errorf("subscription amounts: got %v, want %v", sub, tt.wantSub)
			}
			if over != tt.wantOver {
				t.Errorf("overage amount: got %d, want %d", over, tt.wantOver)
			}
			if got := TotalCents(lines); got != tt.wantTotal {
				t.Errorf("total: got %d, want %d", got, tt.wantTotal)
			}
		})
	}
}

func TestInvoiceLineFormat(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ got, want string }{
		{lineUnits(0), "0"},
		{lineUnits(999), "999"},
		{lineUnits(1000), "1,000"},
		{lineUnits(1234567), "1,234,567"},
		{lineMoney(5), "$0.05"},
		{lineMoney(4900), "$49.00"},
		{lineDays(86400 * 15), "15.0"},
		{lineDays(86400/20 - 1), "0.0"},
		{lineDays(86400 / 20), "0.1"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func ExampleRate() {
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	upgrade := time.Date(2026, 11, 16, 0, 0, 0, 0, time.UTC)
	end := start.AddDate(0, 1, 0)
	lines := Rate(RatingInput{
		Start: start, End: end,
		Segments: []TierSegment{
			{Tier: "free", Name: "Free", PriceCents: 0, MonthlyQuota: quota.Ptr[int64](10_000), Overage: quota.OverageBlock, From: start, To: upgrade},
			{Tier: "pro", Name: "Pro", PriceCents: 4900, MonthlyQuota: quota.Ptr[int64](1_000_000), Overage: quota.OverageBill, OveragePriceCentsPer1K: 50, From: upgrade, To: end},
		},
		Units: 1_012_345, OverageUnits: 12_345,
	})
	for _, l := range lines {
		fmt.Printf("%s | %s | %d | %d\n", l.Kind, l.Description, l.Quantity, l.AmountCents)
	}
	fmt.Println("total", TotalCents(lines))
	// Output:
	// subscription | Free plan, 2026-11-01 – 2026-11-16 (15.0 of 30 days) | 1296000 | 0
	// subscription | Pro plan, 2026-11-16 – 2026-12-01 (15.0 of 30 days) | 1296000 | 2450
	// included | Usage, included in Pro plan: 1,000,000 units per month | 1012345 | 0
	// overage | Overage: 12,345 units at $0.50 per 1,000 (Pro plan) | 12345 | 618
	// total 3068
}

// BenchmarkInvoicerRun measures one Run over 10,000 tenants whose drafts are
// already current (the steady state of the worker); the first Run, which
// writes every draft, is logged.
func BenchmarkInvoicerRun(b *testing.B) {
	ctx := context.Background()
	db := testenv.Postgres(b)
	const n = 10_000
	invExec(b, db, `INSERT INTO tenants (name, tier, webhook_secret, created_at)
		SELECT 'tenant ' || g, 'pro', decode(repeat('ab', 32), 'hex'), $2 FROM generate_series(1, $1) g`, n, invNov)
	invExec(b, db, `INSERT INTO tenant_tier_history (tenant_id, tier, valid_from) SELECT id, tier, created_at FROM tenants`)
	invExec(b, db, `INSERT INTO usage (tenant_id, hour, meter, units, requests, overage_units)
		SELECT id, $1::timestamptz + g * interval '1 hour', 'demo', 10, 10, 0 FROM tenants, generate_series(0, 23) g`, invNov)
	clock := &invClock{t: time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)}
	inv := NewInvoicer(db, clock.Now, time.Hour)
	start := time.Now()
	if err := inv.Run(ctx); err != nil {
		b.Fatal(err)
	}
	b.Logf("first Run over %d tenants: %v", n, time.Since(start))
	for b.Loop() {
		if err := inv.Run(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
