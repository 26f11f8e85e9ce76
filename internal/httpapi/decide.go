package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/internal/admission"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/telemetry"
)

// Ask is one decision asked of Tollgate by a caller that serves the
// request itself: POST /v1/check, and the gRPC services for Envoy. It
// names the tenant by API key or by id (one of them), the meter, the cost
// (0: 1), and what the decision may do.
type Ask struct {
	APIKey, TenantID string
	Meter            string
	Cost             int64
	// DryRun asks whether the request would fit, consuming nothing.
	DryRun bool
	// IdempotencyKey makes a repeat of the same ask answer the first
	// decision without counting again.
	IdempotencyKey string
	// Instance is the path a refusal's problem names: the client's
	// request path when the caller knows it.
	Instance string
	// Hold takes the concurrency leases of the tenant's concurrency
	// policies (those held in Redis) for a counted, admitted ask: Release
	// or Refund gives them back, else they lapse after the policy's lease.
	Hold bool
}

// Decided is a decision and what a metered route would have answered for
// it, to pass on unchanged.
type Decided struct {
	Principal catalog.Principal
	Request   quota.Request
	Decision  quota.Decision
	// RequestID names a counted, admitted decision for Settle, Refund and
	// Release: 128 random bits in 32 hex digits; a repeat of an
	// idempotency key answers the first decision's. Empty for a dry run,
	// a refusal and a decision that could not be reserved.
	RequestID string
	// Relay is the metered route's answer: on a refusal its status,
	// headers and body; on an admission status 200 and the quota headers
	// (no body).
	Relay Relay
}

// Relay is an answer to pass on as it is.
type Relay struct {
	Status int
	// Header lists the headers in the order a metered route writes them,
	// each name once.
	Header []HeaderField
	// Body is the refusal's body (problem+json, or a degrade policy's
	// fallback in its own content type), nil on an admission.
	Body []byte
}

// HeaderField is one header of a Relay.
type HeaderField struct{ Name, Value string }

// HeaderMap is r's headers as a map, for JSON.
func (r Relay) HeaderMap() map[string]string {
	m := make(map[string]string, len(r.Header))
	for _, h := range r.Header {
		m[h.Name] = h.Value
	}
	return m
}

// principalOf resolves the tenant an Ask names.
func (s *Server) principalOf(ctx context.Context, a Ask) (catalog.Principal, error) {
	switch {
	case a.APIKey != "" && a.TenantID != "":
		return catalog.Principal{}, quota.FieldError("tenant_id", "give api_key or tenant_id, not both")
	case a.APIKey != "":
		return s.catalog.Resolve(ctx, a.APIKey)
	case a.TenantID != "":
		if !quota.ValidID(a.TenantID) {
			return catalog.Principal{}, quota.FieldError("tenant_id", "must be a tenant id (UUID)")
		}
		p, err := s.catalog.Principal(ctx, a.TenantID)
		if err != nil {
			return p, err
		}
		if p.Tenant.Status == quota.StatusSuspended {
			return p, quota.Errorf(quota.CodeForbidden, "tenant suspended")
		}
		return p, nil
	}
	return catalog.Principal{}, quota.FieldError("api_key", "give api_key or tenant_id")
}

// Decide decides on a: the same Gate, limits, policies and promises as a
// metered route of a's meter. A counted admission is reserved under a new
// request id (Decided.RequestID) for Settle, Refund and, when it holds
// concurrency leases, Release, within quota.SettleWindow. Errors are
// *quota.Error for bad input, an unknown key or a suspended tenant, and
// what the Gate answers when it cannot decide. With tracing on, the span
// of ctx (the caller's server span) gets the tenant, meter, cost and
// decision, and the admission is a child span of it.
func (s *Server) Decide(ctx context.Context, a Ask) (Decided, error) {
	p, err := s.principalOf(ctx, a)
	if err != nil {
		return Decided{}, err
	}
	if !httpx.ValidMeter(a.Meter) {
		return Decided{}, quota.FieldError("meter", "must be 1 to 64 of a-z 0-9 _ . -")
	}
	cost := a.Cost
	if cost == 0 {
		cost = 1
	}
	if cost < 1 || cost > quota.MaxQuantity {
		return Decided{}, quota.FieldError("cost", "must be an integer between 1 and %d", quota.MaxQuantity)
	}
	if len(a.IdempotencyKey) > httpx.MaxIdempotencyKey {
		return Decided{}, quota.FieldError("idempotency_key", "must be at most %d characters", httpx.MaxIdempotencyKey)
	}
	// A check's answer is its decision: the key's record is complete at
	// once (no lease), and the fingerprint is what the check asked.
	req := quota.Request{
		TenantID: p.Tenant.ID, Meter: a.Meter, Cost: cost, Limits: p.Limits, Overage: p.Tier.Overage,
		OveragePriceCentsPer1K: p.Tier.OveragePriceCentsPer1K, FailOpen: p.Tier.FailOpen,
		MeterQuotas: p.Tier.MeterQuotas, DryRun: a.DryRun, IdempotencyKey: a.IdempotencyKey,
		IdempotencyFingerprint: "check " + a.Meter + " " + strconv.FormatInt(cost, 10),
		Calendar:               p.Calendar,
	}
	// The policies of the meter and tier apply, except those that need the
	// metered request itself: a path or method match, scope ip or param
	// (the caller is the backend, not the client), and adaptive ones.
	// Concurrency policies held in Redis apply to an ask that holds.
	if req.Policies, err = s.matchPolicies(ctx, a.Meter, "", "", p.Tier.Slug,
		scopeValues{tenant: p.Tenant.ID, key: p.KeyID, hold: a.Hold && !a.DryRun}); err != nil {
		return Decided{}, err
	}
	if len(req.Policies) > 0 || !a.DryRun {
		req.RequestID = httpx.NewID()
	}
	if s.tracer != nil {
		trace.SpanFromContext(ctx).SetAttributes(telemetry.TenantID.String(p.Tenant.ID), telemetry.Meter.String(a.Meter),
			telemetry.Cost.Int64(cost), telemetry.DryRun.Bool(a.DryRun))
	}
	ch, err := s.adm.Check(ctx, &p, &req)
	d := ch.Decision
	if err != nil && d.Idem == quota.IdemNone {
		if s.tracer != nil {
			trace.SpanFromContext(ctx).SetAttributes(telemetry.Decision.String(telemetry.DecisionUnavailable))
		}
		return Decided{}, err
	}
	if s.tracer != nil {
		admission.TraceOutcome(ctx, admission.Outcome(d), d)
	}
	if len(d.Policies) > 0 {
		s.countPolicies(d)
	}
	out := Decided{Principal: p, Request: req, Decision: d}
	if err != nil {
		return out, err // (an idempotency refusal)
	}
	out.Relay = s.relay(p, d, a.Instance)
	out.RequestID = ch.RequestID
	return out, nil
}

// relay renders what a metered route of p would answer for d: the quota
// headers, and on a refusal its status and body (429 quota exceeded, 402
// credit exhausted, or a degrade policy's fallback).
func (s *Server) relay(p catalog.Principal, d quota.Decision, instance string) Relay {
	var h fasthttp.ResponseHeader
	h.DisableNormalizing()
	h.SetNoDefaultContentType(true) // an admission has no body, so no type
	writeRateLimitHeaders(&h, d)
	r := Relay{Status: fiber.StatusOK}
	switch {
	case d.Allowed:
	case d.Fallback != nil:
		f := d.Fallback.Policy.Fallback
		r.Status, r.Body = f.Status, []byte(f.Body)
		h.SetCanonical(hdrDegraded, []byte(d.Fallback.Policy.Name))
		h.Set(fiber.HeaderContentType, f.ContentType)
	case refusedForCredit(d):
		r.Status, r.Body = fiber.StatusPaymentRequired, creditRefusalBody(d, p.Tier.TopUpURL, instance)
		h.Del(fiber.HeaderRetryAfter)
		h.Set(fiber.HeaderContentType, httpx.ContentTypeProblem)
	default:
		r.Status = fiber.StatusTooManyRequests
		r.Body = refusalProblem(d, p.RefusalUpgrade(&d), instance).appendJSON(nil)
		h.Set(fiber.HeaderContentType, httpx.ContentTypeProblem)
	}
	h.VisitAll(func(k, v []byte) {
		switch string(k) {
		case fiber.HeaderContentLength, fiber.HeaderServer, fiber.HeaderDate:
			return
		case fiber.HeaderContentType:
			if r.Body == nil { // (fasthttp's default: no body, no type)
				return
			}
		}
		r.Header = append(r.Header, HeaderField{Name: string(k), Value: string(v)})
	})
	return r
}

// creditRefusalBody is writeCreditRefusal's body.
func creditRefusalBody(d quota.Decision, topUpURL, instance string) []byte {
	b, _ := json.Marshal(creditRefusal{ // (strings and a slice of strings: never fails)
		Type: ProblemCreditExhausted, Title: "Credit exhausted", Status: fiber.StatusPaymentRequired,
		Detail:   "the prepaid credit does not cover this request; top up to go on",
		Instance: instance, TopUpURL: topUpURL, Violated: d.Violated,
	})
	return b
}

// Tightest is the limit of d's X-RateLimit-* headers: the one that refused,
// else the one with the least room left.
func (d Decided) Tightest() (quota.LimitState, bool) { return tightest(d.Decision) }

// ErrorRelay is what a metered route answers for err, Decide's error, at
// instance: the problem+json of its status, with the challenge of a 401 (a
// missing key: ErrKeyRequired) and, for a caller that decides in front of
// the route, a Retry-After of 1 on a 503. An error that is not a
// *quota.Error is the 500 "internal error".
func ErrorRelay(err error, instance string) Relay {
	var qe *quota.Error
	if !errors.As(err, &qe) {
		qe = quota.Errorf(quota.CodeInternal, "internal error")
	}
	p := httpx.ErrorProblem(qe, instance)
	r := Relay{Status: p.Status, Body: p.AppendJSON(nil)}
	switch p.Status {
	case fiber.StatusUnauthorized:
		challenge := ChallengeInvalidKey
		if errors.Is(err, ErrKeyRequired) {
			challenge = ChallengeKeyRequired
		}
		r.Header = append(r.Header, HeaderField{fiber.HeaderWWWAuthenticate, challenge})
	case fiber.StatusServiceUnavailable:
		r.Header = append(r.Header, HeaderField{fiber.HeaderRetryAfter, "1"})
	}
	r.Header = append(r.Header, HeaderField{fiber.HeaderContentType, httpx.ContentTypeProblem})
	return r
}
