package worker

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// planClock is an injected clock the test moves by hand.
type planClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *planClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *planClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func planExec(tb testing.TB, db *pgxpool.Pool, sql string, args ...any) {
	tb.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

// mustPlans returns the tier changes of a worker (or an API node) on db and
// Redis c under prefix, on clock.
func mustPlans(tb testing.TB, db *pgxpool.Pool, c redis.UniversalClient, prefix string, clock func() time.Time) (*catalog.Plans, *catalog.Catalog) {
	tb.Helper()
	store := catalogdb.NewStore(db)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cat := catalog.New(store, c, prefix, log, clock)
	return catalog.NewPlans(store, quotaredis.New(c, prefix), cat, clock, log), cat
}

// TestPendingDowngradeAppliedAtTheBoundary: a downgrade from pro to free
// asked on November 20th waits for December 1st; two workers running late
// (at 00:07) apply it once between them, closing the tier history at
// midnight exactly, auditing it as the worker and invalidating the tenant
// on another node; November's invoice has a whole month of pro, December's
// is free.
func TestPendingDowngradeAppliedAtTheBoundary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	nov := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	dec := nov.AddDate(0, 1, 0)
	clock := &planClock{t: time.Date(2026, 11, 20, 15, 30, 0, 0, time.UTC)}
	store := catalogdb.NewStore(db)
	tenant, err := store.CreateTenant(ctx, "test", "Acme", "pro")
	if err != nil {
		t.Fatal(err)
	}
	planExec(t, db, `UPDATE tenants SET created_at = $2 WHERE id = $1`, tenant.ID, nov)
	planExec(t, db, `UPDATE tenant_tier_history SET valid_from = $2 WHERE tenant_id = $1`, tenant.ID, nov)

	api, _ := mustPlans(t, db, rdb, prefix, clock.Now)
	got, reset, err := api.Change(ctx, "admin", tenant.ID, &quota.PlanRequest{Tier: "free"}, func(*quota.Tenant) error { return nil })
	if err != nil || reset != catalog.ResetNone {
		t.Fatalf("downgrade: %v, reset %q", err, reset)
	}
	if p := got.PendingChange; got.Tier != "pro" || p == nil || !p.EffectiveAt.Equal(dec) || !p.RequestedAt.Equal(clock.Now()) {
		t.Fatalf("downgrade: %+v %+v, want pro with free pending from %s", got, p, dec)
	}

	// Another node caches the tenant as pro.
	_, otherCat := mustPlans(t, db, testenv.Redis(t), prefix, clock.Now)
	runCtx, stop := context.WithCancel(ctx)
	ready := make(chan struct{})
	go otherCat.Run(runCtx, time.Hour, ready)
	t.Cleanup(stop)
	<-ready
	if p, err := otherCat.Principal(ctx, tenant.ID); err != nil || p.Tier.Slug != "pro" {
		t.Fatalf("other node: %+v, %v; want pro", p.Tier.Slug, err)
	}

	clock.Set(dec.Add(-time.Second))
	if n, err := api.ApplyDue(ctx); err != nil || n != 0 {
		t.Fatalf("a second before the boundary: %d applied, %v; want none", n, err)
	}

	clock.Set(dec.Add(7 * time.Minute))
	w1, _ := mustPlans(t, db, rdb, prefix, clock.Now)
	w2, _ := mustPlans(t, db, testenv.Redis(t), prefix, clock.Now)
	var wg sync.WaitGroup
	counts := make([]int, 2)
	for i, w := range []*catalog.Plans{w1, w2} {
		wg.Go(func() {
			n, err := w.ApplyDue(ctx)
			if err != nil {
				t.Errorf("worker %d: %v", i, err)
			}
			counts[i] = n
		})
	}
	wg.Wait()
	if counts[0]+counts[1] != 1 {
		t.Fatalf("two workers applied %v changes, want 1 between them", counts)
	}
	if n, err := w1.ApplyDue(ctx); err != nil || n != 0 {
		t.Fatalf("a retry: %d applied, %v; want none", n, err)
	}

	after, err := store.Tenant(ctx, tenant.ID)
	if err != nil || after.Tier != "free" || after.PendingChange != nil {
		t.Fatalf("after the boundary: %+v, %v; want free with nothing pending", after, err)
	}
	rows, _ := db.Query(ctx, `SELECT tier, valid_from, valid_to FROM tenant_tier_history WHERE tenant_id = $1 ORDER BY valid_from`, tenant.ID)
	type stretch struct {
		Tier string
		From time.Time
		To   *time.Time
	}
	hist, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stretch])
	if err != nil || len(hist) != 2 || hist[0].Tier != "pro" || !hist[0].From.Equal(nov) || hist[0].To == nil || !hist[0].To.Equal(dec) ||
		hist[1].Tier != "free" || !hist[1].From.Equal(dec) || hist[1].To != nil {
		t.Fatalf("tier history: %+v, %v; want pro [Nov 1, Dec 1), free from Dec 1", hist, err)
	}
	var audits int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE entity = 'tenant' AND entity_id = $1 AND actor = 'worker'
		AND after->>'tier' = 'free' AND after->'pending_change' = 'null'::jsonb`, tenant.ID).Scan(&audits); err != nil || audits != 1 {
		t.Fatalf("worker audit entries: %d, %v; want 1", audits, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, err := otherCat.Principal(ctx, tenant.ID)
		if err == nil && p.Tier.Slug == "free" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("other node after the change: %s, %v; want free within 5 s", p.Tier.Slug, err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	invoices := billing.NewInvoicer(db, clock.Now, time.Hour)
	novInv, err := invoices.Generate(ctx, tenant.ID, nov)
	if err != nil {
		t.Fatal(err)
	}
	if novInv.TotalCents != 4900 || len(novInv.Lines) == 0 || novInv.Lines[0].Description != "Pro plan, 2026-11-01 – 2026-12-01 (30.0 of 30 days)" ||
		novInv.Lines[0].AmountCents != 4900 || novInv.Lines[0].Quantity != 30*86400 {
		t.Errorf("November: %d cents, lines %+v; want a whole month of pro, 4900", novInv.TotalCents, novInv.Lines)
	}
	decInv, err := invoices.Generate(ctx, tenant.ID, dec)
	if err != nil {
		t.Fatal(err)
	}
	if decInv.TotalCents != 0 || len(decInv.Lines) == 0 || decInv.Lines[0].Description != "Free plan, 2026-12-01 – 2027-01-01 (31.0 of 31 days)" {
		t.Errorf("December: %d cents, lines %+v; want free all month", decInv.TotalCents, decInv.Lines)
	}
}

// TestQuotaResetWhenRedisFails: a tier change now with quota reset made
// while Redis does not answer stands (answered with the reset pending);
// the worker's plans step empties the counters afterwards, once: a second
// run, after more usage, empties nothing.
func TestQuotaResetWhenRedisFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	store := catalogdb.NewStore(db)
	tenant, err := store.CreateTenant(ctx, "test", "Acme", "free")
	if err != nil {
		t.Fatal(err)
	}
	runner := quotaredis.New(rdb, prefix)
	admit := func() quota.Decision {
		t.Helper()
		d, err := runner.Admit(ctx, quota.Request{TenantID: tenant.ID, Meter: "demo", Cost: 5,
			Limits: quota.Limits{DailyQuota: quota.Ptr(int64(1000)), MonthlyQuota: quota.Ptr(int64(10000))}})
		if err != nil || !d.Allowed {
			t.Fatalf("admit: %+v, %v", d, err)
		}
		return d
	}
	admit()
	admit()

	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = dead.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	broken := catalog.NewPlans(store, quotaredis.New(dead, prefix), catalog.New(store, dead, prefix, log, time.Now), time.Now, log)
	got, reset, err := broken.Change(ctx, "admin", tenant.ID, &quota.PlanRequest{Tier: "pro", Quota: quota.QuotaReset},
		func(*quota.Tenant) error { return nil })
	if err != nil || got.Tier != "pro" || reset != catalog.ResetPending {
		t.Fatalf("change with Redis away: %+v, reset %q, %v; want pro, reset pending", got.Tier, reset, err)
	}
	var unapplied int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM quota_resets WHERE tenant_id = $1 AND applied_at IS NULL`, tenant.ID).Scan(&unapplied); err != nil || unapplied != 1 {
		t.Fatalf("unapplied resets: %d, %v; want 1", unapplied, err)
	}
	admit() // usage counted before the reset is applied: emptied with it

	worker, _ := mustPlans(t, db, rdb, prefix, time.Now)
	if _, err := worker.ApplyDue(ctx); err != nil {
		t.Fatal(err)
	}
	left := func(d quota.Decision) (int64, int64) {
		t.Helper()
		day, _ := d.Limit(quota.LimitDaily)
		month, _ := d.Limit(quota.LimitMonthly)
		return day.Remaining, month.Remaining
	}
	if d, m := left(admit()); d != 1000-5 || m != 10000-5 {
		t.Fatalf("after the worker's reset: daily remaining %d, monthly %d; want 995 and 9995", d, m)
	}
	if _, err := worker.ApplyDue(ctx); err != nil {
		t.Fatal(err)
	}
	if d, m := left(admit()); d != 1000-10 || m != 10000-10 {
		t.Fatalf("after a second run: daily remaining %d, monthly %d; want 990 and 9990 (the reset applied once)", d, m)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM quota_resets WHERE tenant_id = $1 AND applied_at IS NULL`, tenant.ID).Scan(&unapplied); err != nil || unapplied != 0 {
		t.Fatalf("unapplied resets after the worker: %d, %v; want 0", unapplied, err)
	}
}
