package httpapi

import (
	"strconv"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/catalog"
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
}

// check meters for backends that do not proxy through Tollgate: the service
// names the tenant (by key or id), the meter and the cost; dry_run asks
// whether it would fit without consuming anything.
func (s *Server) check(c *fiber.Ctx) error {
	if err := s.guard.BearerAuth(c, s.guard.Service, s.opts.ServiceToken, "tollgate-service", "service token"); err != nil {
		return err
	}
	var body CheckRequest
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return err
	}
	var p catalog.Principal
	var err error
	switch {
	case body.APIKey != "" && body.TenantID != "":
		return quota.FieldError("tenant_id", "give api_key or tenant_id, not both")
	case body.APIKey != "":
		if p, err = s.catalog.Resolve(c.UserContext(), body.APIKey); err != nil {
			return err
		}
	case body.TenantID != "":
		if !quota.ValidID(body.TenantID) {
			return quota.FieldError("tenant_id", "must be a tenant id (UUID)")
		}
		if p, err = s.catalog.Principal(c.UserContext(), body.TenantID); err != nil {
			return err
		}
		if p.Tenant.Status == quota.StatusSuspended {
			return quota.Errorf(quota.CodeForbidden, "tenant suspended")
		}
	default:
		return quota.FieldError("api_key", "give api_key or tenant_id")
	}
	if !httpx.ValidMeter(body.Meter) {
		return quota.FieldError("meter", "must be 1 to 64 of a-z 0-9 _ . -")
	}
	cost := int64(1)
	if body.Cost != nil {
		cost = *body.Cost
	}
	if cost < 1 || cost > quota.MaxQuantity {
		return quota.FieldError("cost", "must be an integer between 1 and %d", quota.MaxQuantity)
	}
	if len(body.IdempotencyKey) > httpx.MaxIdempotencyKey {
		return quota.FieldError("idempotency_key", "must be at most %d characters", httpx.MaxIdempotencyKey)
	}
	// A check's answer is its decision: the key's record is complete at
	// once (no lease), and the fingerprint is what the check asked.
	req := quota.Request{
		TenantID: p.Tenant.ID, Meter: body.Meter, Cost: cost, Limits: p.Limits, Overage: p.Tier.Overage,
		OveragePriceCentsPer1K: p.Tier.OveragePriceCentsPer1K, FailOpen: p.Tier.FailOpen,
		MeterQuotas: p.Tier.MeterQuotas, DryRun: body.DryRun, IdempotencyKey: body.IdempotencyKey,
		IdempotencyFingerprint: "check " + body.Meter + " " + strconv.FormatInt(cost, 10),
		Calendar:               p.Calendar,
	}
	// The policies of the meter and tier apply to a check too, except
	// those that need the metered request itself: a path or method match,
	// scope ip or param (the caller is the backend, not the client), and
	// concurrency and adaptive (a check, counted or dry, has no end to
	// release a slot at: it takes none).
	if req.Policies, err = s.matchPolicies(c.UserContext(), body.Meter, "", "", p.Tier.Slug,
		scopeValues{tenant: p.Tenant.ID, key: p.KeyID}); err != nil {
		return err
	}
	if len(req.Policies) > 0 {
		req.RequestID = httpx.UniqueID(c)
	}
	d, err := s.admit(c.UserContext(), p, &req)
	if err != nil {
		return err
	}
	if len(d.Policies) > 0 {
		s.countPolicies(d)
	}
	if err := idemRefusal(c, d); err != nil {
		return err
	}
	setRateLimitHeaders(c, d)
	resp := CheckResponse{Allowed: d.Allowed, Limits: usage.Limits(d), ViolatedPolicies: d.Violated,
		Degraded: d.Degraded, Replayed: d.Replayed()}
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
	return c.JSON(resp)
}
