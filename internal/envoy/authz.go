package envoy

import (
	"context"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/internal/httpapi"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// The context extensions a Check reads.
const (
	extMeter = "meter" // the meter; DefaultMeter when absent
	extCost  = "cost"  // the cost, a whole number from 1; 1 when absent
)

// keyHeaders are the client's headers that carry credentials: never passed
// to the upstream of an admitted request, as Tollgate's own proxy does.
var keyHeaders = []string{"authorization", "x-api-key", "proxy-authorization"}

type authService struct{ s *Server }

// Check decides the client's request as a metered route would: the API
// key from its Authorization: Bearer or X-API-Key header, the meter and
// cost from the route's context extensions, its path as a refusal's
// instance. A refusal is a denied response with Tollgate's own status
// (400, 401, 402, 403, 429, 503, or a degrade policy's fallback), headers
// and body. An admission adds the quota headers to the client's answer,
// sets X-Tollgate-Tenant-Id and Tollgate-Request-Id on the upstream
// request and removes the credential headers (and any other Tollgate-*
// header the client sent) from it. Only a check Tollgate cannot decide at
// all is a gRPC error (UNAVAILABLE), where Envoy's failure_mode_allow
// applies.
func (a authService) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	resp, outcome, err := a.check(ctx, req)
	a.s.count("ext_authz", outcome)
	return resp, err
}

// check is Check, with the outcome to count.
func (a authService) check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, string, error) {
	s := a.s
	h := req.GetAttributes().GetRequest().GetHttp()
	headers := headersOf(h)
	ask, err := checkAsk(h, headers, req.GetAttributes().GetContextExtensions())
	if err != nil {
		return denied(httpapi.ErrorRelay(err, ask.Instance)), quota.ErrorCode(err), nil
	}
	out, err := s.decide.Decide(ctx, ask)
	if err != nil {
		if cannotDecide(err) {
			s.log.Error("an ext_authz check could not be decided", "err", err)
			return nil, "error", status.Error(codes.Unavailable, "tollgate cannot decide: internal error")
		}
		return denied(httpapi.ErrorRelay(err, ask.Instance)), quota.ErrorCode(err), nil
	}
	if !out.Decision.Allowed {
		return denied(out.Relay), "refused", nil
	}
	ok := &authv3.OkHttpResponse{ResponseHeadersToAdd: headerOptions(out.Relay.Header)}
	ok.Headers = append(ok.Headers, overwrite(hdrTenantID, out.Principal.Tenant.ID))
	if out.RequestID != "" {
		ok.Headers = append(ok.Headers, overwrite(hdrRequestID, out.RequestID))
	}
	for name := range headers {
		if reserved(name) && !strings.EqualFold(name, hdrTenantID) && !strings.EqualFold(name, hdrRequestID) {
			ok.HeadersToRemove = append(ok.HeadersToRemove, name)
		}
	}
	slices.Sort(ok.HeadersToRemove) // (the map's order is random)
	return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.OK)},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: ok}}, "ok", nil
}

// checkAsk reads the ask of a check, or the first bad input as a
// *quota.Error (the ask then holds what was read of the instance).
func checkAsk(h *authv3.AttributeContext_HttpRequest, headers map[string]string, ext map[string]string) (httpapi.Ask, error) {
	var a httpapi.Ask
	p, err := instanceOf(h.GetPath())
	if err != nil {
		return a, err
	}
	a.Instance = p
	a.Meter, a.Cost = DefaultMeter, 1
	for k, v := range ext {
		if len(k) > MaxValue || len(v) > MaxValue {
			return a, quota.FieldError("context_extensions", "a key and a value are at most %d bytes", MaxValue)
		}
	}
	if m, ok := ext[extMeter]; ok {
		a.Meter = m
	}
	if c, ok := ext[extCost]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(c), 10, 64)
		if err != nil || n < 1 || n > quota.MaxQuantity {
			return a, quota.FieldError("cost", "must be an integer between 1 and %d", quota.MaxQuantity)
		}
		a.Cost = n
	}
	if v, ok := headers["authorization"]; ok && v != "" {
		a.APIKey = httpx.Bearer(v)
	} else {
		a.APIKey = strings.TrimSpace(headers["x-api-key"])
	}
	if a.APIKey == "" {
		return a, httpapi.ErrKeyRequired
	}
	return a, nil
}

// headersOf is the request's headers by lower-case name: Envoy's headers
// map, or its header_map when it sends raw headers (the first value of a
// name).
func headersOf(h *authv3.AttributeContext_HttpRequest) map[string]string {
	if m := h.GetHeaders(); len(m) > 0 {
		out := make(map[string]string, len(m))
		for k, v := range m {
			out[strings.ToLower(k)] = v
		}
		return out
	}
	out := map[string]string{}
	for _, hv := range h.GetHeaderMap().GetHeaders() {
		k := strings.ToLower(hv.GetKey())
		if _, dup := out[k]; dup {
			continue
		}
		v := hv.GetValue()
		if v == "" {
			v = string(hv.GetRawValue())
		}
		out[k] = v
	}
	return out
}

// reserved reports whether a client's header must not reach the upstream:
// a credential, or a name of Tollgate's own namespace.
func reserved(name string) bool {
	name = strings.ToLower(name)
	for _, k := range keyHeaders {
		if name == k {
			return true
		}
	}
	return strings.HasPrefix(name, "tollgate-") || strings.HasPrefix(name, "x-tollgate-")
}

// denied is the denied response of r: its status, headers and body.
func denied(r httpapi.Relay) *authv3.CheckResponse {
	code := codes.PermissionDenied
	switch r.Status {
	case 401:
		code = codes.Unauthenticated
	case 503:
		code = codes.Unavailable
	}
	httpStatus := typev3.StatusCode_Forbidden
	if r.Status >= 100 && r.Status <= 599 {
		httpStatus = typev3.StatusCode(r.Status)
	}
	return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(code)},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status: &typev3.HttpStatus{Code: httpStatus}, Headers: headerOptions(r.Header), Body: string(r.Body)}}}
}

// headerOptions are h as header options that replace a header of the same
// name.
func headerOptions(h []httpapi.HeaderField) []*corev3.HeaderValueOption {
	out := make([]*corev3.HeaderValueOption, len(h))
	for i, f := range h {
		out[i] = overwrite(f.Name, f.Value)
	}
	return out
}

func overwrite(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: name, Value: value},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}
