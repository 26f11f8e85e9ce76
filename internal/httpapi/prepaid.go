package httpapi

import (
	"slices"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// ProblemCreditExhausted is the problem type of a prepaid tenant's request
// refused because its credit does not cover it (402).
const ProblemCreditExhausted = "https://tollgate.dev/problems/credit-exhausted" //nolint:gosec // G101: a problem type URI, not a credential

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
