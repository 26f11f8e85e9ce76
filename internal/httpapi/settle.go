package httpapi

import (
	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// SettleRequest is POST /v1/settle's body. TenantID names the tenant whose
// request it settles (the upstream learns it in X-Tollgate-Tenant-Id): a
// request id is found under its own tenant only.
type SettleRequest struct {
	RequestID  string `json:"request_id"`
	ActualCost *int64 `json:"actual_cost"`
	TenantID   string `json:"tenant_id"`
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

// settle settles a request of a settle route (its Tollgate-Request-Id, of
// the tenant tenant_id) to its actual cost, with the service token, exactly
// once and within quota.SettleWindow: 200 when applied (and recorded in
// the audit log), 409 when settled before (by the upstream's header or an
// earlier call, on any node), 404 when the tenant has no reservation under
// the id (never made, another tenant's, or older than the window: the
// answer does not tell which).
func (s *Server) settle(c *fiber.Ctx) error {
	if err := s.guard.BearerAuth(c, s.guard.Service, s.opts.ServiceToken, "tollgate-service", "service token"); err != nil {
		return err
	}
	var body SettleRequest
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return err
	}
	if err := checkRequestID(body.RequestID); err != nil {
		return err
	}
	if body.ActualCost == nil || *body.ActualCost < 0 || *body.ActualCost > quota.MaxQuantity {
		return quota.FieldError("actual_cost", "must be an integer between 0 and %d", quota.MaxQuantity)
	}
	if err := checkRequestRef(body.TenantID, body.RequestID); err != nil {
		return err
	}
	s.traceRef(c.UserContext(), body.TenantID, body.RequestID)
	st, err := s.adm.Settle(c.UserContext(), body.TenantID, body.RequestID, *body.ActualCost, s.guard.ClientIP(c).String())
	if err != nil {
		return err
	}
	return c.JSON(SettleResponse{Settled: true, RequestID: body.RequestID, ActualCost: *body.ActualCost, Delta: st.Delta})
}

// checkRequestRef checks the tenant and request id that name a reserved
// request (a settle route's, or a counted check's).
func checkRequestRef(tenantID, requestID string) error {
	if err := checkRequestID(requestID); err != nil {
		return err
	}
	if !quota.ValidID(tenantID) {
		return quota.FieldError("tenant_id", "must be the id (UUID) of the tenant whose request it is (X-Tollgate-Tenant-Id)")
	}
	return nil
}

// checkRequestID checks a reserved request's id.
func checkRequestID(requestID string) error {
	if requestID == "" || len(requestID) > 128 {
		return quota.FieldError("request_id", "must be the Tollgate-Request-Id of a settle route's request, or a check's request_id (1 to 128 characters)")
	}
	for i := 0; i < len(requestID); i++ {
		if ch := requestID[i]; ch <= ' ' || ch >= 0x7f {
			return quota.FieldError("request_id", "must be printable ASCII without spaces")
		}
	}
	return nil
}

// RequestRef is the body of POST /v1/refund and /v1/release: a reserved
// request of a tenant.
type RequestRef struct {
	TenantID  string `json:"tenant_id"`
	RequestID string `json:"request_id"`
}

// requestRef authenticates the service and reads a RequestRef body, as
// POST /v1/refund and /v1/release take it.
func (s *Server) requestRef(c *fiber.Ctx) (RequestRef, error) {
	var body RequestRef
	if err := s.guard.BearerAuth(c, s.guard.Service, s.opts.ServiceToken, "tollgate-service", "service token"); err != nil {
		return body, err
	}
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return body, err
	}
	if err := checkRequestRef(body.TenantID, body.RequestID); err != nil {
		return body, err
	}
	s.traceRef(c.UserContext(), body.TenantID, body.RequestID)
	return body, nil
}

// RefundResponse is POST /v1/refund's answer when the refund applied.
type RefundResponse struct {
	Refunded  bool   `json:"refunded"`
	RequestID string `json:"request_id"`
	// Delta is the units given back, negative (minus the cost the request
	// stood at: its admitted cost).
	Delta int64 `json:"delta"`
	// ReleasedLeases counts the concurrency leases the refund ended.
	ReleasedLeases int `json:"released_leases"`
}

// refund gives back a counted check (its request_id) or a settle route's
// request whole, exactly once and within quota.SettleWindow, and ends the
// concurrency leases it holds: 200 when applied (recorded in the audit
// log), 409 when settled or refunded before, 404 when the tenant has no
// reservation under the id.
func (s *Server) refund(c *fiber.Ctx) error {
	body, err := s.requestRef(c)
	if err != nil {
		return err
	}
	st, n, err := s.adm.Refund(c.UserContext(), body.TenantID, body.RequestID, s.guard.ClientIP(c).String())
	if err != nil {
		return err
	}
	return c.JSON(RefundResponse{Refunded: true, RequestID: body.RequestID, Delta: st.Delta, ReleasedLeases: n})
}

// ReleaseResponse is POST /v1/release's answer.
type ReleaseResponse struct {
	Released       bool   `json:"released"`
	RequestID      string `json:"request_id"`
	ReleasedLeases int    `json:"released_leases"`
}

// releaseCheck ends the concurrency leases a check took with hold: true:
// 200 when it held some, 404 when it holds none (never held, released or
// refunded before, or lapsed with its lease). Its cost stands.
func (s *Server) releaseCheck(c *fiber.Ctx) error {
	body, err := s.requestRef(c)
	if err != nil {
		return err
	}
	n, err := s.adm.ReleaseCheck(c.UserContext(), body.TenantID, body.RequestID)
	if err != nil {
		return err
	}
	return c.JSON(ReleaseResponse{Released: true, RequestID: body.RequestID, ReleasedLeases: n})
}

// WaitAudits returns once the settlements this server writes to the audit
// log off the metered path are written: at shutdown, before Postgres
// closes.
func (s *Server) WaitAudits() { s.adm.WaitAudits() }
