package tollgate

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
)

// ContentTypeProblem is the media type of RFC 9457 problem details.
const ContentTypeProblem = "application/problem+json"

// Problem is an error answer of Tollgate, RFC 9457 problem details: a
// 4xx for what the caller sent (bad input, an unknown key, a conflict),
// or the cause of an *OutageError on a 5xx.
type Problem struct {
	// Status is the HTTP status of the answer.
	Status int `json:"status"`
	// Type is a URI naming the kind of problem ("about:blank" when the
	// status says it all).
	Type string `json:"type"`
	// Title is the status's short text; Detail says what went wrong.
	Title  string `json:"title"`
	Detail string `json:"detail"`
	// Instance is the path of the request at fault, when given.
	Instance string `json:"instance,omitempty"`
	// Field names the request field at fault, when one can be named.
	Field string `json:"field,omitempty"`
	// Body is the answer's body as it came; Header its headers
	// (Retry-After on a 429 or 503).
	Body   []byte      `json:"-"`
	Header http.Header `json:"-"`
}

// Error implements error.
func (p *Problem) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "tollgate: %d %s", p.Status, p.Title)
	if p.Detail != "" {
		b.WriteString(": " + p.Detail)
	}
	if p.Field != "" {
		b.WriteString(" (field " + p.Field + ")")
	}
	return b.String()
}

// Extension returns a member of the problem other than the standard ones
// (e.g. "violated-policies" of a refusal) decoded into v, and whether it
// was there.
func (p *Problem) Extension(name string, v any) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(p.Body, &m) != nil {
		return false
	}
	raw, ok := m[name]
	return ok && json.Unmarshal(raw, v) == nil
}

// problemOf reads an error answer: its problem+json body, or a Problem
// made of its status when the body is no problem (a proxy's page).
func problemOf(resp *http.Response, raw []byte) *Problem {
	p := &Problem{}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == ContentTypeProblem || mt == "application/json" {
		_ = json.Unmarshal(raw, p) // what does not decode stays empty, filled below
	}
	p.Status = resp.StatusCode // the answer's, whatever the body says
	if p.Title == "" {
		p.Title = http.StatusText(resp.StatusCode)
	}
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Detail == "" && mt != ContentTypeProblem {
		d := strings.TrimSpace(string(raw))
		if len(d) > 200 {
			d = d[:200] + "…"
		}
		p.Detail = d
	}
	p.Body, p.Header = raw, resp.Header.Clone()
	return p
}

// AsProblem returns the *Problem err is or wraps (an *OutageError of a
// 5xx wraps one), or nil.
func AsProblem(err error) *Problem {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	return nil
}

// StatusOf returns the HTTP status of the problem err is or wraps, or 0.
func StatusOf(err error) int {
	if p := AsProblem(err); p != nil {
		return p.Status
	}
	return 0
}

// IsNotFound reports whether err is a 404 problem: settle, refund or
// release of a request id the tenant has no reservation under, or an
// unknown tenant.
func IsNotFound(err error) bool { return StatusOf(err) == http.StatusNotFound }

// IsConflict reports whether err is a 409 problem: a request settled or
// refunded before (nothing changed).
func IsConflict(err error) bool { return StatusOf(err) == http.StatusConflict }

// IsUnauthorized reports whether err is a 401 problem: an unknown API key,
// or a wrong service token.
func IsUnauthorized(err error) bool { return StatusOf(err) == http.StatusUnauthorized }

// IsInvalid reports whether err is a 400 problem (Problem.Field names the
// field at fault).
func IsInvalid(err error) bool { return StatusOf(err) == http.StatusBadRequest }
