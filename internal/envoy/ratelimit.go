package envoy

import (
	"context"
	"math"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/internal/httpapi"
	"github.com/tollgate/tollgate/internal/quota"
)

// The descriptor entries Tollgate reads; others are ignored.
const (
	entryAPIKey = "api_key" // the tenant's API key (a "Bearer " prefix is taken off)
	entryMeter  = "meter"   // the meter; DefaultMeter when absent
	entryPath   = "path"    // the client's path, the instance a refusal's problem names
)

// Headers Tollgate adds to the upstream request of an admitted call.
const (
	hdrRequestID = "Tollgate-Request-Id"
	hdrTenantID  = "X-Tollgate-Tenant-Id"
)

type rateLimitService struct{ s *Server }

// ShouldRateLimit decides each descriptor as one ask of its tenant, in
// order, all or nothing: at the first refusal the descriptors admitted
// before it are refunded and the answer is OVER_LIMIT, with that
// refusal's headers and problem body. An admission answers OK with the
// first descriptor's quota headers and, for the upstream, the request ids
// and tenant ids of the admitted descriptors. Bad input, a missing or
// unknown key and a fail-closed outage are OVER_LIMIT with their problem
// (400, 401, 403, 503); only a call Tollgate cannot decide at all is a
// gRPC error (UNAVAILABLE), where Envoy's failure_mode_deny applies.
func (r rateLimitService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, outcome, err := r.shouldRateLimit(ctx, req)
	r.s.count("ratelimit", outcome)
	return resp, err
}

// shouldRateLimit is ShouldRateLimit, with the outcome to count.
func (r rateLimitService) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, string, error) {
	s := r.s
	asks, instance, err := asksOf(req)
	if err != nil {
		return refusedWith(httpapi.ErrorRelay(err, instance), len(req.GetDescriptors()), -1), quota.ErrorCode(err), nil
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(asks))}
	var admitted []httpapi.Decided
	for i, a := range asks {
		out, err := s.decide.Decide(ctx, a)
		if err != nil {
			s.refundAll(ctx, admitted)
			if cannotDecide(err) {
				s.log.Error("a rate limit call could not be decided", "err", err)
				return nil, "error", status.Error(codes.Unavailable, "tollgate cannot decide: internal error")
			}
			refused := refusedWith(httpapi.ErrorRelay(err, a.Instance), len(asks), i)
			copy(refused.Statuses, resp.Statuses[:i])
			return refused, quota.ErrorCode(err), nil
		}
		resp.Statuses[i] = descriptorStatus(out)
		if !out.Decision.Allowed {
			s.refundAll(ctx, admitted)
			refused := refusedWith(out.Relay, len(asks), i)
			copy(refused.Statuses, resp.Statuses[:i+1])
			return refused, "refused", nil
		}
		admitted = append(admitted, out)
	}
	resp.ResponseHeadersToAdd = headerValues(admitted[0].Relay.Header)
	var ids, tenants []string
	for _, d := range admitted {
		if d.RequestID != "" {
			ids = append(ids, d.RequestID)
		}
		if !slices.Contains(tenants, d.Principal.Tenant.ID) {
			tenants = append(tenants, d.Principal.Tenant.ID)
		}
	}
	if len(ids) > 0 {
		resp.RequestHeadersToAdd = append(resp.RequestHeadersToAdd, &corev3.HeaderValue{Key: hdrRequestID, Value: strings.Join(ids, ", ")})
	}
	resp.RequestHeadersToAdd = append(resp.RequestHeadersToAdd, &corev3.HeaderValue{Key: hdrTenantID, Value: strings.Join(tenants, ", ")})
	return resp, "ok", nil
}

// asksOf reads req's descriptors as asks, or the first bad input as a
// *quota.Error, with the path its descriptor named: no descriptors, too
// many, a descriptor without an API key (401, as a metered route without
// one), a bad cost or an oversized value.
func asksOf(req *rlsv3.RateLimitRequest) ([]httpapi.Ask, string, error) {
	ds := req.GetDescriptors()
	switch {
	case len(ds) == 0:
		return nil, "", quota.FieldError("descriptors", "give at least one descriptor")
	case len(ds) > MaxDescriptors:
		return nil, "", quota.FieldError("descriptors", "give at most %d descriptors", MaxDescriptors)
	}
	asks := make([]httpapi.Ask, len(ds))
	for i, d := range ds {
		a, err := askOf(d, req.GetHitsAddend())
		if err != nil {
			return nil, a.Instance, err
		}
		asks[i] = a
	}
	return asks, "", nil
}

// askOf reads one descriptor; hits is the request's hits_addend, which
// the descriptor's own overrides. On an error the ask holds the path read
// so far.
func askOf(d *ratelimitv3.RateLimitDescriptor, hits uint32) (httpapi.Ask, error) {
	entries := d.GetEntries()
	if len(entries) > MaxEntries {
		return httpapi.Ask{}, quota.FieldError("descriptors", "give at most %d entries in a descriptor", MaxEntries)
	}
	if d.GetIsNegativeHits() {
		return httpapi.Ask{}, quota.FieldError("is_negative_hits", "negative hits are not taken: a refund goes through POST /v1/refund")
	}
	a := httpapi.Ask{Meter: DefaultMeter}
	seen := map[string]bool{}
	for _, e := range entries {
		if len(e.GetKey()) > MaxValue || len(e.GetValue()) > MaxValue {
			return httpapi.Ask{}, quota.FieldError("descriptors", "an entry's key and value are at most %d bytes", MaxValue)
		}
		switch e.GetKey() {
		case entryAPIKey, entryMeter, entryPath:
		default:
			continue
		}
		if seen[e.GetKey()] {
			return httpapi.Ask{}, quota.FieldError(e.GetKey(), "give one %s entry per descriptor", e.GetKey())
		}
		seen[e.GetKey()] = true
		switch v := strings.TrimSpace(e.GetValue()); e.GetKey() {
		case entryAPIKey:
			if b, ok := strings.CutPrefix(v, "Bearer "); ok {
				v = strings.TrimSpace(b)
			}
			a.APIKey = v
		case entryMeter:
			a.Meter = v
		case entryPath:
			p, err := instanceOf(v)
			if err != nil {
				return httpapi.Ask{}, err
			}
			a.Instance = p
		}
	}
	if a.APIKey == "" {
		return a, httpapi.ErrKeyRequired
	}
	cost := uint64(hits)
	if h := d.GetHitsAddend(); h != nil {
		cost = h.GetValue()
	}
	if cost > uint64(quota.MaxQuantity) {
		return a, quota.FieldError("hits_addend", "must be an integer between 0 (for 1) and %d", quota.MaxQuantity)
	}
	a.Cost = int64(cost)
	return a, nil
}

// instanceOf is the problem instance of a client's request target: its
// path without the query, at most MaxPath printable ASCII characters.
func instanceOf(target string) (string, error) {
	p, _, _ := strings.Cut(target, "?")
	if len(p) > MaxPath || !printable(p) {
		return "", quota.FieldError("path", "must be at most %d printable ASCII characters", MaxPath)
	}
	return p, nil
}

// printable reports whether s is printable ASCII.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// refusedWith is an OVER_LIMIT answer of n descriptors carrying r, the
// refusal of descriptor at (-1: of the call as a whole): that one
// OVER_LIMIT, the others UNKNOWN until the caller fills them.
func refusedWith(r httpapi.Relay, n, at int) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses:             make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
		ResponseHeadersToAdd: headerValues(r.Header), RawBody: r.Body}
	for i := range resp.Statuses {
		code := rlsv3.RateLimitResponse_UNKNOWN
		if at < 0 || i == at {
			code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: code}
	}
	return resp
}

// descriptorStatus is out's status: its code and the limit of its
// X-RateLimit-* headers (the one that refused, else the tightest).
func descriptorStatus(out httpapi.Decided) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	if !out.Decision.Allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	l, ok := out.Tightest()
	if !ok {
		return st
	}
	unit, mult := unitOf(l.Window)
	st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: string(l.Name), RequestsPerUnit: clamp32(l.Limit), Unit: unit}
	if mult > 1 {
		st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	st.LimitRemaining = clamp32(l.Remaining)
	if !l.Reset.IsZero() {
		st.DurationUntilReset = durationpb.New(max(0, l.Reset.Sub(out.Decision.Now)).Truncate(time.Millisecond))
	}
	return st
}

// unitOf maps a limit's window to Envoy's unit and multiplier: a calendar
// month (28 to 31 days) is MONTH, a calendar day (23 to 25 hours, for the
// days a time zone's clock moves) DAY, any other whole number of weeks,
// days, hours, minutes or seconds that unit times a multiplier; a window
// of none of them (a concurrency limit's) UNKNOWN.
func unitOf(w time.Duration) (rlsv3.RateLimitResponse_RateLimit_Unit, uint32) {
	const day = 24 * time.Hour
	switch {
	case w <= 0 || w%time.Second != 0:
		return rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0
	case w >= 28*day-time.Hour && w <= 31*day+time.Hour:
		return rlsv3.RateLimitResponse_RateLimit_MONTH, 1
	case w >= 23*time.Hour && w <= 25*time.Hour:
		return rlsv3.RateLimitResponse_RateLimit_DAY, 1
	}
	for _, u := range []struct {
		size time.Duration
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{7 * day, rlsv3.RateLimitResponse_RateLimit_WEEK},
		{day, rlsv3.RateLimitResponse_RateLimit_DAY},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	} {
		if n := int64(w / u.size); w%u.size == 0 && n >= 0 && n <= math.MaxUint32 {
			return u.unit, uint32(n)
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0
}

// clamp32 is n within uint32.
func clamp32(n int64) uint32 {
	return uint32(min(max(n, 0), math.MaxUint32))
}

// headerValues are h as Envoy's header values, in order.
func headerValues(h []httpapi.HeaderField) []*corev3.HeaderValue {
	out := make([]*corev3.HeaderValue, len(h))
	for i, f := range h {
		out[i] = &corev3.HeaderValue{Key: f.Name, Value: f.Value}
	}
	return out
}
