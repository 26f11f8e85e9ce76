package billing

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestRecordOutageIsOnceByBatchID: fail-open usage written to the ledger
// directly counts once under its batch id, however often it is sent, and
// a later batch of negative units gives back units and the overage it
// names, clamped at the ledger's.
func TestRecordOutageIsOnceByBatchID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := mustRig(t, nil)
	id := r.tenants(t, 1, "free")[0]
	l := NewLedger(r.db)
	hour := time.Now().UTC().Truncate(time.Hour)
	b := quota.OutageBatch{ID: "outage-" + testenv.RandomHex(8), Request: quota.Request{TenantID: id},
		Rows: []quota.OutageRow{{Meter: "demo", Hour: hour, At: hour, Units: 7, Requests: 3}}}
	for range 3 {
		if err := l.RecordOutage(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.ledgerOf(t, id); got.units != 7 || got.requests != 3 || got.overage != 0 {
		t.Fatalf("ledger %+v, want 7 units, 3 requests, no overage (once)", got)
	}
	back := quota.OutageBatch{ID: "outage-" + testenv.RandomHex(8), Request: quota.Request{TenantID: id},
		Rows: []quota.OutageRow{{Meter: "demo", Hour: hour, At: hour, Units: -2, Overage: 5}}}
	if err := l.RecordOutage(ctx, back); err != nil {
		t.Fatal(err)
	}
	if got := r.ledgerOf(t, id); got.units != 5 || got.requests != 3 || got.overage != 0 {
		t.Fatalf("after giving back: ledger %+v, want 5 units, 3 requests, 0 overage", got)
	}
}
