package admission

import (
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// TestLocalLimiterAnswersAnErrorNotAPanic: limits the runner would refuse
// never reach the local limiter, but if they did, the node answers an
// error and stays up.
func TestLocalLimiterAnswersAnErrorNotAPanic(t *testing.T) {
	t.Parallel()
	g, _, clk := mustDeadGate(t)
	req := quota.Request{TenantID: "tn-bad", Meter: "demo", Cost: 1, FailOpen: true,
		Limits: quota.Limits{Burst: quota.Ptr(int64(3))}} // a burst without a rate
	d, err := g.admitLocally(req, clk.now())
	if quota.ErrorCode(err) != quota.CodeInvalid || d.Allowed {
		t.Fatalf("got %+v, %v; want a CodeInvalid error", d, err)
	}
}
