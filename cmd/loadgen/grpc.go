package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// grpcTarget is the gRPC row's call: ShouldRateLimit of one descriptor
// (a tenant's API key and a meter), as Envoy's rate limit filter sends it,
// over conns HTTP/2 connections that the driving goroutines share in turn
// (each goroutine's calls are the streams of one connection).
type grpcTarget struct {
	row     string
	clients []rlsv3.RateLimitServiceClient
	closers []*grpc.ClientConn
	req     *rlsv3.RateLimitRequest
}

// newGRPCTarget connects conns times to addr, a loopback host:port, for
// the call of key on meter.
func newGRPCTarget(row, addr, key, meter string, conns int) (*grpcTarget, error) {
	if err := loopbackHost(hostOf(addr)); err != nil {
		return nil, err
	}
	t := &grpcTarget{row: row, req: &rlsv3.RateLimitRequest{Domain: "loadgen", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: key}, {Key: "meter", Value: meter}}}}}}
	for range conns {
		// Each its own connection: grpc-go shares one between ClientConns
		// only when asked to.
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.close()
			return nil, err
		}
		t.closers = append(t.closers, cc)
		t.clients = append(t.clients, rlsv3.NewRateLimitServiceClient(cc))
	}
	return t, nil
}

func (t *grpcTarget) close() {
	for _, cc := range t.closers {
		cc.Close()
	}
}

// call sends the request once on client c and says what went wrong.
func (t *grpcTarget) call(ctx context.Context, c rlsv3.RateLimitServiceClient) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, t.req)
	if err != nil {
		return err
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		return fmt.Errorf("%v, want OK: %.200s", resp.GetOverallCode(), resp.GetRawBody())
	}
	return nil
}

// closedLoop drives t from streams goroutines, each calling again as soon
// as its previous call is answered, for d or limit calls: the saturating
// rate. Latency is each call's round trip.
func (t *grpcTarget) closedLoop(ctx context.Context, d time.Duration, limit int64, streams int) Result {
	var sent atomic.Int64
	tl := newTally(streams)
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for w := range streams {
		wg.Go(func() {
			c := t.clients[w%len(t.clients)]
			lat := make([]time.Duration, 0, 1<<14)
			for sent.Add(1) <= limit {
				t0 := time.Now()
				if !t0.Before(stop) || ctx.Err() != nil {
					break
				}
				err := t.call(ctx, c)
				lat = append(lat, time.Since(t0))
				if err != nil {
					tl.fail(err)
				}
			}
			tl.lat[w] = lat
		})
	}
	wg.Wait()
	return tl.result(t.row, time.Since(start))
}
