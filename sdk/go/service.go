package tollgate

import (
	"context"
	"encoding/json"
	"fmt"
)

// ServiceClient calls Tollgate's service API (/v1/check, /v1/settle,
// /v1/refund, /v1/release) with the service token. It is safe for
// concurrent use.
type ServiceClient struct{ t *transport }

// NewServiceClient returns a client of the Tollgate at baseURL (e.g.
// "http://127.0.0.1:8080") that authenticates with serviceToken
// (TOLLGATE_SERVICE_TOKEN).
func NewServiceClient(baseURL, serviceToken string, opts ...Option) *ServiceClient {
	return &ServiceClient{t: newTransport(baseURL, serviceToken, opts)}
}

// CheckRequest asks a decision of POST /v1/check. APIKey or TenantID (one
// of them) names the tenant.
type CheckRequest struct {
	APIKey   string `json:"api_key,omitempty"`
	TenantID string `json:"tenant_id,omitempty"`
	// Meter is the meter the request counts against (1 to 64 of a-z 0-9
	// _ . -, starting with a letter or digit).
	Meter string `json:"meter"`
	// Cost is the units the request costs; 0 sends none (Tollgate counts 1).
	Cost int64 `json:"cost,omitempty"`
	// DryRun asks whether the cost would fit, consuming nothing.
	DryRun bool `json:"dry_run,omitempty"`
	// IdempotencyKey makes a repeat of the same check answer the first
	// decision without counting again (Replayed).
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Path is the client's request path, which a refusal's problem names.
	Path string `json:"path,omitempty"`
	// Hold takes the tenant's concurrency leases until Release or Refund
	// names the RequestID, or their lease ends.
	Hold bool `json:"hold,omitempty"`
}

// CheckResult is Tollgate's decision. Allowed false is a refusal: Status,
// Headers and Problem (or Fallback) are then what a metered route would
// have answered, to pass on unchanged.
type CheckResult struct {
	Allowed bool `json:"allowed"`
	// Limits are the tenant's limits after the decision.
	Limits []Limit `json:"limits"`
	// ViolatedPolicies names the refusing limits (burst, bucket, daily,
	// monthly, credit).
	ViolatedPolicies []string `json:"violated_policies"`
	// RetryAfter is the seconds after which a retry may pass; nil when
	// admitted or when waiting does not help.
	RetryAfter *int64 `json:"retry_after"`
	// Upgrade is a tier that would give more room, nil when none.
	Upgrade *Upgrade `json:"upgrade"`
	// Degraded: admitted without Redis (the tier fails open).
	Degraded bool `json:"degraded"`
	// Replayed: answered from an earlier check with the same idempotency key.
	Replayed bool `json:"replayed"`
	// TenantID is the tenant the check named.
	TenantID string `json:"tenant_id"`
	// RequestID names a counted, admitted check for Settle, Refund and
	// Release (within 10 minutes); empty for a dry run, a refusal or a
	// replay.
	RequestID string `json:"-"`
	// Status is the status a metered route would have answered: 200 when
	// admitted; 429, 402 or a degrade policy's status when refused.
	Status int `json:"status"`
	// Headers are the headers to relay on the answer (quota headers; on a
	// refusal Retry-After and Content-Type).
	Headers map[string]string `json:"headers"`
	// Problem is a 429 or 402 refusal's exact problem+json body; nil
	// otherwise.
	Problem json.RawMessage `json:"problem"`
	// Fallback is a degrade policy's body (in Headers' Content-Type).
	Fallback *string `json:"fallback,omitempty"`
	// DegradedBy names the degrade policy that refused the check.
	DegradedBy string `json:"degraded_by,omitempty"`
	// ShadowRefused names the shadow policies that would have refused it.
	ShadowRefused []string `json:"shadow_refused,omitempty"`
	// TopUpURL is a prepaid tier's top-up page, on a refusal for credit.
	TopUpURL string `json:"top_up_url,omitempty"`
}

// RefusalBody is what a refusal answers as its body: the problem, or a
// degrade policy's fallback; nil when admitted.
func (r *CheckResult) RefusalBody() []byte {
	switch {
	case r.Allowed:
		return nil
	case r.Fallback != nil:
		return []byte(*r.Fallback)
	case len(r.Problem) > 0 && string(r.Problem) != "null":
		return r.Problem
	}
	return nil
}

// Limit is one limit of a tenant as it stands.
type Limit struct {
	// Name is burst, bucket, daily, monthly, <meter>.daily or
	// <meter>.monthly (and in Usage spend_cap and credit, in cents).
	Name      string `json:"name"`
	Limit     int64  `json:"limit"`
	Remaining int64  `json:"remaining"`
	// Reset is when the limit's window ends (RFC 3339, UTC).
	Reset         string `json:"reset"`
	WindowSeconds int64  `json:"window_seconds"`
}

// Upgrade is a tier worth moving to. Quotas are nil when unlimited.
type Upgrade struct {
	Tier         string `json:"tier"`
	Name         string `json:"name"`
	PriceCents   int64  `json:"price_cents"`
	DailyQuota   *int64 `json:"daily_quota"`
	MonthlyQuota *int64 `json:"monthly_quota"`
	URL          string `json:"url"`
}

// Check decides req: a counted check (not DryRun) that is admitted
// consumes its cost and answers a RequestID. A refusal is a result with
// Allowed false, not an error. Errors: *Problem for bad input (400), an
// unknown key (401), a suspended tenant (403) or an unknown tenant (404);
// *OutageError when Tollgate cannot decide.
func (c *ServiceClient) Check(ctx context.Context, req CheckRequest) (*CheckResult, error) {
	var out struct {
		CheckResult
		RequestID *string `json:"request_id"`
	}
	if err := c.t.do(ctx, "check", "POST", "/v1/check", req, &out); err != nil {
		return nil, err
	}
	res := out.CheckResult
	if out.RequestID != nil {
		res.RequestID = *out.RequestID
	}
	if res.Status == 0 {
		return nil, &OutageError{Op: "check", Status: 200, Err: fmt.Errorf("answer without a status")}
	}
	return &res, nil
}

// SettleResult is the answer of an applied Settle.
type SettleResult struct {
	Settled    bool   `json:"settled"`
	RequestID  string `json:"request_id"`
	ActualCost int64  `json:"actual_cost"`
	// Delta is ActualCost minus the cost counted: negative units given
	// back, positive units charged.
	Delta int64 `json:"delta"`
}

// Settle sets a counted check's (or a settle route's request's) cost to
// actualCost, once, within 10 minutes. Errors: a 409 *Problem
// (IsConflict) when settled or refunded before, 404 (IsNotFound) when the
// tenant has no reservation under requestID.
func (c *ServiceClient) Settle(ctx context.Context, tenantID, requestID string, actualCost int64) (*SettleResult, error) {
	var out SettleResult
	in := struct {
		TenantID   string `json:"tenant_id"`
		RequestID  string `json:"request_id"`
		ActualCost int64  `json:"actual_cost"`
	}{tenantID, requestID, actualCost}
	if err := c.t.do(ctx, "settle", "POST", "/v1/settle", in, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RefundResult is the answer of an applied Refund.
type RefundResult struct {
	Refunded  bool   `json:"refunded"`
	RequestID string `json:"request_id"`
	// Delta is the units given back, negative.
	Delta int64 `json:"delta"`
	// ReleasedLeases counts the concurrency leases the refund ended.
	ReleasedLeases int `json:"released_leases"`
}

// Refund gives back a counted check whole, once, within 10 minutes, and
// ends the concurrency leases it holds. Errors as Settle's.
func (c *ServiceClient) Refund(ctx context.Context, tenantID, requestID string) (*RefundResult, error) {
	var out RefundResult
	if err := c.t.do(ctx, "refund", "POST", "/v1/refund", requestRef{tenantID, requestID}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReleaseResult is the answer of an applied Release.
type ReleaseResult struct {
	Released       bool   `json:"released"`
	RequestID      string `json:"request_id"`
	ReleasedLeases int    `json:"released_leases"`
}

// Release ends the concurrency leases a check took with Hold; its cost
// stands. Errors: 404 (IsNotFound) when it holds none.
func (c *ServiceClient) Release(ctx context.Context, tenantID, requestID string) (*ReleaseResult, error) {
	var out ReleaseResult
	if err := c.t.do(ctx, "release", "POST", "/v1/release", requestRef{tenantID, requestID}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

type requestRef struct {
	TenantID  string `json:"tenant_id"`
	RequestID string `json:"request_id"`
}
