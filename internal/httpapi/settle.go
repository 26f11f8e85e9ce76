package httpapi

import (
	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// SettleRequest is POST /v1/settle's body.
type SettleRequest struct {
	RequestID  string `json:"request_id"`
	ActualCost *int64 `json:"actual_cost"`
}

// SettleResponse is its answer when the settle applied.
type SettleResponse struct {
	Settled    bool   `json:"settled"`
	RequestID  string `json:"request_id"`
	ActualCost int64  `json:"actual_cost"`
	// Delta is actual_cost - the route cost: negative units refunded,
	// positive units charged.
	Delta int64 `json:"delta"`
}

// settle settles a request of a settle route (its Tollgate-Request-Id) to
// its actual cost, with the service token, exactly once and within
// quota.SettleWindow: 200 when applied, 409 when settled before (by the
// upstream's header or an earlier call, on any node), 404 when no
// reservation is known (never made, or older than the window).
func (s *Server) settle(c *fiber.Ctx) error {
	if err := s.guard.BearerAuth(c, s.guard.Service, s.opts.ServiceToken, "tollgate-service", "service token"); err != nil {
		return err
	}
	var body SettleRequest
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return err
	}
	if body.RequestID == "" || len(body.RequestID) > 128 {
		return quota.FieldError("request_id", "must be the Tollgate-Request-Id of a settle route's request (1 to 128 characters)")
	}
	for i := 0; i < len(body.RequestID); i++ {
		if ch := body.RequestID[i]; ch <= ' ' || ch >= 0x7f {
			return quota.FieldError("request_id", "must be printable ASCII without spaces")
		}
	}
	if body.ActualCost == nil || *body.ActualCost < 0 || *body.ActualCost > quota.MaxQuantity {
		return quota.FieldError("actual_cost", "must be an integer between 0 and %d", quota.MaxQuantity)
	}
	ctx := c.UserContext()
	tenantID, err := s.gate.SettleTenant(ctx, body.RequestID)
	if err != nil {
		return err
	}
	if tenantID == "" {
		return quota.Errorf(quota.CodeNotFound, "no request %s to settle: unknown, or admitted more than 10 minutes ago (its route cost is final)", body.RequestID)
	}
	st, err := s.gate.Settle(ctx, tenantID, body.RequestID, *body.ActualCost)
	if err != nil {
		return err
	}
	switch st.Status {
	case quota.SettleAlready:
		return quota.Errorf(quota.CodeConflict, "request %s was settled before; nothing changed", body.RequestID)
	case quota.SettleUnknown:
		return quota.Errorf(quota.CodeNotFound, "no request %s to settle: unknown, or admitted more than 10 minutes ago (its route cost is final)", body.RequestID)
	}
	return c.JSON(SettleResponse{Settled: true, RequestID: body.RequestID, ActualCost: *body.ActualCost, Delta: st.Delta})
}
