package httpapi

import (
	"context"
	"log/slog"
	"sync"
	"time"

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
	ctx := c.UserContext()
	st, err := s.gate.Settle(ctx, body.TenantID, body.RequestID, *body.ActualCost)
	if err != nil {
		return err
	}
	switch st.Status {
	case quota.SettleAlready:
		return quota.Errorf(quota.CodeConflict, "request %s was settled before; nothing changed", body.RequestID)
	case quota.SettleRefunded:
		return quota.Errorf(quota.CodeConflict, "request %s was refunded before; nothing changed", body.RequestID)
	case quota.SettleUnknown:
		return quota.Errorf(quota.CodeNotFound, "tenant %s has no request %s to settle: unknown, or admitted more than 10 minutes ago (its route cost is final)", body.TenantID, body.RequestID)
	}
	s.settlements.record(ctx, quota.SettleByService, quota.SettlementRecord{RequestID: body.RequestID, TenantID: body.TenantID,
		ActualCost: *body.ActualCost, Delta: st.Delta, RemoteIP: s.guard.ClientIP(c).String()})
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
	ctx := c.UserContext()
	st, err := s.gate.RefundReserved(ctx, body.TenantID, body.RequestID)
	if err != nil {
		return err
	}
	switch st.Status {
	case quota.SettleAlready:
		return quota.Errorf(quota.CodeConflict, "request %s was settled before; nothing changed (a settled request is not refunded)", body.RequestID)
	case quota.SettleRefunded:
		return quota.Errorf(quota.CodeConflict, "request %s was refunded before; nothing changed", body.RequestID)
	case quota.SettleUnknown:
		return quota.Errorf(quota.CodeNotFound, "tenant %s has no request %s to refund: unknown, or counted more than 10 minutes ago (its cost is final)", body.TenantID, body.RequestID)
	}
	s.settlements.record(ctx, quota.SettleByRefund, quota.SettlementRecord{RequestID: body.RequestID, TenantID: body.TenantID,
		ActualCost: 0, Delta: st.Delta, RemoteIP: s.guard.ClientIP(c).String()})
	n, err := s.releaseHeld(ctx, body.TenantID, body.RequestID)
	if err != nil {
		s.log.Error("releasing a refunded check's leases failed; they lapse with their lease", "tenant_id", body.TenantID, "err", err)
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
	n, err := s.releaseHeld(c.UserContext(), body.TenantID, body.RequestID)
	if err != nil {
		return err
	}
	if n == 0 {
		return quota.Errorf(quota.CodeNotFound, "tenant %s holds no lease under request %s: never held, released before, or lapsed", body.TenantID, body.RequestID)
	}
	return c.JSON(ReleaseResponse{Released: true, RequestID: body.RequestID, ReleasedLeases: n})
}

// releaseHeld ends the leases a check holds under requestID, once (the
// first caller takes the record), and reports how many it held. A lease
// whose policy no longer exists lapses.
func (s *Server) releaseHeld(ctx context.Context, tenantID, requestID string) (int, error) {
	held, err := s.gate.TakeHold(ctx, tenantID, requestID)
	if err != nil || len(held) == 0 {
		return 0, err
	}
	req := quota.Request{TenantID: tenantID, RequestID: requestID}
	if s.policies != nil {
		list, err := s.policies.Policies(ctx)
		if err != nil {
			return 0, err
		}
		for _, h := range held {
			for i := range list {
				if pol := &list[i]; pol.Name == h.Policy && pol.Algorithm == quota.AlgConcurrency {
					limit, _ := pol.LimitFor(h.Value)
					req.Policies = append(req.Policies, quota.PolicyCall{Policy: pol, Value: h.Value, Limit: limit})
				}
			}
		}
	}
	if len(req.Policies) == 0 {
		return len(held), nil
	}
	if err := s.gate.ReleaseLeases(ctx, req); err != nil {
		return 0, err
	}
	return len(held), nil
}

// settlementLog writes settlements to the audit log. POST /v1/settle's is
// written before its answer; the upstream header's, from the metered path,
// is written off it, by a goroutine of its own (at most maxAuditWriters at
// once), so that a metered request never waits for Postgres. A settlement
// the log does not take (Postgres away, or every writer busy) is logged by
// the node instead, with every field of its entry: the settlement itself,
// in Redis, is applied whatever the log does.
type settlementLog struct {
	store interface {
		AuditSettlement(ctx context.Context, actor string, r quota.SettlementRecord) error
	}
	log     *slog.Logger
	writers chan struct{}
	wg      *sync.WaitGroup
}

// maxAuditWriters bounds the settlements being written off the metered
// path at once.
const maxAuditWriters = 64

// auditTimeout bounds the writing of one entry.
const auditTimeout = 5 * time.Second

func newSettlementLog(store records, log *slog.Logger) settlementLog {
	l := settlementLog{log: log, writers: make(chan struct{}, maxAuditWriters), wg: &sync.WaitGroup{}}
	if store != nil {
		l.store = store
	}
	return l
}

// record writes r by actor, now.
func (l settlementLog) record(ctx context.Context, actor string, r quota.SettlementRecord) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), auditTimeout)
	defer cancel()
	var err error
	if l.store != nil {
		err = l.store.AuditSettlement(ctx, actor, r)
	}
	if err != nil || l.store == nil {
		l.lost(actor, r, err)
	}
}

// recordLater writes r by actor off the request's path.
func (l settlementLog) recordLater(ctx context.Context, actor string, r quota.SettlementRecord) {
	select {
	case l.writers <- struct{}{}:
	default:
		l.lost(actor, r, errAuditBusy)
		return
	}
	l.wg.Add(1)
	go func() {
		defer func() { <-l.writers; l.wg.Done() }()
		l.record(ctx, actor, r)
	}()
}

// wait returns once the settlements being written off the path are.
func (l settlementLog) wait() { l.wg.Wait() }

var errAuditBusy = quota.Errorf(quota.CodeUnavailable, "every audit writer is busy")

func (l settlementLog) lost(actor string, r quota.SettlementRecord, err error) {
	if l.log == nil {
		return
	}
	l.log.Error("a settlement is not in the audit log", "actor", actor, "request_id", r.RequestID, "tenant_id", r.TenantID,
		"actual_cost", r.ActualCost, "delta", r.Delta, "remote_ip", r.RemoteIP, "err", err)
}

// WaitAudits returns once the settlements this server writes to the audit
// log off the metered path are written: at shutdown, before Postgres
// closes.
func (s *Server) WaitAudits() { s.settlements.wait() }
