// Package tollgate is the Go client of Tollgate, the quota, metering and
// billing service for APIs.
//
// Three clients, one per credential:
//   - ServiceClient (the service token) decides requests that a backend
//     serves itself: Check, then Settle, Refund or Release of a counted
//     check;
//   - TenantClient (a tenant's API key) reads the tenant's own Usage and
//     Invoices;
//   - package admin (the admin token), generated from the OpenAPI
//     document, manages tiers, policies, tenants and keys.
//
// Gate admits the requests of an API through /v1/check: Gate.Middleware
// for net/http, and package fibermw for Fiber v2.
//
// A refusal is a value (CheckResult.Allowed false), not an error. Errors
// are a *Problem when Tollgate answered a problem (bad input, unknown key,
// conflict) and an *OutageError when it could not be asked or answered
// 5xx; a context that the caller ended gives its own error.
package tollgate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Version is this SDK's version (semantic versioning), sent in the
// User-Agent of every request.
const Version = "0.1.0"

// DefaultTimeout bounds each call of a client made without WithTimeout.
const DefaultTimeout = 5 * time.Second

// maxAnswer bounds the body of an answer the clients read (a page of
// invoices is the largest).
const maxAnswer = 8 << 20

// Option configures a client.
type Option func(*transport)

// WithHTTPClient makes the client send its requests through hc (its
// Transport, its redirects policy); http.DefaultClient otherwise. The
// client's own timeout (WithTimeout) applies on top of hc.Timeout.
func WithHTTPClient(hc *http.Client) Option {
	return func(t *transport) {
		if hc != nil {
			t.hc = hc
		}
	}
}

// WithTimeout bounds each call (connect, send, answer) to d; 0 leaves the
// calls bounded only by their context. DefaultTimeout otherwise. A call
// that runs out of it is an *OutageError.
func WithTimeout(d time.Duration) Option {
	return func(t *transport) { t.timeout = d }
}

// WithUserAgent puts ua before the SDK's own product in the User-Agent.
func WithUserAgent(ua string) Option {
	return func(t *transport) { t.userAgent = ua + " " + t.userAgent }
}

// transport is what the clients share: the base URL, the credential and
// the HTTP client.
type transport struct {
	base      string
	auth      string // the Authorization header
	hc        *http.Client
	timeout   time.Duration
	userAgent string
}

func newTransport(baseURL, token string, opts []Option) *transport {
	t := &transport{base: strings.TrimRight(baseURL, "/"), auth: "Bearer " + token, hc: http.DefaultClient,
		timeout: DefaultTimeout, userAgent: "tollgate-go/" + Version}
	for _, o := range opts {
		o(t)
	}
	return t
}

// do sends method path with in as its JSON body (none when nil) and
// decodes a 2xx answer's JSON into out.
func (t *transport) do(ctx context.Context, op, method, path string, in, out any) error {
	if !printableASCII(t.auth) {
		return fmt.Errorf("tollgate: %s: the token or API key holds characters a header cannot carry", op)
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("tollgate: %s: encode: %w", op, err)
		}
		body = bytes.NewReader(b)
	}
	callCtx, cancel := ctx, context.CancelFunc(func() {})
	if t.timeout > 0 {
		callCtx, cancel = context.WithTimeout(ctx, t.timeout)
	}
	defer cancel()
	req, err := http.NewRequestWithContext(callCtx, method, t.base+path, body)
	if err != nil {
		return fmt.Errorf("tollgate: %s: %w", op, err)
	}
	req.Header.Set("Authorization", t.auth)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", t.userAgent)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := t.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil { // the caller's context ended, not the call's timeout
			return fmt.Errorf("tollgate: %s: %w", op, ctx.Err())
		}
		return &OutageError{Op: op, Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("tollgate: %s: %w", op, ctx.Err())
		}
		return &OutageError{Op: op, Status: resp.StatusCode, Err: fmt.Errorf("read answer: %w", err)}
	}
	if len(raw) > maxAnswer {
		return &OutageError{Op: op, Status: resp.StatusCode, Err: fmt.Errorf("answer larger than %d bytes", maxAnswer)}
	}
	if resp.StatusCode >= 300 {
		p := problemOf(resp, raw)
		if resp.StatusCode >= 500 {
			return &OutageError{Op: op, Status: resp.StatusCode, Err: p}
		}
		return p
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return &OutageError{Op: op, Status: resp.StatusCode, Err: fmt.Errorf("decode answer: %w", err)}
	}
	return nil
}

// OutageError is a call that Tollgate did not answer: the network failed,
// the call timed out, or Tollgate answered 5xx (Status, and the *Problem
// it answered as Err). Nothing can be said about whether a check counted.
type OutageError struct {
	// Op names the call: "check", "settle", "usage"...
	Op string
	// Status is the HTTP status of a 5xx answer; 0 when none came.
	Status int
	// Err is the cause: the transport's error, or the answer's *Problem.
	Err error
}

// Error implements error.
func (e *OutageError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("tollgate: %s: Tollgate unavailable (%d): %v", e.Op, e.Status, e.Err)
	}
	return fmt.Sprintf("tollgate: %s: Tollgate unreachable: %v", e.Op, e.Err)
}

// Unwrap returns Err.
func (e *OutageError) Unwrap() error { return e.Err }

// IsOutage reports whether err is (or wraps) an *OutageError.
func IsOutage(err error) bool {
	var o *OutageError
	return errors.As(err, &o)
}

// printableASCII reports whether s is printable ASCII, as a header value
// the client sends must be.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
