package billing

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

// gate is one run of TestMonthIsFinalizedOnlyAfterACompleteFlush.
type gate struct {
	*rig
	proc   *testenv.RedisProcess // the test's own Redis, when it stops it
	tenant string
	clock  *invClock
	rc     *Reconciler
	inv    *Invoicer
	stuck  []string // fields of an unrecordable row in the tenant's usage
}

func (g *gate) admit(tb testing.TB, at time.Time, cost int64) {
	tb.Helper()
	_, err := g.rl.Admit(context.Background(), quota.Request{TenantID: g.tenant, Meter: "demo", Cost: cost, Now: at,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(1 << 40))}})
	if err != nil {
		tb.Fatal(err)
	}
}

// november returns the status of the tenant's November invoice ("none" when
// there is none) and the units of its included line.
func (g *gate) november(tb testing.TB) (status string, included int64) {
	tb.Helper()
	err := g.db.QueryRow(context.Background(), `
		SELECT coalesce((SELECT status FROM invoices WHERE tenant_id = $1 AND period = $2), 'none'),
		       coalesce((SELECT l.quantity FROM invoice_lines l JOIN invoices i ON i.id = l.invoice_id
		                 WHERE i.tenant_id = $1 AND i.period = $2 AND l.kind = 'included'), 0)`,
		g.tenant, invNov).Scan(&status, &included)
	if err != nil {
		tb.Fatal(err)
	}
	return status, included
}

// TestMonthIsFinalizedOnlyAfterACompleteFlush ends November with usage of
// its last hour still in Redis and the invoice grace over, and keeps the
// flush from completing in several ways: November is not finalized. Once a
// flush that began after November and swept the keyspace completes, it is,
// with that usage.
func TestMonthIsFinalizedOnlyAfterACompleteFlush(t *testing.T) {
	t.Parallel()
	afterGrace := invDec.Add(90 * time.Minute) // grace: one hour
	tests := []struct {
		name       string
		ownRedis   bool
		before     func(t *testing.T, g *gate) // before November ends
		breakFlush func(t *testing.T, g *gate)
		fix        func(t *testing.T, g *gate)
		flushFails bool  // the flush while broken returns an error
		included   int64 // November's units once final
	}{
		{
			name: "Postgres rejects the flush",
			breakFlush: func(t *testing.T, g *gate) {
				invExec(t, g.db, `ALTER TABLE usage_flushed RENAME TO usage_flushed_away`)
			},
			fix: func(t *testing.T, g *gate) {
				invExec(t, g.db, `ALTER TABLE usage_flushed_away RENAME TO usage_flushed`)
			},
			flushFails: true,
			included:   40,
		},
		{
			name: "a batch of the month is stuck",
			breakFlush: func(t *testing.T, g *gate) {
				g.stuck = g.writeUnrecordable(t, g.tenant, invDec.Add(-time.Hour))
			},
			fix: func(t *testing.T, g *gate) {
				key := g.prefix + ":v1:{t:" + g.tenant + "}:flushing"
				if err := g.rdb.HDel(context.Background(), key, g.stuck...).Err(); err != nil {
					t.Fatal(err)
				}
			},
			included: 40,
		},
		{
			name:       "Redis is down",
			ownRedis:   true,
			breakFlush: func(t *testing.T, g *gate) { g.proc.Stop() },
			fix:        func(t *testing.T, g *gate) { g.proc.Start() },
			flushFails: true,
			included:   0, // lost with Redis' data: at most one interval of usage
		},
		{
			name: "no sweep since the month ended",
			before: func(t *testing.T, g *gate) {
				g.rc.SweepEvery = 24 * time.Hour
				g.clock.Set(invDec.Add(-15 * time.Minute))
				if err := g.rc.Flush(context.Background()); err != nil { // sweeps
					t.Fatal(err)
				}
				// Counted by an API node that died before reporting it:
				// only a sweep finds it.
				g.admit(t, invDec.Add(-10*time.Minute), 7)
				if err := g.rdb.Del(context.Background(), g.prefix+":v1:active").Err(); err != nil {
					t.Fatal(err)
				}
			},
			breakFlush: func(t *testing.T, g *gate) {},
			fix:        func(t *testing.T, g *gate) { g.clock.Set(invDec.Add(-15 * time.Minute).Add(24 * time.Hour)) },
			included:   47,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var rdb redis.UniversalClient
			var proc *testenv.RedisProcess
			if tt.ownRedis {
				proc = testenv.StartRedis(t)
				opts, _ := redisdb.ParseURL(proc.URL)
				var err error
				if rdb, err = redisdb.Open(ctx, opts); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { rdb.Close() })
			}
			g := &gate{rig: mustRig(t, rdb), proc: proc, clock: &invClock{t: invDec.Add(-time.Hour)}}
			g.tenant = invTenant(t, g.db, "pro", invNov)
			g.rc = NewReconciler(g.db, g.rl, g.clock.Now, quiet)
			g.inv = NewInvoicer(g.db, g.clock.Now, time.Hour)
			g.inv.FlushedThrough = g.rc.FlushedThrough
			g.admit(t, invDec.Add(-40*time.Minute), 40)
			if err := g.rl.ReportActive(ctx); err != nil {
				t.Fatal(err)
			}
			if tt.before != nil {
				tt.before(t, g)
			}

			g.clock.Set(afterGrace)
			tt.breakFlush(t, g)
			if err := g.rc.Flush(ctx); (err != nil) != tt.flushFails {
				t.Fatalf("flush while broken = %v, want an error: %t", err, tt.flushFails)
			}
			if err := g.inv.Run(ctx); err != nil {
				t.Fatal(err)
			}
			if status, _ := g.november(t); status == "final" {
				t.Fatalf("November is final after a flush that did not complete")
			}

			// Some minutes later (the flush that failed may have swept; the
			// next sweep is due again), the cause is gone.
			g.clock.Set(afterGrace.Add(10 * time.Minute))
			tt.fix(t, g)
			if err := g.rc.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := g.inv.Run(ctx); err != nil {
				t.Fatal(err)
			}
			if status, included := g.november(t); status != "final" || included != tt.included {
				t.Fatalf("November after a complete flush: %s with %d units included, want final with %d", status, included, tt.included)
			}
		})
	}
}
