package tollgate

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// GateOptions configure a Gate.
type GateOptions struct {
	// Meter is the meter requests count against when the middleware
	// names none of its own (default "requests").
	Meter string
	// Cost is a request's cost when the middleware names none (default 1).
	Cost int64
	// FailOpen serves requests when Tollgate cannot decide (the network
	// failed, the check timed out, or Tollgate answered 5xx), marking
	// them with Tollgate-Degraded: fail-open and Admission.Outage. Without
	// it such requests are answered 503 problem+json.
	FailOpen bool
	// RefundOnServerError refunds an admitted request whose handler
	// answered 5xx (or failed), by its request id, so that the client
	// does not pay for the server's failure.
	RefundOnServerError bool
	// DenyCacheSize bounds the refusals remembered locally (per API key
	// and meter) until their Retry-After passes: default 1024; negative
	// turns the cache off.
	DenyCacheSize int
	// Now is the clock of the deny cache (time.Now when nil).
	Now func() time.Time
	// OnError hears what the Gate could not do: an outage of Tollgate, a
	// refund that failed. Nil: nothing is reported.
	OnError func(error)
}

// Gate admits requests through Tollgate's /v1/check and remembers
// refusals until their Retry-After passes. Gate.Middleware serves
// net/http; package fibermw serves Fiber. It is safe for concurrent use.
type Gate struct {
	client *ServiceClient
	opts   GateOptions
	deny   *denyCache
	calls  atomic.Int64
	local  atomic.Int64
}

// NewGate returns a Gate that asks client.
func NewGate(client *ServiceClient, opts GateOptions) *Gate {
	if opts.Meter == "" {
		opts.Meter = "requests"
	}
	if opts.Cost == 0 {
		opts.Cost = 1
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.DenyCacheSize == 0 {
		opts.DenyCacheSize = 1024
	}
	g := &Gate{client: client, opts: opts}
	if opts.DenyCacheSize > 0 {
		g.deny = newDenyCache(opts.DenyCacheSize)
	}
	return g
}

// Options returns the options the Gate runs with (defaults filled in).
func (g *Gate) Options() GateOptions { return g.opts }

// Stats counts what the Gate did: checks sent to Tollgate, and refusals
// answered from the deny cache without one.
type Stats struct{ Checks, LocalRefusals int64 }

// Stats returns the Gate's counts so far.
func (g *Gate) Stats() Stats { return Stats{Checks: g.calls.Load(), LocalRefusals: g.local.Load()} }

// Admission is the Gate's answer for one request.
type Admission struct {
	// Allowed: serve the request. Otherwise answer Status, Header and
	// Body as they are (Admission.WriteTo, or the middleware does it).
	Allowed bool
	Status  int
	// Header holds the headers to answer with, admitted or not: the quota
	// headers, and on a refusal Retry-After and Content-Type.
	Header map[string]string
	Body   []byte
	// TenantID and RequestID name a counted, admitted request, to Settle
	// or Refund it; empty otherwise.
	TenantID, RequestID string
	// Local: answered from the deny cache, without a call.
	Local bool
	// Outage is why Tollgate could not decide (an *OutageError); the
	// request is then served (FailOpen) or refused 503.
	Outage error
	// Result is Tollgate's decision; nil when there was none.
	Result *CheckResult
}

type admissionKey struct{}

// AdmissionFrom returns the Admission the middleware stored in ctx.
func AdmissionFrom(ctx context.Context) (*Admission, bool) {
	a, ok := ctx.Value(admissionKey{}).(*Admission)
	return a, ok
}

// WithAdmission returns ctx carrying a, for AdmissionFrom.
func WithAdmission(ctx context.Context, a *Admission) context.Context {
	return context.WithValue(ctx, admissionKey{}, a)
}

// Admit decides a request of apiKey on meter at cost (the Gate's defaults
// when "" and 0); path is the request's path, which a refusal names. A
// request without a key is refused 401 here; a key Tollgate refuses
// (unknown, suspended) or bad input answers Tollgate's problem as it is.
// ctx is the request's: when it ends, the check is abandoned and the
// request refused 503 (nobody is waiting for the answer).
func (g *Gate) Admit(ctx context.Context, apiKey, meter string, cost int64, path string) *Admission {
	if meter == "" {
		meter = g.opts.Meter
	}
	if cost == 0 {
		cost = g.opts.Cost
	}
	if apiKey == "" {
		return localProblem(http.StatusUnauthorized, "Unauthorized", "an API key is required: Authorization: Bearer <key> or X-API-Key", path,
			map[string]string{"WWW-Authenticate": `Bearer realm="tollgate"`})
	}
	k := denyKey{apiKey, meter}
	if g.deny != nil {
		now := g.opts.Now()
		if d := g.deny.get(k, cost, now); d != nil {
			g.local.Add(1)
			h := make(map[string]string, len(d.header))
			for name, v := range d.header {
				h[name] = v
			}
			// The wait left, not the wait Tollgate answered.
			left := int64((d.until.Sub(now) + time.Second - 1) / time.Second)
			for name := range h {
				if http.CanonicalHeaderKey(name) == "Retry-After" {
					h[name] = strconv.FormatInt(max(left, 1), 10)
				}
			}
			return &Admission{Status: d.status, Header: h, Body: d.body, Local: true}
		}
	}
	g.calls.Add(1)
	res, err := g.client.Check(ctx, CheckRequest{APIKey: apiKey, Meter: meter, Cost: cost, Path: path})
	if err != nil {
		if p := AsProblem(err); p != nil && !IsOutage(err) {
			h := map[string]string{"Content-Type": ContentTypeProblem}
			for _, name := range []string{"Retry-After", "WWW-Authenticate"} {
				if v := p.Header.Get(name); v != "" {
					h[name] = v
				}
			}
			return &Admission{Status: p.Status, Header: h, Body: p.Body}
		}
		if ctx.Err() != nil {
			return localProblem(http.StatusServiceUnavailable, "Service Unavailable", "the request ended before its quota was checked", path, nil)
		}
		if g.opts.OnError != nil {
			g.opts.OnError(err)
		}
		if g.opts.FailOpen {
			return &Admission{Allowed: true, Status: http.StatusOK, Header: map[string]string{"Tollgate-Degraded": "fail-open"}, Outage: err}
		}
		a := localProblem(http.StatusServiceUnavailable, "Service Unavailable", "the quota service is unavailable; try again shortly", path,
			map[string]string{"Retry-After": "1"})
		a.Outage = err
		return a
	}
	a := &Admission{Allowed: res.Allowed, Status: res.Status, Header: res.Headers, Body: res.RefusalBody(),
		TenantID: res.TenantID, RequestID: res.RequestID, Result: res}
	if a.Header == nil {
		a.Header = map[string]string{}
	}
	if !res.Allowed && g.deny != nil {
		if secs := retryAfterSeconds(res.Headers); secs > 0 {
			// A copy: the caller may change a.Header.
			h := make(map[string]string, len(res.Headers))
			for name, v := range res.Headers {
				h[name] = v
			}
			g.deny.put(k, &denial{until: g.opts.Now().Add(time.Duration(secs) * time.Second), cost: cost,
				status: res.Status, header: h, body: a.Body}, g.opts.Now())
		}
	}
	return a
}

// Finish ends an admitted request whose handler answered status (500 for
// a handler that failed): with RefundOnServerError, a 5xx refunds the
// request's cost. ctx may have ended with the request: the refund runs
// detached from its end, within the client's timeout.
func (g *Gate) Finish(ctx context.Context, a *Admission, status int) {
	if !g.opts.RefundOnServerError || a == nil || !a.Allowed || a.RequestID == "" || status < 500 {
		return
	}
	if _, err := g.client.Refund(context.WithoutCancel(ctx), a.TenantID, a.RequestID); err != nil && g.opts.OnError != nil {
		g.opts.OnError(err)
	}
}

// WriteTo answers a on w: its headers, its status and its body.
func (a *Admission) WriteTo(w http.ResponseWriter) {
	for k, v := range a.Header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(a.Status)
	_, _ = w.Write(a.Body)
}

// localProblem is an answer the Gate makes itself, problem+json.
func localProblem(status int, title, detail, instance string, header map[string]string) *Admission {
	h := map[string]string{"Content-Type": ContentTypeProblem}
	for k, v := range header {
		h[k] = v
	}
	p := Problem{Status: status, Type: "about:blank", Title: title, Detail: detail, Instance: instance}
	body, _ := json.Marshal(p) // strings and an int: never fails
	return &Admission{Status: status, Header: h, Body: body}
}

// APIKeyOf returns the API key of a request's Authorization (Bearer, any
// case) or, without one, X-API-Key.
func APIKeyOf(authorization, xAPIKey string) string {
	if len(authorization) > 7 && strings.EqualFold(authorization[:7], "bearer ") {
		return strings.TrimSpace(authorization[7:])
	}
	return strings.TrimSpace(xAPIKey)
}
