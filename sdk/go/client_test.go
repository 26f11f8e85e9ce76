package tollgate_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	tollgate "github.com/tollgate/tollgate/sdk/go"
)

func TestCheckSettleRefundRelease(t *testing.T) {
	s := sharedStack(t)
	tn := s.newTenant(t, 10)
	ctx := context.Background()
	c := s.serviceClient(newCounter())

	dry, err := c.Check(ctx, tollgate.CheckRequest{APIKey: tn.key, Meter: "calls", Cost: 4, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !dry.Allowed || dry.RequestID != "" || dry.Status != 200 {
		t.Fatalf("dry run: allowed %v request id %q status %d, want allowed, no request id, 200", dry.Allowed, dry.RequestID, dry.Status)
	}
	res, err := c.Check(ctx, tollgate.CheckRequest{APIKey: tn.key, Meter: "calls", Cost: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Allowed || len(res.RequestID) != 32 || res.TenantID != tn.id {
		t.Fatalf("check: allowed %v request id %q tenant %q, want allowed, 32 hex digits, %s", res.Allowed, res.RequestID, res.TenantID, tn.id)
	}
	if got := daily(t, res.Limits); got != 6 {
		t.Fatalf("remaining after a check of 4 of 10: %d, want 6 (the dry run consumed nothing)", got)
	}
	if res.Headers["RateLimit-Policy"] == "" && res.Headers["Ratelimit-Policy"] == "" {
		t.Errorf("headers %v: want RateLimit-Policy to relay", res.Headers)
	}

	st, err := c.Settle(ctx, res.TenantID, res.RequestID, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Settled || st.Delta != -3 || st.ActualCost != 1 {
		t.Fatalf("settle 4 to 1: %+v, want settled with delta -3", st)
	}
	_, err = c.Settle(ctx, res.TenantID, res.RequestID, 2)
	if !tollgate.IsConflict(err) {
		t.Fatalf("second settle: %v, want a 409 problem", err)
	}
	if p := tollgate.AsProblem(err); p == nil || p.Type == "" || p.Detail == "" || p.Header.Get("Content-Type") != tollgate.ContentTypeProblem {
		t.Fatalf("second settle's problem: %+v, want type, detail and problem+json", p)
	}

	res2, err := c.Check(ctx, tollgate.CheckRequest{TenantID: tn.id, Meter: "calls", Cost: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got := daily(t, res2.Limits); got != 7 {
		t.Fatalf("remaining after the settle to 1 and a check of 2: %d, want 7", got)
	}
	rf, err := c.Refund(ctx, tn.id, res2.RequestID)
	if err != nil {
		t.Fatal(err)
	}
	if !rf.Refunded || rf.Delta != -2 {
		t.Fatalf("refund: %+v, want refunded, delta -2", rf)
	}
	if _, err := c.Refund(ctx, tn.id, res2.RequestID); !tollgate.IsConflict(err) {
		t.Fatalf("second refund: %v, want 409", err)
	}
	if _, err := c.Release(ctx, tn.id, res2.RequestID); !tollgate.IsNotFound(err) {
		t.Fatalf("release of a check that held nothing: %v, want 404", err)
	}
	if _, err := c.Settle(ctx, tn.id, "00000000000000000000000000000000", 1); !tollgate.IsNotFound(err) {
		t.Fatalf("settle of an unknown request: %v, want 404", err)
	}

	u, err := tollgate.NewTenantClient(s.base, tn.key).Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if u.TenantID != tn.id || u.Tier != tn.tier || daily(t, u.Limits) != 9 {
		t.Fatalf("usage: tenant %s tier %s daily remaining %d, want %s %s 9 (1 settled, 2 refunded)", u.TenantID, u.Tier, daily(t, u.Limits), tn.id, tn.tier)
	}
	// The worker flushes the usage (every second here) and keeps the
	// period's draft invoice current.
	var inv []tollgate.Invoice
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if inv, err = tollgate.NewTenantClient(s.base, tn.key).Invoices(ctx); err != nil {
			t.Fatal(err)
		}
		if len(inv) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(inv) != 1 || inv[0].TenantID != tn.id || inv[0].Status != "draft" || inv[0].Currency == "" || inv[0].FinalizedAt != nil {
		t.Fatalf("invoices: %+v, want the tenant's one draft of this period", inv)
	}
}

func TestClientErrors(t *testing.T) {
	s := sharedStack(t)
	tn := s.newTenant(t, 10)
	ctx := context.Background()
	c := s.serviceClient(newCounter())

	for _, tc := range []struct {
		name   string
		req    tollgate.CheckRequest
		status int
		field  string
	}{
		{"unknown key", tollgate.CheckRequest{APIKey: "tg_nothing", Meter: "calls"}, 401, ""},
		{"bad meter", tollgate.CheckRequest{APIKey: tn.key, Meter: "A|B"}, 400, "meter"},
		{"negative cost", tollgate.CheckRequest{APIKey: tn.key, Meter: "calls", Cost: -1}, 400, "cost"},
		{"no tenant", tollgate.CheckRequest{Meter: "calls"}, 400, "api_key"},
		{"key and id", tollgate.CheckRequest{APIKey: tn.key, TenantID: tn.id, Meter: "calls"}, 400, "tenant_id"},
	} {
		_, err := c.Check(ctx, tc.req)
		p := tollgate.AsProblem(err)
		if p == nil || p.Status != tc.status || p.Field != tc.field || tollgate.IsOutage(err) {
			t.Errorf("%s: %v (%+v), want a %d problem naming field %q", tc.name, err, p, tc.status, tc.field)
		}
	}
	if got := daily(t, mustCheck(t, c, tn.key, "calls", 1, true).Limits); got != 9 {
		t.Errorf("after the bad checks, a dry run of 1 leaves %d, want 9: they changed nothing", got)
	}

	wrong := tollgate.NewServiceClient(s.base, "not-the-service-token-at-all")
	if _, err := wrong.Check(ctx, tollgate.CheckRequest{APIKey: tn.key, Meter: "calls"}); !tollgate.IsUnauthorized(err) {
		t.Errorf("wrong service token: %v, want 401", err)
	}
	if _, err := tollgate.NewTenantClient(s.base, "tg_nothing").Usage(ctx); !tollgate.IsUnauthorized(err) {
		t.Errorf("usage with an unknown key: %v, want 401", err)
	}

	// Nothing listens on a closed port: an outage, not a problem.
	closed := tollgate.NewServiceClient("http://"+closedAddr(t), serviceToken, tollgate.WithTimeout(2*time.Second))
	_, err := closed.Check(ctx, tollgate.CheckRequest{APIKey: tn.key, Meter: "calls"})
	var out *tollgate.OutageError
	if !errors.As(err, &out) || out.Status != 0 || out.Op != "check" || tollgate.AsProblem(err) != nil {
		t.Errorf("check of a closed port: %v, want an *OutageError without status", err)
	}
	// The caller's own context ending is its error, not an outage.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Check(cctx, tollgate.CheckRequest{APIKey: tn.key, Meter: "calls"}); !errors.Is(err, context.Canceled) || tollgate.IsOutage(err) {
		t.Errorf("check with an ended context: %v, want context.Canceled", err)
	}
	if got := daily(t, mustCheck(t, c, tn.key, "calls", 1, true).Limits); got != 9 {
		t.Errorf("a dry run of 1 leaves %d, want 9", got)
	}
	_ = http.StatusOK
}

func mustCheck(tb testing.TB, c *tollgate.ServiceClient, key, meter string, cost int64, dry bool) *tollgate.CheckResult {
	tb.Helper()
	r, err := c.Check(context.Background(), tollgate.CheckRequest{APIKey: key, Meter: meter, Cost: cost, DryRun: dry})
	if err != nil {
		tb.Fatalf("check: %v", err)
	}
	return r
}

// daily returns the remaining units of the daily limit in limits.
func daily(tb testing.TB, limits []tollgate.Limit) int64 {
	tb.Helper()
	for _, l := range limits {
		if l.Name == "daily" {
			return l.Remaining
		}
	}
	tb.Fatalf("limits %+v: no daily limit", limits)
	return 0
}
