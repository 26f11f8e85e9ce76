package admission

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Settle settles a reserved request (a settle route's Tollgate-Request-Id,
// or a counted check's request id) of tenantID to its actual cost, exactly
// once and within quota.SettleWindow, and records the settlement in the
// audit log, naming remoteIP, before it returns. Errors: CodeConflict when
// it was settled or refunded before (by the upstream's header or an
// earlier call, on any node), CodeNotFound when the tenant has no
// reservation under the id (never made, another tenant's, or older than
// the window: the error does not tell which), else the store's.
func (s *Service) Settle(ctx context.Context, tenantID, requestID string, actual int64, remoteIP string) (quota.Settlement, error) {
	st, err := s.gate.Settle(ctx, tenantID, requestID, actual)
	if err != nil {
		return st, err
	}
	switch st.Status {
	case quota.SettleAlready:
		return st, quota.Errorf(quota.CodeConflict, "request %s was settled before; nothing changed", requestID)
	case quota.SettleRefunded:
		return st, quota.Errorf(quota.CodeConflict, "request %s was refunded before; nothing changed", requestID)
	case quota.SettleUnknown:
		return st, quota.Errorf(quota.CodeNotFound, "tenant %s has no request %s to settle: unknown, or admitted more than 10 minutes ago (its route cost is final)", tenantID, requestID)
	}
	s.audit.record(ctx, quota.SettleByService, quota.SettlementRecord{RequestID: requestID, TenantID: tenantID,
		ActualCost: actual, Delta: st.Delta, RemoteIP: remoteIP})
	return st, nil
}

// SettleByUpstream settles the request of a settle route reserved under id
// to the actual cost its upstream reported, even when ctx ended, and
// reports whether the settlement applied. Its audit entry is written off
// the request's path (WaitAudits). A failure is logged: the route cost
// then stands until a Settle, or for good.
func (s *Service) SettleByUpstream(ctx context.Context, tenantID, meter, id string, actual int64) bool {
	ctx, cancel := detached(ctx)
	defer cancel()
	st, err := s.gate.Settle(ctx, tenantID, id, actual)
	if err != nil {
		s.log.Error("settling from Tollgate-Actual-Cost failed", "tenant_id", tenantID, "meter", meter, "err", err)
		return false
	}
	if st.Status != quota.SettleApplied {
		return false
	}
	s.audit.recordLater(ctx, quota.SettleByUpstream,
		quota.SettlementRecord{RequestID: id, TenantID: tenantID, ActualCost: actual, Delta: st.Delta})
	return true
}

// Refund gives back a reserved request (a counted check, or a settle
// route's request) whole, exactly once and within quota.SettleWindow,
// records it in the audit log naming remoteIP, and ends the concurrency
// leases the request holds: it reports the settlement and how many leases
// it ended (a failure to end them is logged: they lapse with their
// lease). Errors: CodeConflict when it was settled or refunded before,
// CodeNotFound when the tenant has no reservation under the id, else the
// store's.
func (s *Service) Refund(ctx context.Context, tenantID, requestID, remoteIP string) (quota.Settlement, int, error) {
	st, err := s.gate.RefundReserved(ctx, tenantID, requestID)
	if err != nil {
		return st, 0, err
	}
	switch st.Status {
	case quota.SettleAlready:
		return st, 0, quota.Errorf(quota.CodeConflict, "request %s was settled before; nothing changed (a settled request is not refunded)", requestID)
	case quota.SettleRefunded:
		return st, 0, quota.Errorf(quota.CodeConflict, "request %s was refunded before; nothing changed", requestID)
	case quota.SettleUnknown:
		return st, 0, quota.Errorf(quota.CodeNotFound, "tenant %s has no request %s to refund: unknown, or counted more than 10 minutes ago (its cost is final)", tenantID, requestID)
	}
	s.audit.record(ctx, quota.SettleByRefund, quota.SettlementRecord{RequestID: requestID, TenantID: tenantID,
		ActualCost: 0, Delta: st.Delta, RemoteIP: remoteIP})
	n, err := s.releaseHeld(ctx, tenantID, requestID)
	if err != nil {
		s.log.Error("releasing a refunded check's leases failed; they lapse with their lease", "tenant_id", tenantID, "err", err)
	}
	return st, n, nil
}

// ReleaseCheck ends the concurrency leases a check took with hold, once,
// and reports how many it ended; its cost stands. CodeNotFound when it
// holds none (never held, released or refunded before, or lapsed with its
// lease).
func (s *Service) ReleaseCheck(ctx context.Context, tenantID, requestID string) (int, error) {
	n, err := s.releaseHeld(ctx, tenantID, requestID)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, quota.Errorf(quota.CodeNotFound, "tenant %s holds no lease under request %s: never held, released before, or lapsed", tenantID, requestID)
	}
	return n, nil
}

// releaseHeld ends the leases a check holds under requestID, once (the
// first caller takes the record), and reports how many it held. A lease
// whose policy no longer exists lapses.
func (s *Service) releaseHeld(ctx context.Context, tenantID, requestID string) (int, error) {
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

// WaitAudits returns once the settlements written to the audit log off the
// request's path (SettleByUpstream) are written: at shutdown, before
// Postgres closes.
func (s *Service) WaitAudits() { s.audit.wait() }

// auditLog writes settlements to the audit log. Settle's and Refund's are
// written before they return; SettleByUpstream's, from the metered path,
// off it, by a goroutine of its own (at most maxAuditWriters at once), so
// that a metered request never waits for Postgres. A settlement the log
// does not take (Postgres away, or every writer busy) is logged by the
// node instead, with every field of its entry: the settlement itself, in
// Redis, is applied whatever the log does.
type auditLog struct {
	store   Auditor
	log     *slog.Logger
	writers chan struct{}
	wg      *sync.WaitGroup
}

// maxAuditWriters bounds the settlements being written off the metered
// path at once.
const maxAuditWriters = 64

// auditTimeout bounds the writing of one entry.
const auditTimeout = 5 * time.Second

func newAuditLog(store Auditor, log *slog.Logger) auditLog {
	return auditLog{store: store, log: log, writers: make(chan struct{}, maxAuditWriters), wg: &sync.WaitGroup{}}
}

// record writes r by actor, now.
func (l auditLog) record(ctx context.Context, actor string, r quota.SettlementRecord) {
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
func (l auditLog) recordLater(ctx context.Context, actor string, r quota.SettlementRecord) {
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
func (l auditLog) wait() { l.wg.Wait() }

var errAuditBusy = quota.Errorf(quota.CodeUnavailable, "every audit writer is busy")

func (l auditLog) lost(actor string, r quota.SettlementRecord, err error) {
	if l.log == nil {
		return
	}
	l.log.Error("a settlement is not in the audit log", "actor", actor, "request_id", r.RequestID, "tenant_id", r.TenantID,
		"actual_cost", r.ActualCost, "delta", r.Delta, "remote_ip", r.RemoteIP, "err", err)
}
