package billing

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// ledgerRow is what Postgres holds for one tenant over all hours and meters.
type ledgerRow struct{ units, overage, requests, rejected, shadowRefused, degraded int64 }

func (r *rig) ledgerOf(tb testing.TB, tenantID string) ledgerRow {
	tb.Helper()
	var l ledgerRow
	err := r.db.QueryRow(context.Background(), `
		SELECT coalesce(sum(units), 0)::bigint, coalesce(sum(overage_units), 0)::bigint, coalesce(sum(requests), 0)::bigint,
		       coalesce(sum(rejected), 0)::bigint, coalesce(sum(shadow_refused), 0)::bigint, coalesce(sum(degraded), 0)::bigint
		FROM usage WHERE tenant_id = $1`, tenantID).Scan(&l.units, &l.overage, &l.requests, &l.rejected, &l.shadowRefused, &l.degraded)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// TestRefundNetsOutWheneverItArrives refunds a request at every point of the
// flush protocol (while its units are pending, after the worker claimed them,
// after Postgres recorded them, after the batch was dropped): once the
// worker has flushed again, the ledger holds the admitted units minus the
// refunded ones, overage likewise, and still counts the request. A degraded
// request and shadow refusals counted with the refund (after a claim: in
// the same pending row as its negative units, which the ledger takes as a
// correction) are recorded once too.
func TestRefundNetsOutWheneverItArrives(t *testing.T) {
	t.Parallel()
	for _, at := range []string{"pending", "claimed", "committed", "finished"} {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			r := mustRig(t, nil)
			ids := r.tenants(t, 2, "pro")
			refunded, other := ids[0], ids[1]
			limits := quota.Limits{MonthlyQuota: quota.Ptr(int64(100))}
			// the refunded tenant's requests go through a shadow policy of
			// 1 request and a degrade policy of 2 (token buckets that refill
			// one per 1000 s)
			shadow, degrade := policed.shadow, policed.degrade
			shadow.Name, shadow.Capacity = "shadow-one", quota.Ptr(int64(1))
			degrade.Name, degrade.Capacity = "degrade-two", quota.Ptr(int64(2))
			calls := []quota.PolicyCall{{Policy: &shadow, Value: refunded, Limit: 1}, {Policy: &degrade, Value: refunded, Limit: 2}}
			seq := 0
			decide := func(id string, cost int64) quota.Decision {
				req := quota.Request{TenantID: id, Meter: "demo", Cost: cost, Limits: limits, Overage: quota.OverageBill}
				if id == refunded {
					seq++
					req.Policies, req.RequestID = calls, fmt.Sprintf("req-%d", seq)
				}
				d, err := r.rl.Admit(ctx, req)
				if err != nil {
					t.Fatalf("admit %d: %v", cost, err)
				}
				return d
			}
			admit := func(id string, cost int64) quota.Decision {
				d := decide(id, cost)
				if !d.Allowed {
					t.Fatalf("admit %d: %+v; want allowed", cost, d)
				}
				return d
			}
			admit(refunded, 60)
			failed := admit(refunded, 70) // 30 of them past the quota, billed as overage; shadow refused
			if failed.OverageUnits != 30 {
				t.Fatalf("overage of the second request: got %d, want 30", failed.OverageUnits)
			}
			admit(other, 5)
			if err := r.rl.ReportActive(ctx); err != nil {
				t.Fatal(err)
			}
			var once sync.Once
			refund := func() {
				once.Do(func() {
					// The upstream of the 70-unit request failed with a 5xx.
					if err := r.rl.Refund(ctx, refunded, "demo", 70, 30, failed.Now); err != nil {
						t.Error(err)
					}
					// In the same hour: shadow refused, degraded.
					if d := decide(refunded, 1); d.Allowed || d.Fallback == nil {
						t.Errorf("the third request: %+v, want the degrade policy's fallback", d)
					}
					if err := r.rl.ReportActive(ctx); err != nil {
						t.Error(err)
					}
				})
			}
			rc := r.reconciler()
			if at == "pending" {
				refund()
			} else {
				rc.hook = func(step string) error {
					if step == at {
						refund()
					}
					return nil
				}
			}
			// The refund reaches the ledger in the cycle after the one it
			// arrives in at the latest: the first cycle, or the second
			// after the batch was dropped (by the second cycle's claim).
			cycles := 2
			if at == "finished" {
				cycles = 3
			}
			for cycle := range cycles {
				if err := rc.Flush(ctx); err != nil {
					t.Fatalf("flush %d: %v", cycle+1, err)
				}
			}
			if err := rc.Close(ctx); err != nil { // the batches recorded last, dropped
				t.Fatal(err)
			}
			if got, want := r.ledgerOf(t, refunded), (ledgerRow{units: 60, overage: 0, requests: 2, shadowRefused: 2, degraded: 1}); got != want {
				t.Errorf("refunded tenant: got %+v, want %+v", got, want)
			}
			if got, want := r.ledgerOf(t, other), (ledgerRow{units: 5, requests: 1}); got != want {
				t.Errorf("other tenant: got %+v, want %+v", got, want)
			}
			if left, _ := r.rl.SweepTenants(ctx); len(left) != 0 {
				t.Errorf("tenants %v still have usage in Redis after the flushes", left)
			}
		})
	}
}

// TestRefundOfRecordedUsageAmidOverage refunds a request recorded already,
// in the hour in which the tenant went past its quota: the pending row then
// holds more overage than units (a row the ledger cannot take as it is), and
// the next flush still nets it out.
func TestRefundOfRecordedUsageAmidOverage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "pro")[0]
	limits := quota.Limits{MonthlyQuota: quota.Ptr(int64(100))}
	hour := time.Now().UTC().Truncate(time.Hour) // every request in this one hour
	admit := func(cost int64) quota.Decision {
		d, err := r.rl.Admit(ctx, quota.Request{TenantID: id, Meter: "demo", Cost: cost, Limits: limits, Overage: quota.OverageBill,
			Now: hour.Add(time.Duration(cost) * time.Second)})
		if err != nil || !d.Allowed {
			t.Fatalf("admit %d: %+v, %v; want allowed", cost, d, err)
		}
		if err := r.rl.ReportActive(ctx); err != nil {
			t.Fatal(err)
		}
		return d
	}
	rc := r.reconciler()
	first := admit(60)
	mustFlush(t, rc)
	if d := admit(70); d.OverageUnits != 30 {
		t.Fatalf("overage of the second request: got %d, want 30", d.OverageUnits)
	}
	if err := r.rl.Refund(ctx, id, "demo", 60, 0, first.Now); err != nil { // pending: 10 units, 30 overage
		t.Fatal(err)
	}
	mustFlush(t, rc)
	if got, want := r.ledgerOf(t, id), (ledgerRow{units: 70, overage: 30, requests: 2}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if n := rc.StuckBatches(); n != 0 {
		t.Errorf("%d batches stuck, want none", n)
	}
}

// syncBuffer is a bytes.Buffer a logger may write to while a test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// writeUnrecordable adds usage to the tenant's pending hash, as an older API
// node without the meter check would have counted it, under a meter longer
// than the ledger accepts (usage.meter is 1 to 64 characters): Postgres
// rejects the batch that carries it. It returns the fields it wrote.
func (r *rig) writeUnrecordable(tb testing.TB, tenantID string, hour time.Time) []string {
	tb.Helper()
	f := fmt.Sprintf("%d|%s|", hour.Unix(), strings.Repeat("m", 65))
	err := r.rdb.HSet(context.Background(), r.prefix+":v1:{t:"+tenantID+"}:pending", f+"u", 7, f+"r", 1).Err()
	if err != nil {
		tb.Fatal(err)
	}
	return []string{f + "u", f + "r"}
}

// TestUnrecordableBatchDoesNotBlockOthers makes one tenant's batch one that
// Postgres rejects, in the same chunk as other tenants: the others are
// flushed in that cycle and the next, the rejected batch stays in flight
// (logged with its tenant and id), and once its bad row is removed the next
// cycle records it.
func TestUnrecordableBatchDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	ids := r.tenants(t, 4, "pro")
	bad := ids[0]
	want := r.admit(t, ids, 80, 11)
	badFields := r.writeUnrecordable(t, bad, time.Now().UTC().Truncate(time.Hour))
	var logs syncBuffer
	rc := NewReconciler(r.db, r.rl, time.Now, slog.New(slog.NewJSONHandler(&logs, nil)))

	if err := rc.Flush(ctx); err != nil {
		t.Fatalf("flush = %v, want nil: one tenant's batch must not stop the others", err)
	}
	got := r.ledger(t)
	for _, id := range ids[1:] {
		if got[id] != want[id] {
			t.Errorf("tenant %s: %d units in Postgres after the flush, want the %d admitted", id, got[id], want[id])
		}
	}
	if got[bad] != 0 {
		t.Errorf("tenant %s: %d units of its rejected batch in Postgres, want none (a batch is recorded whole or not at all)", bad, got[bad])
	}
	flushing := r.prefix + ":v1:{t:" + bad + "}:flushing"
	batch, err := r.rdb.HGet(ctx, flushing, "batch").Result()
	if err != nil {
		t.Fatalf("the rejected batch is not in flight any more: %v", err)
	}
	for _, want := range []string{`"tenant_id":"` + bad + `"`, `"batch_id":"` + batch + `"`, "usage_meter_check"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logs.String())
		}
	}

	// Later cycles keep flushing the others while the batch is stuck.
	for id, u := range r.admit(t, ids, 80, 12) {
		want[id] += u
	}
	if err := rc.Flush(ctx); err != nil {
		t.Fatalf("second flush = %v, want nil", err)
	}
	got = r.ledger(t)
	for _, id := range ids[1:] {
		if got[id] != want[id] {
			t.Errorf("tenant %s: %d units in Postgres after the second flush, want %d", id, got[id], want[id])
		}
	}

	// An operator drops the bad row from the batch: the next cycle records
	// the rest of it, then the usage that waited behind it.
	if err := r.rdb.HDel(ctx, flushing, badFields...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Flush(ctx); err != nil {
		t.Fatalf("flush after the repair = %v, want nil", err)
	}
	equalUnits(t, r.ledger(t), want)
}
