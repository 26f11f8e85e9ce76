package billing

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

var repairLimits = quota.Limits{DailyQuota: quota.Ptr(int64(1000)), MonthlyQuota: quota.Ptr(int64(5000))}

// admitUnits admits cost units for the tenant and reports it active, as its
// API node would within a second.
func (r *rig) admitUnits(tb testing.TB, tenantID string, cost int64) {
	tb.Helper()
	d, err := r.rl.Admit(context.Background(), quota.Request{TenantID: tenantID, Meter: "demo", Cost: cost, Limits: repairLimits})
	if err != nil || !d.Allowed {
		tb.Fatalf("admit %d for %s: %+v, %v; want allowed", cost, tenantID, d, err)
	}
	if err := r.rl.ReportActive(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

func mustFlush(tb testing.TB, rc *Reconciler) {
	tb.Helper()
	if err := rc.Flush(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

// loseAndRepair reports the tenants active, flushes their usage to the
// ledger, loses the test's Redis keys and runs the repair.
func (r *rig) loseAndRepair(tb testing.TB, rc *Reconciler) {
	tb.Helper()
	ctx := context.Background()
	if err := r.rl.ReportActive(ctx); err != nil {
		tb.Fatal(err)
	}
	mustFlush(tb, rc)
	testenv.DeleteKeys(r.rdb, r.prefix+"*") // Redis loses this test's data
	if err := rc.Repair(ctx); err != nil {
		tb.Fatal(err)
	}
}

// checkUsed fails the test unless the tenant's daily and monthly counters in
// Redis hold used units.
func (r *rig) checkUsed(tb testing.TB, tenantID string, used int64, when string) {
	tb.Helper()
	d, err := r.rl.Peek(context.Background(), tenantID, repairLimits, time.Time{})
	if err != nil {
		tb.Fatal(err)
	}
	day, _ := d.Limit(quota.LimitDaily)
	month, _ := d.Limit(quota.LimitMonthly)
	if day.Remaining != 1000-used || month.Remaining != 5000-used {
		tb.Errorf("tenant %s %s: daily %d and monthly %d remaining, want %d and %d (%d used)",
			tenantID, when, day.Remaining, month.Remaining, 1000-used, 5000-used, used)
	}
}

// TestFailedRestoreIsRetriedNextCycle loses the test's Redis keys, then
// fails the restore once (Postgres rejects the repair's query): the next
// cycle restores the counters, instead of taking the loss as handled.
func TestFailedRestoreIsRetriedNextCycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "pro")[0]
	rc := r.reconciler()
	if err := rc.Repair(ctx); err != nil { // first start
		t.Fatal(err)
	}
	r.admitUnits(t, id, 300)
	mustFlush(t, rc)
	testenv.DeleteKeys(r.rdb, r.prefix+"*") // Redis loses this test's data
	invExec(t, r.db, `ALTER TABLE grants RENAME TO grants_away`)
	if err := rc.Repair(ctx); err == nil {
		t.Fatal("repair without the grants table = nil, want an error")
	}
	invExec(t, r.db, `ALTER TABLE grants_away RENAME TO grants`)
	if err := rc.Repair(ctx); err != nil {
		t.Fatal(err)
	}
	r.checkUsed(t, id, 300, "after the retried repair")
}

// TestRepairDetectsALossOnOneClusterMaster loses the test's keys on one
// master of a three-master cluster at a time (as a FLUSHALL there, or a
// failover to an empty replica, would): each loss is detected and the
// tenant on that master gets its counters back.
func TestRepairDetectsALossOnOneClusterMaster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Cluster(t)
	cc := c.(*redis.ClusterClient)
	r := mustRig(t, c)
	// One tenant per master.
	byMaster := map[string]string{}
	var masters []string
	for tries := 0; len(byMaster) < 3; tries++ {
		if tries > 200 {
			t.Fatalf("tenants landed on %d masters only, want 3", len(byMaster))
		}
		id := r.tenants(t, 1, "pro")[0]
		node, err := cc.MasterForKey(ctx, r.prefix+":v1:{t:"+id+"}:day")
		if err != nil {
			t.Fatal(err)
		}
		if addr := node.Options().Addr; byMaster[addr] == "" {
			byMaster[addr] = id
			masters = append(masters, addr)
		}
	}
	rc := r.reconciler()
	if err := rc.Repair(ctx); err != nil { // first start
		t.Fatal(err)
	}
	used := map[string]int64{}
	for _, id := range byMaster {
		r.admitUnits(t, id, 100)
		used[id] += 100
	}
	mustFlush(t, rc)
	for _, addr := range masters {
		id := byMaster[addr]
		node, err := cc.MasterForKey(ctx, r.prefix+":v1:{t:"+id+"}:day")
		if err != nil {
			t.Fatal(err)
		}
		testenv.DeleteKeys(node, r.prefix+"*") // this master alone loses the test's data
		if err := rc.Repair(ctx); err != nil {
			t.Fatal(err)
		}
		for _, other := range byMaster {
			r.checkUsed(t, other, used[other], "after a loss on master "+addr)
		}
		// Usage keeps flowing and being flushed between losses.
		r.admitUnits(t, id, 10)
		used[id] += 10
		mustFlush(t, rc)
	}
}

// TestRepairInTheTenantsCalendar: after a loss, a tenant 14 hours ahead of
// UTC with its billing month anchored on the 28th gets the counters of its
// own local day and billing period back (their ids are not the UTC day's
// and month's), from the ledger and its applied grants; a tenant of the
// default calendar beside it, its UTC ones.
func TestRepairInTheTenantsCalendar(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	ids := r.tenants(t, 2, "pro")
	invExec(t, r.db, `UPDATE tenants SET billing_anchor_day = 28, time_zone = 'Pacific/Kiritimati' WHERE id = $1`, ids[0])
	cal := quota.Tenant{BillingAnchorDay: 28, TimeZone: "Pacific/Kiritimati"}.Calendar()
	rc := r.reconciler()
	if err := rc.Repair(ctx); err != nil { // first start
		t.Fatal(err)
	}
	d, err := r.rl.Admit(ctx, quota.Request{TenantID: ids[0], Meter: "demo", Cost: 300, Limits: repairLimits, Calendar: cal})
	if err != nil || !d.Allowed {
		t.Fatalf("admit: %+v %v", d, err)
	}
	r.admitUnits(t, ids[1], 200)
	if err := r.rl.ReportActive(ctx); err != nil {
		t.Fatal(err)
	}
	mustFlush(t, rc)
	now := time.Now()
	pid := cal.PeriodID(now)
	invExec(t, r.db, `INSERT INTO grants (tenant_id, period, period_start, units, applied_at) VALUES
		($1, 'month', $2::date, 40, now()), ($1, 'day', $3::date, 7, now())`,
		ids[0], time.Date(pid/100, time.Month(pid%100), 28, 0, 0, 0, 0, time.UTC), time.Unix(cal.DayID(now)*86400, 0).UTC())
	testenv.DeleteKeys(r.rdb, r.prefix+"*") // Redis loses this test's data
	if err := rc.Repair(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := r.rl.PeekIn(ctx, ids[0], cal, repairLimits, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	day, _ := p.Limit(quota.LimitDaily)
	month, _ := p.Limit(quota.LimitMonthly)
	if day.Limit != 1007 || day.Remaining != 707 || month.Limit != 5040 || month.Remaining != 4740 {
		t.Fatalf("calendar tenant after the repair: daily %+v, monthly %+v; want 707 of 1007 and 4740 of 5040 left", day, month)
	}
	r.checkUsed(t, ids[1], 200, "default tenant after the repair")
}

// TestRepairRestoresMeterQuotas: after a loss, a meter quota's counters
// come back from the ledger (units of the day and month, the month's units
// past the quota), so the meter's quota is not granted anew.
func TestRepairRestoresMeterQuotas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	invExec(t, r.db, `UPDATE tiers SET meter_quotas = '[{"meter": "search", "daily_quota": 500, "monthly_quota": 100,
		"overage": "bill", "overage_price_cents_per_1k": 50}]' WHERE slug = 'pro'`)
	id := r.tenants(t, 1, "pro")[0]
	qs := []quota.MeterQuota{{Meter: "search", DailyQuota: quota.Ptr(int64(500)), MonthlyQuota: quota.Ptr(int64(100)),
		Overage: quota.OverageBill, OveragePriceCentsPer1K: 50}}
	rc := r.reconciler()
	if err := rc.Repair(ctx); err != nil { // first start
		t.Fatal(err)
	}
	d, err := r.rl.Admit(ctx, quota.Request{TenantID: id, Meter: "search", Cost: 130, Limits: repairLimits, MeterQuotas: qs})
	if err != nil || !d.Allowed {
		t.Fatalf("admit: %+v %v", d, err)
	}
	r.loseAndRepair(t, rc)
	ls, err := r.rl.PeekMeterQuotas(ctx, id, quota.Calendar{}, qs, time.Time{})
	if err != nil || len(ls) != 2 || ls[0].Remaining != 370 || ls[1].Remaining != 0 {
		t.Fatalf("meter quotas after the repair: %+v %v; want 370 of the day's 500 and none of the month's 100 left", ls, err)
	}
	// the next search is the meter's overage, not a fresh quota's unit
	d, err = r.rl.Admit(ctx, quota.Request{TenantID: id, Meter: "search", Cost: 1, Limits: repairLimits, MeterQuotas: qs})
	if err != nil || !d.Allowed {
		t.Fatalf("admit: %+v %v", d, err)
	}
	rows, err := r.rl.Pending(ctx, id)
	if err != nil || len(rows) != 1 || rows[0].MeterOverage != 1 {
		t.Fatalf("pending after the repair: %+v %v, want 1 unit of meter overage", rows, err)
	}
}

// TestRepairKeepsTheSpendCap: a month's overage fills its spend cap (5
// cents at a cent a unit), is flushed to the ledger, and Redis loses the
// tenant's keys; after the repair the month's overage counts against the
// cap again (the tier's overage units, and the meters' overage millicents
// at the meter quota's price), so the next unit of overage is refused
// spend_cap, not billed a second time up to the cap. For the tier's
// overage alone, the tier's beside a billed meter quota (the cap counted
// in millicents), and a meter quota's overage.
func TestRepairKeepsTheSpendCap(t *testing.T) {
	t.Parallel()
	search := []quota.MeterQuota{{Meter: "search", MonthlyQuota: quota.Ptr(int64(0)), Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}}
	for _, tc := range []struct {
		name   string
		meter  string
		cost   int64 // fills the cap: the tier's quota of 10, then 5 cents
		quotas []quota.MeterQuota
	}{
		{"tier", "demo", 15, nil},
		{"tier beside a billed meter quota", "demo", 15, search},
		{"meter quota", "search", 5, search},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			r := mustRig(t, nil)
			if tc.quotas != nil {
				invExec(t, r.db, `UPDATE tiers SET meter_quotas = '[{"meter": "search", "monthly_quota": 0,
					"overage": "bill", "overage_price_cents_per_1k": 1000}]' WHERE slug = 'pro'`)
			}
			id := r.tenants(t, 1, "pro")[0]
			req := func(cost int64) quota.Request {
				return quota.Request{TenantID: id, Meter: tc.meter, Cost: cost, MeterQuotas: tc.quotas,
					Limits:  quota.Limits{MonthlyQuota: quota.Ptr(int64(10)), MaxOverageCents: quota.Ptr(int64(5))},
					Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
			}
			admit := func(cost int64) quota.Decision {
				t.Helper()
				d, err := r.rl.Admit(ctx, req(cost))
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			spendCapped := func(when string) {
				t.Helper()
				if d := admit(1); d.Allowed || !slices.Equal(d.Violated, []quota.LimitName{quota.LimitSpendCap}) {
					t.Errorf("%s: a unit of overage %+v, want refused spend_cap", when, d)
				}
				if l, ok, err := r.rl.PeekSpendCap(ctx, req(1), time.Time{}); err != nil || !ok || l.Remaining != 0 {
					t.Errorf("%s: spend cap %+v %v %v, want none of 5 cents left", when, l, ok, err)
				}
			}
			rc := r.reconciler()
			if err := rc.Repair(ctx); err != nil { // first start
				t.Fatal(err)
			}
			if d := admit(tc.cost); !d.Allowed {
				t.Fatalf("admit %d: %+v", tc.cost, d)
			}
			spendCapped("before the loss")
			r.loseAndRepair(t, rc)
			spendCapped("after the repair")
		})
	}
}

// snapshot returns the test's Redis keys as DUMP and PTTL would restore
// them: Redis as its files held it at that moment.
func (r *rig) snapshot(tb testing.TB) map[string][2]string {
	tb.Helper()
	ctx := context.Background()
	var keys []string
	var mu sync.Mutex
	err := redisfn.ForEachMaster(ctx, r.rdb, func(ctx context.Context, c *redis.Client) error {
		got, err := c.Keys(ctx, r.prefix+"*").Result()
		mu.Lock()
		keys = append(keys, got...)
		mu.Unlock()
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string][2]string{}
	for _, k := range keys {
		v, err := r.rdb.Dump(ctx, k).Result()
		if err != nil {
			tb.Fatal(err)
		}
		ttl, err := r.rdb.PTTL(ctx, k).Result()
		if err != nil {
			tb.Fatal(err)
		}
		out[k] = [2]string{v, strconv.FormatInt(max(ttl.Milliseconds(), 0), 10)}
	}
	return out
}

// goBack replaces the test's Redis keys with a snapshot's, as a restart
// from older files or a failover to a replica behind would.
func (r *rig) goBack(tb testing.TB, snap map[string][2]string) {
	tb.Helper()
	ctx := context.Background()
	testenv.DeleteKeys(r.rdb, r.prefix+"*")
	for k, v := range snap {
		ttl, _ := strconv.ParseInt(v[1], 10, 64)
		if err := r.rdb.RestoreReplace(ctx, k, time.Duration(ttl)*time.Millisecond, v[0]).Err(); err != nil {
			tb.Fatal(err)
		}
	}
}

// TestRedisBackWithOlderDataBillsOnce: Redis goes back to data from before
// 17 flushes, holding a batch in flight (recorded since, and no longer
// among its tenant's recent sequences) and usage pending (recorded since
// in a batch Redis no longer knows it claimed). A worker that does not lead
// records neither, and has the counters restored: the leader's repair
// raises them to the ledger's. Usage counted after that is billed.
func TestRedisBackWithOlderDataBillsOnce(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) { t.Parallel(); testRedisBackWithOlderData(t, testenv.Redis(t)) })
	t.Run("cluster", func(t *testing.T) { t.Parallel(); testRedisBackWithOlderData(t, testenv.Cluster(t)) })
}

func testRedisBackWithOlderData(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	r := mustRig(t, rdb)
	id := r.tenants(t, 1, "pro")[0]
	rc := r.reconciler()
	cycle := func() {
		t.Helper()
		if err := rc.Repair(ctx); err != nil {
			t.Fatal(err)
		}
		mustFlush(t, rc)
	}
	cycle() // first start
	r.admitUnits(t, id, 1)
	cycle()
	r.admitUnits(t, id, 5)
	cycle() // 5 recorded, its batch still in flight until the next claim
	r.admitUnits(t, id, 6)
	snap := r.snapshot(t) // the in-flight 5 and the pending 6
	for range recentSeqs + 1 {
		r.admitUnits(t, id, 1)
		cycle()
	}
	const before = 1 + 5 + 6 + recentSeqs + 1
	if got := r.ledger(t)[id]; got != before {
		t.Fatalf("ledger before Redis went back: %d, want %d", got, before)
	}
	r.goBack(t, snap)
	r.checkUsed(t, id, 12, "in the older data")

	other := r.reconciler()
	other.Share = leadNot{}
	mustFlush(t, other)
	if got := r.ledger(t)[id]; got != before {
		t.Fatalf("ledger after a worker flushed the older data: %d, want %d (nothing billed twice)", got, before)
	}
	if n := other.OlderDataBatches.Load(); n != 2 {
		t.Errorf("%d batches counted as from older data, want 2 (the one in flight, the one of the pending usage)", n)
	}
	if n := other.RescuedBatches.Load(); n != 0 {
		t.Errorf("%d batches rescued, want none", n)
	}
	if lost, err := r.rl.EpochLost(ctx); err != nil || !lost {
		t.Fatalf("after older data was found: epoch lost %t (%v), want a restore asked for", lost, err)
	}
	cycle()
	if got := r.ledger(t)[id]; got != before {
		t.Fatalf("ledger after the repair: %d, want %d", got, before)
	}
	r.checkUsed(t, id, before, "after the repair")
	r.admitUnits(t, id, 4)
	cycle()
	if got := r.ledger(t)[id]; got != before+4 {
		t.Fatalf("ledger after usage counted since: %d, want %d", got, before+4)
	}
	r.checkUsed(t, id, before+4, "a cycle later")
}

// leadNot is the Share of a worker that owns every tenant and does not lead.
type leadNot struct{}

func (leadNot) Owns(string) bool { return true }
func (leadNot) Leads() bool      { return false }

// TestUsageAfterOlderDataIsBilled: after Redis went back to older data on
// a clock behind the ledger's, the batch claimed from it is dropped, and
// the usage counted after it, claimed below the ledger's greatest
// sequence, is recorded: the batch from older data became the one it
// follows.
func TestUsageAfterOlderDataIsBilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "pro")[0]
	rc := r.reconciler()
	r.admitUnits(t, id, 1)
	mustFlush(t, rc)
	r.admitUnits(t, id, 6)
	snap := r.snapshot(t) // the 1 in flight, the 6 pending
	mustFlush(t, rc)
	// A batch claimed since on a clock far ahead was the last recorded.
	ahead := int64(1) << 60
	seq, _ := r.flushedRow(t, id)
	invExec(t, r.db, `UPDATE usage_flushed SET seq = $2, recent = (ARRAY[$2::bigint] || recent)[1:16], prev = $3, prev_of = $2
		WHERE tenant_id = $1`, id, ahead, seq)
	r.goBack(t, snap)
	if err := r.rl.ReportActive(ctx); err != nil {
		t.Fatal(err)
	}
	rc = r.reconciler()
	mustFlush(t, rc)
	if got := r.ledger(t)[id]; got != 7 {
		t.Fatalf("ledger after the older data's flush: %d, want 7", got)
	}
	if n := rc.OlderDataBatches.Load(); n != 1 {
		t.Fatalf("%d batches from older data, want 1 (the pending 6)", n)
	}
	r.admitUnits(t, id, 4)
	mustFlush(t, rc)
	if got := r.ledger(t)[id]; got != 11 {
		t.Fatalf("ledger after usage counted since: %d, want 11", got)
	}
	if n, m := rc.OlderDataBatches.Load(), rc.RescuedBatches.Load(); n != 1 || m != 1 {
		t.Fatalf("%d batches from older data and %d rescued, want 1 and 1", n, m)
	}
}
