package billing

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// TestLedgerBillsTheOverageRedisHolds follows a tenant whose tier bills
// past 20 units a month (a cent a unit) and whose "search" meter bills
// past 10 (2 cents), capped at a dollar, through refunds and settlements
// that cross an hour and a month: A (search, 10, March 31 22:30) fits the
// meter's quota, B (search, 10, 23:30) is all the meter's overage, C
// (demo, 8) the tier's, D and F (search, 5 and 4, reserved for a
// settlement) the meter's again; A is refunded; April begins (demo, 1;
// search, 12: 2 of the meter's overage in April); then D is settled up to
// 12 and F down to 1, after the roll. The ledger, once flushed, bills per
// month exactly the overage Redis holds for that month (the tier's and
// the meter's), and a prepaid tenant's credit drawn is their cost: 8 and
// 23 units in March (54,000 millicents), 0 and 2 in April.
func TestLedgerBillsTheOverageRedisHolds(t *testing.T) {
	t.Parallel()
	for _, prepaid := range []bool{false, true} {
		t.Run(fmt.Sprintf("prepaid=%t", prepaid), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			r := mustRig(t, nil)
			id := r.tenants(t, 1, "pro")[0]
			qs := []quota.MeterQuota{{Meter: "search", MonthlyQuota: quota.Ptr(int64(10)), Overage: quota.OverageBill, OveragePriceCentsPer1K: 2000}}
			req := func(meter string, cost int64, at string) quota.Request {
				now, err := time.Parse(time.RFC3339, at)
				if err != nil {
					t.Fatal(err)
				}
				q := quota.Request{TenantID: id, Meter: meter, Cost: cost, Now: now, MeterQuotas: qs,
					Limits:  quota.Limits{MonthlyQuota: quota.Ptr(int64(20)), MaxOverageCents: quota.Ptr(int64(100))},
					Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000}
				if prepaid {
					q.Prepaid = &quota.Prepaid{BalanceMillicents: 10_000_000, PeriodID: quota.Calendar{}.PeriodID(now)}
					if q.Prepaid.PeriodID == 203104 {
						q.Prepaid.PrevID = 203103
					}
				}
				return q
			}
			admit := func(q quota.Request) quota.Decision {
				t.Helper()
				d, err := r.rl.Admit(ctx, q)
				if err != nil || !d.Allowed {
					t.Fatalf("admit %s %d at %s: %v %+v", q.Meter, q.Cost, q.Now, err, d)
				}
				return d
			}
			reserve := func(q quota.Request, rid string) {
				t.Helper()
				if err := r.rl.Reserve(ctx, rid, q, admit(q)); err != nil {
					t.Fatal(err)
				}
			}
			settle := func(rid string, actual int64) {
				t.Helper()
				if s, err := r.rl.Settle(ctx, id, rid, actual); err != nil || s.Status != quota.SettleApplied {
					t.Fatalf("settle %s: %+v %v", rid, s, err)
				}
			}
			a := req("search", 10, "2031-03-31T22:30:00Z")
			da := admit(a)
			admit(req("search", 10, "2031-03-31T23:30:00Z"))
			admit(req("demo", 8, "2031-03-31T23:40:00Z"))
			reserve(req("search", 5, "2031-03-31T23:50:00Z"), "d-"+id)
			reserve(req("search", 4, "2031-03-31T23:58:00Z"), "f-"+id)
			if err := r.rl.RefundRequest(ctx, a, da); err != nil {
				t.Fatal(err)
			}
			admit(req("demo", 1, "2031-04-01T00:05:00Z"))
			admit(req("search", 12, "2031-04-01T00:06:00Z"))
			settle("d-"+id, 12)
			settle("f-"+id, 1)

			if err := r.rl.ReportActive(ctx); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if err := r.reconciler().Flush(ctx); err != nil {
					t.Fatal(err)
				}
			}
			ledger := func(from, to string) (over, meterOver int64) {
				t.Helper()
				err := r.db.QueryRow(ctx, `SELECT coalesce(sum(overage_units), 0)::bigint, coalesce(sum(meter_overage_units), 0)::bigint
					FROM usage WHERE tenant_id = $1 AND hour >= $2 AND hour < $3`, id, from, to).Scan(&over, &meterOver)
				if err != nil {
					t.Fatal(err)
				}
				return over, meterOver
			}
			// what Redis holds: the tier's month (the state's field q, and
			// w for the month before) and the meter's (its field, and
			// "search|w")
			fields := func(key string, names ...string) []string {
				t.Helper()
				v, err := r.rdb.HMGet(ctx, key, names...).Result()
				if err != nil {
					t.Fatal(err)
				}
				out := make([]string, len(v))
				for i, x := range v {
					out[i], _ = x.(string)
				}
				return out
			}
			nums := func(s string) []int64 {
				var out []int64
				for _, p := range strings.Split(s, ",") {
					n, _ := strconv.ParseInt(p, 10, 64)
					out = append(out, n)
				}
				return out
			}
			state := fields(r.prefix+":v2:{t:"+id+"}", "q", "w")
			meter := fields(r.prefix+":v1:{t:"+id+"}:mq", "search", "search|w", "P")
			redisOver := map[int64][2]int64{}
			if q := nums(state[0]); len(q) == 8 {
				redisOver[q[3]] = [2]int64{q[6], 0}
			}
			if w := nums(state[1]); len(w) == 4 {
				redisOver[w[0]] = [2]int64{w[3], 0}
			}
			if f := nums(meter[0]); len(f) == 5 {
				redisOver[f[2]] = [2]int64{redisOver[f[2]][0], f[4]}
			}
			if w := nums(meter[1]); len(w) == 3 {
				redisOver[w[0]] = [2]int64{redisOver[w[0]][0], w[2]}
			}
			for _, m := range []struct {
				id       int64
				from, to string
				want     [2]int64
			}{
				{203103, "2031-03-01T00:00:00Z", "2031-04-01T00:00:00Z", [2]int64{8, 23}},
				{203104, "2031-04-01T00:00:00Z", "2031-05-01T00:00:00Z", [2]int64{0, 2}},
			} {
				o, mo := ledger(m.from, m.to)
				if got := [2]int64{o, mo}; got != m.want || redisOver[m.id] != m.want {
					t.Errorf("%d: the ledger bills %v (tier's, meter's overage), Redis holds %v; want %v in both", m.id, got, redisOver[m.id], m.want)
				}
			}
			if prepaid {
				if p := nums(meter[2]); len(p) != 4 || p[0] != 203104 || p[1] != 2*2000 || p[2] != 203103 || p[3] != 8*1000+23*2000 {
					t.Errorf("credit drawn %q, want April's 4,000 and March's 54,000 millicents", meter[2])
				}
			}
		})
	}
}
