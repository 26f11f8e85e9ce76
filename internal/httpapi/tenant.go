package httpapi

import (
	"encoding/json"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/usage"
)

// usage answers the caller's own usage, with the policies of its tier (the
// list the metered path matches requests to) and their state.
func (s *Server) usage(c *fiber.Ctx) error {
	p := httpx.PrincipalOf(c)
	u, err := s.reports.For(c.UserContext(), p)
	if err != nil {
		return err
	}
	if s.policies != nil {
		list, err := s.policies.Policies(c.UserContext())
		if err != nil {
			return err
		}
		if u.Policies, err = s.reports.Policies(c.UserContext(), p, usage.TierPolicies(list, p.Tier.Slug)); err != nil {
			return err
		}
	}
	return c.JSON(u)
}

// invoices answers the caller's own invoices.
func (s *Server) invoices(c *fiber.Ctx) error {
	p := httpx.PrincipalOf(c)
	items, err := s.ledger.TenantInvoices(c.UserContext(), p.Tenant.ID)
	if err != nil {
		return err
	}
	return c.JSON(fiber.Map{"items": items, "next_cursor": nil})
}

// CheckRequest is the body of POST /v1/check.
type CheckRequest struct {
	APIKey         string `json:"api_key"`
	TenantID       string `json:"tenant_id"`
	Meter          string `json:"meter"`
	Cost           *int64 `json:"cost"`
	DryRun         bool   `json:"dry_run"`
	IdempotencyKey string `json:"idempotency_key"`
	// Path is the client's request path, which a refusal's problem names
	// (its instance); optional.
	Path string `json:"path"`
	// Hold takes the tenant's concurrency leases (policies held in Redis)
	// until POST /v1/release or /v1/refund names request_id, or their
	// lease ends.
	Hold bool `json:"hold"`
}

// CheckResponse is the answer of POST /v1/check.
type CheckResponse struct {
	Allowed          bool              `json:"allowed"`
	Limits           []usage.Limit     `json:"limits"`
	ViolatedPolicies []quota.LimitName `json:"violated_policies"`
	RetryAfter       *int64            `json:"retry_after"`
	Upgrade          *quota.Upgrade    `json:"upgrade"`
	Degraded         bool              `json:"degraded"`
	Replayed         bool              `json:"replayed"`
	// DegradedBy names the degrade policy that refused the check (the
	// caller answers its own fallback); ShadowRefused the shadow
	// policies that would have refused it.
	DegradedBy    string   `json:"degraded_by,omitempty"`
	ShadowRefused []string `json:"shadow_refused,omitempty"`
	// TopUpURL is the prepaid tier's top-up URL when the check was refused
	// for want of credit (violated "credit").
	TopUpURL string `json:"top_up_url,omitempty"`
	// TenantID is the tenant the check named (by key or id): the
	// tenant_id of /v1/settle, /v1/refund and /v1/release.
	TenantID string `json:"tenant_id"`
	// RequestID names a counted, admitted check for /v1/settle,
	// /v1/refund and /v1/release (null otherwise).
	RequestID *string `json:"request_id"`
	// Status, Headers and Problem are what a metered route would have
	// answered: its status, the headers to relay (the quota headers, and
	// on a refusal Retry-After and Content-Type), and on a refusal its
	// body (the problem, or a degrade policy's fallback).
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Problem json.RawMessage   `json:"problem"`
	// Fallback is a degrade policy's fallback body, which is not JSON.
	Fallback *string `json:"fallback,omitempty"`
}

// check meters for backends that do not proxy through Tollgate: the service
// names the tenant (by key or id), the meter and the cost; dry_run asks
// whether it would fit without consuming anything (Server.Decide).
func (s *Server) check(c *fiber.Ctx) error {
	if err := s.guard.BearerAuth(c, s.guard.Service, s.opts.ServiceToken, "tollgate-service", "service token"); err != nil {
		return err
	}
	var body CheckRequest
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return err
	}
	if body.Cost != nil && *body.Cost < 1 {
		return quota.FieldError("cost", "must be an integer between 1 and %d", quota.MaxQuantity)
	}
	if len(body.Path) > 2048 || !printable(body.Path) {
		return quota.FieldError("path", "must be at most 2048 printable ASCII characters")
	}
	a := Ask{APIKey: body.APIKey, TenantID: body.TenantID, Meter: body.Meter, DryRun: body.DryRun,
		IdempotencyKey: body.IdempotencyKey, Instance: body.Path, Hold: body.Hold}
	if body.Cost != nil {
		a.Cost = *body.Cost
	}
	out, err := s.Decide(c.UserContext(), a)
	if err != nil {
		if out.Decision.Idem == quota.IdemLimit {
			return idemRefusal(c, out.Decision)
		}
		return err
	}
	d, p := out.Decision, out.Principal
	setRateLimitHeaders(c, d)
	resp := CheckResponse{Allowed: d.Allowed, Limits: usage.Limits(d), ViolatedPolicies: d.Violated,
		Degraded: d.Degraded, Replayed: d.Replayed(), TenantID: p.Tenant.ID, Status: out.Relay.Status, Headers: out.Relay.HeaderMap()}
	if out.RequestID != "" {
		resp.RequestID = &out.RequestID
	}
	if d.Allowed {
		resp.Upgrade = p.Upgrade()
	} else {
		resp.Upgrade = p.RefusalUpgrade(&d) // the hint of what refused
	}
	if refusedForCredit(d) {
		resp.TopUpURL = p.Tier.TopUpURL
	}
	if d.Fallback != nil {
		resp.DegradedBy = d.Fallback.Policy.Name
		f := string(out.Relay.Body)
		resp.Fallback = &f
	} else if out.Relay.Body != nil {
		resp.Problem = out.Relay.Body
	}
	for _, st := range d.Policies {
		if st.Outcome == quota.PolicyShadowRefused {
			resp.ShadowRefused = append(resp.ShadowRefused, st.Policy.Name)
		}
	}
	if resp.ViolatedPolicies == nil {
		resp.ViolatedPolicies = []quota.LimitName{}
	}
	if !d.Allowed && d.RetryAfter >= 0 {
		secs := max(1, quota.CeilSeconds(d.RetryAfter))
		resp.RetryAfter = &secs
	}
	if resp.Problem == nil {
		resp.Problem = json.RawMessage("null")
	}
	return c.JSON(resp)
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
