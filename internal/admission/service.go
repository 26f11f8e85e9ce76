package admission

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/telemetry"
)

// Service is the admission use case that the metered proxy and the
// decision API (POST /v1/check, the Envoy services) share, in front of the
// Gate: the prepaid retry, the reservations of settle routes and counted
// checks, idempotent answers (refusals, stored first answers, replays),
// refunds of requests whose upstream failed, the release of what an
// admitted request holds, and settlements with their audit entries. Its
// callers parse their input and encode its answers; it is safe for
// concurrent use.
type Service struct {
	gate     *Gate
	balances Balances
	policies Policies
	audit    auditLog
	log      *slog.Logger
	now      func() time.Time
	tracer   trace.Tracer
}

// Balances is where a prepaid tenant's balance is read (*catalog.Catalog).
type Balances interface {
	// Prepaid is the balance p's admissions at now draw on, nil for a
	// postpaid tier.
	Prepaid(ctx context.Context, p catalog.Principal, now time.Time) (*quota.Prepaid, error)
	// PrepaidAt is p's balance in the billing period containing at.
	PrepaidAt(ctx context.Context, p catalog.Principal, at time.Time) (*quota.Prepaid, error)
}

// Policies lists the policies (*catalog.Catalog); the slice is never
// modified once returned.
type Policies interface {
	Policies(ctx context.Context) ([]quota.Policy, error)
}

// Auditor writes a settlement to the audit log (*catalogdb.Store).
type Auditor interface {
	AuditSettlement(ctx context.Context, actor string, r quota.SettlementRecord) error
}

// ServiceDeps are what NewService wires together.
type ServiceDeps struct {
	Gate     *Gate
	Balances Balances
	// Policies, when nil, lists none.
	Policies Policies
	// Audit, when nil, leaves settlements in the node's log only.
	Audit Auditor
	Log   *slog.Logger // nil: slog.Default()
	Now   func() time.Time
	// Tracer, when not nil, puts each admission in a span of its own,
	// a child of the caller's.
	Tracer trace.Tracer
}

// NewService returns the use case over d.
func NewService(d ServiceDeps) *Service {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	return &Service{gate: d.Gate, balances: d.Balances, policies: d.Policies, audit: newAuditLog(d.Audit, d.Log),
		log: d.Log, now: d.Now, tracer: d.Tracer}
}

// Admit decides req of principal p through the Gate (Gate.Admit: its
// errors are those of a decision that could not be taken). A prepaid
// tenant's request carries the balance it draws on (req.Prepaid is set
// here, from the catalog's cache); when the admission script's clock is in
// another billing period than that balance, the balance of the script's
// period is read and req decided once more. A decision its idempotency key
// made is no error here: see IdemError.
func (s *Service) Admit(ctx context.Context, p *catalog.Principal, req *quota.Request) (quota.Decision, error) {
	if s.tracer != nil {
		return s.admitTraced(ctx, p, req)
	}
	return s.admit(ctx, p, req)
}

// admit is Admit without its span.
func (s *Service) admit(ctx context.Context, p *catalog.Principal, req *quota.Request) (quota.Decision, error) {
	if p.Tier.IsPrepaid() {
		pp, err := s.balances.Prepaid(ctx, *p, s.now())
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
			if req.Prepaid, err = s.balances.PrepaidAt(ctx, *p, stale.Now); err != nil {
				return quota.Decision{}, err
			}
			d, err = s.gate.Admit(ctx, *req)
		}
	}
	return d, err
}

// admitTraced is admit in a child span of ctx's: the decision, with its
// outcome, or its error.
func (s *Service) admitTraced(ctx context.Context, p *catalog.Principal, req *quota.Request) (quota.Decision, error) {
	ctx, span := s.tracer.Start(ctx, "tollgate.admit", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(telemetry.TenantID.String(req.TenantID), telemetry.Meter.String(req.Meter),
			telemetry.Cost.Int64(req.Cost), telemetry.DryRun.Bool(req.DryRun)))
	defer span.End()
	d, err := s.admit(ctx, p, req)
	if err != nil {
		span.SetAttributes(telemetry.Decision.String(telemetry.DecisionUnavailable))
		span.SetStatus(codes.Error, "admission failed")
		span.RecordError(err)
		return d, err
	}
	TraceOutcome(ctx, Outcome(d), d)
	return d, nil
}

// Checked is a check's decision, and the id its admission was reserved
// under.
type Checked struct {
	Decision quota.Decision
	// RequestID names a counted, admitted check for Settle, Refund and
	// ReleaseCheck (req.RequestID); a repeat of an idempotency key gets
	// the first check's. Empty for a dry run, a refusal, and an admission
	// that could not be reserved (its cost is final).
	RequestID string
}

// Check decides a check (POST /v1/check, the Envoy services): Admit, then
// a counted admission is reserved under req.RequestID for Settle and
// Refund within quota.SettleWindow, noted in its idempotency record for
// the repeats of its key, and its concurrency leases held in Redis are
// recorded for ReleaseCheck. A reservation that fails is logged: the
// decision stands. A decision its idempotency key made is returned with
// IdemError's error; any other error leaves Checked empty.
func (s *Service) Check(ctx context.Context, p *catalog.Principal, req *quota.Request) (Checked, error) {
	d, err := s.Admit(ctx, p, req)
	if err != nil {
		return Checked{}, err
	}
	out := Checked{Decision: d}
	if err := IdemError(d); err != nil {
		return out, err
	}
	counted := !req.DryRun
	if counted && d.Allowed && !d.Replayed() && d.Fallback == nil {
		if err := s.gate.Reserve(ctx, req.RequestID, *req, d); err != nil {
			s.log.Error("reserving a check failed; its cost is final", "tenant_id", req.TenantID, "meter", req.Meter, "err", err)
			return out, nil
		}
		out.RequestID = req.RequestID
		if req.IdempotencyKey != "" && !d.Degraded {
			if err := s.gate.NoteRequestID(ctx, *req, req.RequestID); err != nil {
				s.log.Error("noting a check's request id for its repeats failed", "tenant_id", req.TenantID, "err", err)
			}
		}
		if s.tracer != nil {
			trace.SpanFromContext(ctx).SetAttributes(telemetry.RequestID.String(req.RequestID))
		}
		if held(d) {
			if err := s.gate.Hold(ctx, *req, d); err != nil {
				s.log.Error("recording a check's leases failed; they lapse with their lease", "tenant_id", req.TenantID, "err", err)
			}
		}
	}
	if counted && d.Replayed() {
		// A repeat answers the first check's id (when noted: a repeat
		// concurrent with the first may come before it).
		if out.RequestID, err = s.gate.RequestIDOf(ctx, *req); err != nil {
			s.log.Error("reading a repeated check's request id failed", "tenant_id", req.TenantID, "err", err)
			out.RequestID = ""
		}
	}
	return out, nil
}

// held reports whether d holds concurrency leases in Redis.
func held(d quota.Decision) bool {
	for _, st := range d.Policies {
		if st.Policy.Algorithm == quota.AlgConcurrency && st.Outcome == quota.PolicyAdmitted && st.Policy.InRedis() {
			return true
		}
	}
	return false
}

// IdemError is the error of a decision its idempotency key made, nil for
// any other: CodeIdempotencyLimit when the tenant's stored answers fill
// their room (retry after d.RetryAfter), CodeConflict while the first
// request is in flight, CodeMismatch (field Idempotency-Key) when the key
// was used for another request.
func IdemError(d quota.Decision) error {
	switch d.Idem {
	case quota.IdemLimit:
		return quota.Errorf(quota.CodeIdempotencyLimit,
			"this tenant's stored idempotent answers fill their room (answers live 24 hours; a request in flight holds room for the largest answer); retry after %d s, or send the request without an Idempotency-Key",
			max(1, quota.CeilSeconds(d.RetryAfter)))
	case quota.IdemInFlight:
		return quota.Errorf(quota.CodeConflict, "a request with this Idempotency-Key is still in flight; retry once it has answered")
	case quota.IdemMismatch:
		return &quota.Error{Code: quota.CodeMismatch, Field: "Idempotency-Key",
			Message: "this Idempotency-Key was used for a different request (method, path or body); use a new key"}
	}
	return nil
}

// Outcome names decision d as the metered path counts it and the spans
// record it: allowed, refused, degraded (a degrade policy's fallback),
// replayed, idempotency_conflict or idempotency_limit.
func Outcome(d quota.Decision) string {
	switch {
	case d.Idem == quota.IdemLimit:
		return "idempotency_limit"
	case d.Idem == quota.IdemInFlight, d.Idem == quota.IdemMismatch:
		return "idempotency_conflict"
	case d.Fallback != nil:
		return telemetry.DecisionDegraded
	case !d.Allowed:
		return telemetry.DecisionRefused
	case d.Replayed():
		return telemetry.DecisionReplayed
	}
	return telemetry.DecisionAllowed
}

// TraceOutcome records decision d on the span of ctx: outcome is
// Outcome's, or "unavailable".
func TraceOutcome(ctx context.Context, outcome string, d quota.Decision) {
	span := trace.SpanFromContext(ctx)
	attrs := make([]attribute.KeyValue, 0, 4)
	switch outcome {
	case "idempotency_conflict", "idempotency_limit":
		attrs = append(attrs, telemetry.Decision.String(telemetry.DecisionRefused),
			telemetry.Idempotency.String(outcome[len("idempotency_"):]))
	default:
		attrs = append(attrs, telemetry.Decision.String(outcome))
	}
	if len(d.Violated) > 0 {
		v := make([]string, len(d.Violated))
		for i, l := range d.Violated {
			v[i] = string(l)
		}
		attrs = append(attrs, telemetry.Violated.StringSlice(v))
	}
	if d.Degraded {
		attrs = append(attrs, telemetry.FailOpen.Bool(true))
	}
	span.SetAttributes(attrs...)
}

// detached is the context of what must follow an answer even when the
// client hung up (a refund, an idempotent answer stored or released): the
// request's values without its cancellation, bounded on its own.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
}

// Reserve reserves an admitted request of a settle route for Settle under
// id (the request id the upstream and the client are told), as
// Gate.Reserve does; it reports whether it did. A reservation that fails
// is logged: the route cost is then final. It runs even when ctx ended.
func (s *Service) Reserve(ctx context.Context, id string, req *quota.Request, d *quota.Decision) bool {
	ctx, cancel := detached(ctx)
	defer cancel()
	if err := s.gate.Reserve(ctx, id, *req, *d); err != nil {
		s.log.Error("reserving a settle route's request failed; its route cost is final", "tenant_id", req.TenantID, "meter", req.Meter, "err", err)
		return false
	}
	return true
}

// After is what is left to the caller once Finish ran.
type After int

const (
	// AfterNothing means nothing is left.
	AfterNothing After = iota
	// AfterRefunded means the request's units were given back (the client is
	// told so).
	AfterRefunded
	// AfterKeepAnswer means the request's answer is to be kept for the repeats
	// of its idempotency key (KeepAnswer).
	AfterKeepAnswer
)

// Finish ends an admitted metered request once its answer is made, or
// once it failed to make one (answered false), even when ctx ended. A
// request whose work was not done on a route that refunds it (refund) is
// refunded (Gate.Refund: its idempotency key released too); otherwise an
// idempotency key that did not decide in process (a fail-open admission
// records none) is released when no answer was made, so that a retry runs,
// and its answer is left to keep (AfterKeepAnswer) when one was. A refund
// that fails is logged and reported as AfterNothing.
func (s *Service) Finish(ctx context.Context, req *quota.Request, d *quota.Decision, refund, answered bool) After {
	switch {
	case refund:
		ctx, cancel := detached(ctx)
		defer cancel()
		if err := s.gate.Refund(ctx, *req, *d); err != nil {
			s.log.Error("refund failed", "tenant_id", req.TenantID, "meter", req.Meter, "err", err)
			return AfterNothing
		}
		return AfterRefunded
	case req.IdempotencyKey != "" && !d.Degraded:
		if answered {
			return AfterKeepAnswer
		}
		// No answer was made: give the key back rather than store half
		// an answer.
		ctx, cancel := detached(ctx)
		defer cancel()
		if err := s.gate.ReleaseKey(ctx, *req); err != nil {
			s.log.Error("releasing an idempotency key failed", "tenant_id", req.TenantID, "err", err)
		}
	}
	return AfterNothing
}

// Release ends what an admitted metered request held until its answer
// (Gate.Release: its concurrency leases, its place in an adaptive
// policy's flight), after the answer is made, even when ctx ended. A
// failure is logged: the leases then lapse.
func (s *Service) Release(ctx context.Context, req *quota.Request, d *quota.Decision) {
	ctx, cancel := detached(ctx)
	defer cancel()
	if err := s.gate.Release(ctx, *req, *d); err != nil {
		s.log.Error("releasing a concurrency lease failed; it expires with its lease", "tenant_id", req.TenantID, "err", err)
	}
}

// MaxReplayBody is the largest answer body kept for replays. The first
// answer to a larger body is sent as usual; its repeats are refused
// (Replay), since running the request again is what the key forbids. An
// answer whose headers pass quota.MaxAnswerHeader is treated the same.
const MaxReplayBody = quota.MaxAnswerBody

// tooLarge marks a kept answer whose body or headers were not kept.
const tooLarge = "Tollgate-Replay-Too-Large"

// Answer is a first answer to keep for the repeats of its idempotency key.
type Answer struct {
	Status int
	// Header is the headers to replay, a "Name: value\n" line each.
	Header string
	Body   []byte
	// Streamed: the body was passed on unread, as a stream; Size is then
	// its length (-1: unknown) and Body is nil.
	Streamed bool
	Size     int
}

// KeepAnswer keeps a, the first answer to req's idempotency key, for its
// repeats (Replay), even when ctx ended. An answer past what is kept (a
// streamed body, a body over MaxReplayBody, headers over
// quota.MaxAnswerHeader) is kept as too large: its repeats are refused,
// never run again. A failure is logged: the key then stays in flight
// until its lease ends (repeats are refused meanwhile, never run).
func (s *Service) KeepAnswer(ctx context.Context, req *quota.Request, a Answer) {
	stored := quota.StoredAnswer{Status: a.Status, Header: a.Header}
	switch {
	case a.Streamed:
		size := "more than " + strconv.Itoa(MaxReplayBody)
		if a.Size >= 0 {
			size = strconv.Itoa(a.Size)
		}
		stored.Header = tooLarge + ": " + size
	case len(a.Body) > MaxReplayBody:
		stored.Header = tooLarge + ": " + strconv.Itoa(len(a.Body))
	case len(a.Header) > quota.MaxAnswerHeader:
		// (its room holds quota.AnswerReserve: the body and the headers
		// of the largest answer)
		stored.Header = tooLarge + ": headers " + strconv.Itoa(len(a.Header))
	default:
		stored.Body = a.Body
	}
	ctx, cancel := detached(ctx)
	defer cancel()
	if err := s.gate.StoreAnswer(ctx, *req, stored); err != nil {
		s.log.Error("storing an idempotent answer failed", "tenant_id", req.TenantID, "err", err)
	}
}

// Replay reads the first answer to req's idempotency key for a repeat
// (Decision.Replayed()): its status, the headers to replay (a "Name:
// value\n" line each) and its body. A repeat whose answer is no longer
// stored, or was too large to keep, is a CodeConflict error.
func (s *Service) Replay(ctx context.Context, req *quota.Request) (quota.StoredAnswer, error) {
	a, err := s.gate.Answer(ctx, *req)
	if errors.Is(err, quota.ErrNoAnswer) {
		return a, quota.Errorf(quota.CodeConflict, "the answer to this Idempotency-Key is no longer stored; use a new key")
	}
	if err != nil {
		return a, err
	}
	if value, ok := strings.CutPrefix(a.Header, tooLarge+": "); ok {
		if n, ok := strings.CutPrefix(value, "headers "); ok {
			return a, quota.Errorf(quota.CodeConflict,
				"the first answer to this Idempotency-Key had %s bytes of headers to replay, more than the %d stored for replays; it ran once and is not run again",
				n, quota.MaxAnswerHeader)
		}
		return a, quota.Errorf(quota.CodeConflict,
			"the first answer to this Idempotency-Key (%s bytes) was larger than the %d bytes stored for replays; it ran once and is not run again",
			value, MaxReplayBody)
	}
	return a, nil
}
