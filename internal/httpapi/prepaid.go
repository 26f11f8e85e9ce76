package httpapi

import (
	"context"
	"errors"
	"slices"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// ProblemCreditExhausted is the problem type of a prepaid tenant's request
// refused because its credit does not cover it (402).
const ProblemCreditExhausted = "https://tollgate.dev/problems/credit-exhausted"

// admit decides req of principal p. A prepaid tenant's request carries the
// balance it draws on (quota.Prepaid, from the catalog's cache); when the
// admission script's clock is in another billing period than the cached
// balance (a period just ended, or the clocks disagree about it), the
// balance of the script's period is read and the request asked once more.
// With tracing on, the admission is a span of its own (tracing.go).
func (s *Server) admit(ctx context.Context, p catalog.Principal, req *quota.Request) (quota.Decision, error) {
	if s.tracer != nil {
		return s.admitTraced(ctx, p, req)
	}
	return s.gateAdmit(ctx, p, req)
}

// gateAdmit is admit without its span.
func (s *Server) gateAdmit(ctx context.Context, p catalog.Principal, req *quota.Request) (quota.Decision, error) {
	if p.Tier.IsPrepaid() {
		pp, err := s.catalog.Prepaid(ctx, p, s.now())
		if err != nil {
			return quota.Decision{}, err
		}
		req.Prepaid = pp
	}
	d, err := s.gate.Admit(ctx, *req)
	if err != nil && req.Prepaid != nil {
		// (only then: the target of errors.As escapes, an allocation
		// every metered request would pay)
		var stale *quota.PrepaidStaleError
		if errors.As(err, &stale) {
			if req.Prepaid, err = s.catalog.PrepaidAt(ctx, p, stale.Now); err != nil {
				return quota.Decision{}, err
			}
			d, err = s.gate.Admit(ctx, *req)
		}
	}
	return d, err
}

// creditRefusal is the 402 problem of a prepaid tenant's request that its
// credit does not cover.
type creditRefusal struct {
	Type     string            `json:"type"`
	Title    string            `json:"title"`
	Status   int               `json:"status"`
	Detail   string            `json:"detail"`
	Instance string            `json:"instance,omitempty"`
	TopUpURL string            `json:"top_up_url"`
	Violated []quota.LimitName `json:"violated-policies"`
}

// refusedForCredit reports whether d was refused for want of credit.
func refusedForCredit(d quota.Decision) bool {
	return !d.Allowed && slices.Contains(d.Violated, quota.LimitCredit)
}

// writeCreditRefusal answers 402 with the credit-exhausted problem and the
// tier's top-up URL. No Retry-After: no wait brings credit back.
func writeCreditRefusal(c *fiber.Ctx, d quota.Decision, topUpURL, instance string) error {
	c.Response().Header.Del(fiber.HeaderRetryAfter)
	return httpx.SendProblemBody(c, fiber.StatusPaymentRequired, creditRefusalBody(d, topUpURL, instance))
}
