package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// keyedLimiter is a rate limit service on loopback that admits the
// descriptors whose api_key is "ok" and refuses the others: the other
// side of the gRPC row's driver.
type keyedLimiter struct{}

func (keyedLimiter) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	code := rlsv3.RateLimitResponse_OVER_LIMIT
	for _, e := range req.GetDescriptors()[0].GetEntries() {
		if e.GetKey() == "api_key" && e.GetValue() == "ok" {
			code = rlsv3.RateLimitResponse_OK
		}
	}
	return &rlsv3.RateLimitResponse{OverallCode: code, RawBody: []byte(`{"status":429}`)}, nil
}

func TestGRPCLoopDrivesARateLimitService(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, keyedLimiter{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	if _, err := newGRPCTarget("x", "10.0.0.1:9090", "ok", "demo", 1); err == nil {
		t.Fatal("a target off loopback was accepted")
	}
	tg, err := newGRPCTarget("gRPC", ln.Addr().String(), "ok", "demo", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.close()
	r := tg.closedLoop(t.Context(), 200*time.Millisecond, 1_000_000, 8)
	if r.Requests == 0 || r.Errors != 0 || r.OK != r.Requests || r.RPS <= 0 || r.P50 <= 0 || r.P99 < r.P50 {
		t.Errorf("closed loop: got %+v, want calls, all OK, 0 < p50 <= p99", r)
	}
	if r := tg.closedLoop(t.Context(), time.Minute, 50, 4); r.Requests != 50 {
		t.Errorf("closed loop with -max 50: got %d calls, want 50", r.Requests)
	}
	refused, err := newGRPCTarget("gRPC", ln.Addr().String(), "spent", "demo", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer refused.close()
	if r := refused.closedLoop(t.Context(), time.Minute, 10, 2); r.Errors != 10 || !strings.Contains(r.FirstErr, "OVER_LIMIT") {
		t.Errorf("a refused key: %d errors of %d, first %q; want every call failed as OVER_LIMIT", r.Errors, r.Requests, r.FirstErr)
	}
}
