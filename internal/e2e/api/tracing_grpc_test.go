package api

import (
	"context"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestGRPCCallsAreTraced: with traces on, each call of Envoy's services
// is a server span continuing Envoy's traceparent, with the decision's
// tenant, meter and outcome, and its admission under it; no span holds
// the API key.
func TestGRPCCallsAreTraced(t *testing.T) {
	t.Parallel()
	rec := testenv.OTLP(t)
	s := mustStack(t)
	e := startEnvoyAPI(t, s, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rec.URL, "OTEL_BSP_SCHEDULE_DELAY": "50"})
	tenant, key := s.tenant(s.tier(23, quota.Limits{DailyQuota: quota.Ptr(int64(100))}).Slug)

	const rlsTrace, rlsParent = "5bf92f3577b34da6a3ce929d0e0e4736", "10f067aa0ba902b7"
	const authTrace, authParent = "6bf92f3577b34da6a3ce929d0e0e4736", "20f067aa0ba902b7"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rctx := metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+rlsTrace+"-"+rlsParent+"-01")
	resp, err := e.rls.ShouldRateLimit(rctx, &rlsv3.RateLimitRequest{Domain: "tollgate", HitsAddend: 2,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", key, "meter", "search")}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v %v, want OK", resp.GetOverallCode(), err)
	}
	actx := metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+authTrace+"-"+authParent+"-01")
	check, err := e.authz.Check(actx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "GET", Path: "/reports", Host: "api.example.test", Headers: map[string]string{"x-api-key": key}}},
		ContextExtensions: map[string]string{"meter": "reports"}}})
	if err != nil || check.GetStatus().GetCode() != 0 {
		t.Fatalf("Check: %v %v, want OK", check.GetStatus(), err)
	}

	wait := 20 * time.Second
	for _, tc := range []struct {
		name, trace, parent, meter, cost string
	}{
		{"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", rlsTrace, rlsParent, "search", "2"},
		{"/envoy.service.auth.v3.Authorization/Check", authTrace, authParent, "reports", "1"},
	} {
		sp := rec.WaitFor(t, wait, tc.name, func(sp testenv.Span) bool { return sp.Name == tc.name && sp.TraceID == tc.trace })
		if sp.ParentID != tc.parent || sp.Kind != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("%s: parent %s kind %v, want parent %s (Envoy's traceparent), kind server", tc.name, sp.ParentID, sp.Kind, tc.parent)
		}
		wantAttrs(t, sp, map[string]string{"tollgate.tenant_id": tenant.ID, "tollgate.meter": tc.meter, "tollgate.cost": tc.cost,
			"tollgate.decision": "allowed", "rpc.system": "grpc"})
		rec.WaitFor(t, wait, "tollgate.admit under "+tc.name, func(a testenv.Span) bool {
			return a.Name == "tollgate.admit" && a.ParentID == sp.SpanID
		})
	}
	for _, sp := range rec.Spans() {
		for k, v := range sp.Attrs {
			if strings.Contains(v, key) {
				t.Errorf("span %s: attribute %s holds the API key", sp.Name, k)
			}
		}
	}
}
