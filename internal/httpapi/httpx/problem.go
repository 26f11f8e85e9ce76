package httpx

import (
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"slices"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/quota"
)

// ContentTypeProblem is the media type of RFC 9457 problem details.
const ContentTypeProblem = "application/problem+json"

// Problem is an RFC 9457 problem details body. Extra members (such as a
// readiness check's checks) go in Extra and are merged at the top level; the
// refusal of a metered request has its own typed body (refusal).
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail"`
	Instance string `json:"instance,omitempty"`
	// Field names the offending input, for validation errors.
	Field string         `json:"field,omitempty"`
	Extra map[string]any `json:"-"`
}

var statusOf = map[string]int{
	quota.CodeInvalid:       http.StatusBadRequest,
	quota.CodeUnauthorized:  http.StatusUnauthorized,
	quota.CodeForbidden:     http.StatusForbidden,
	quota.CodeNotFound:      http.StatusNotFound,
	quota.CodeConflict:      http.StatusConflict,
	quota.CodeTooLarge:      http.StatusRequestEntityTooLarge,
	quota.CodeUnsupported:   http.StatusUnsupportedMediaType,
	quota.CodeNotAcceptable: http.StatusNotAcceptable,
	quota.CodeTooMany:       http.StatusTooManyRequests,
	quota.CodeMismatch:      http.StatusUnprocessableEntity,
	quota.CodeUnavailable:   http.StatusServiceUnavailable,
	quota.CodeInternal:      http.StatusInternalServerError,

	// (with a problem type of its own: typeOf)
	quota.CodeIdempotencyLimit: http.StatusTooManyRequests,
}

// typeOf is the problem type of the codes that have one of their own
// (about:blank for the others).
var typeOf = map[string]string{
	quota.CodeIdempotencyLimit: ProblemIdempotencyLimit,
}

// ProblemIdempotencyLimit is the type of the refusal of a new
// idempotency key past the tenant's room for stored answers.
const ProblemIdempotencyLimit = "https://tollgate.dev/problems/idempotency-limit"

// ProblemBytes is room for a problem body without growing its buffer: a
// refusal with an upgrade hint, or an error with a long detail.
const ProblemBytes = 1024

// WriteProblem sends p as problem+json, written by appendJSON; Extra
// members (readiness checks, off the hot path) follow, sorted, each encoded
// by encoding/json.
func WriteProblem(c *fiber.Ctx, p Problem) error {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	var scratch [ProblemBytes]byte
	b := p.AppendJSON(scratch[:0])
	if len(p.Extra) > 0 {
		b = b[:len(b)-1] // reopen the object
		for _, k := range slices.Sorted(maps.Keys(p.Extra)) {
			v, err := json.Marshal(p.Extra[k])
			if err != nil {
				return err
			}
			b = AppendJSONKey(b, k)
			b = append(b, v...)
		}
		b = append(b, '}')
	}
	return SendProblemBody(c, p.Status, b)
}

// AppendJSON appends p without its Extra members, in the order encoding/json
// gave the map it used to be (sorted keys).
func (p *Problem) AppendJSON(b []byte) []byte {
	b = append(b, '{')
	b = AppendJSONKey(b, "detail")
	b = AppendJSONString(b, p.Detail)
	if p.Field != "" {
		b = AppendJSONKey(b, "field")
		b = AppendJSONString(b, p.Field)
	}
	if p.Instance != "" {
		b = AppendJSONKey(b, "instance")
		b = AppendJSONString(b, p.Instance)
	}
	b = AppendJSONKey(b, "status")
	b = AppendJSONInt(b, int64(p.Status))
	b = AppendJSONKey(b, "title")
	b = AppendJSONString(b, p.Title)
	b = AppendJSONKey(b, "type")
	b = AppendJSONString(b, p.Type)
	return append(b, '}')
}

// SendProblemBody answers status with body as problem+json. The body is
// copied into the response's own (pooled) buffer, so it may live on the
// caller's stack.
func SendProblemBody(c *fiber.Ctx, status int, body []byte) error {
	c.Status(status)
	c.Response().Header.SetContentType(ContentTypeProblem)
	c.Response().SetBody(body)
	return nil
}

// ErrorProblem is the problem ErrorHandler answers for e at instance
// (its type and title filled in): an internal error's detail is
// "internal error".
func ErrorProblem(e *quota.Error, instance string) Problem {
	p := Problem{Instance: instance, Status: statusOf[e.Code], Detail: e.Message, Field: e.Field, Type: typeOf[e.Code]}
	if p.Status == 0 {
		p.Status = http.StatusInternalServerError
	}
	if p.Status == http.StatusInternalServerError {
		p.Detail = "internal error"
	}
	if p.Type == "" {
		p.Type = "about:blank"
	}
	p.Title = http.StatusText(p.Status)
	return p
}

// ErrorHandler is the one place where errors become HTTP answers. Tollgate's
// *quota.Error maps by code; Fiber's own errors (unknown route, body too large,
// method not allowed) keep their status; anything else is a bug or an I/O
// failure, logged once here and answered as "internal error". Under the
// web pages' paths (isPage) the problem is rendered by page, as HTML;
// everywhere else it is problem+json.
func ErrorHandler(log *slog.Logger, isPage func(path string) bool, page func(*fiber.Ctx, Problem) error) fiber.ErrorHandler {
	return func(c *fiber.Ctx, err error) error {
		var qe *quota.Error
		var fe *fiber.Error
		p := Problem{Instance: c.Path()}
		switch {
		case errors.As(err, &qe):
			p.Status = statusOf[qe.Code]
			if p.Status == 0 {
				p.Status = http.StatusInternalServerError
			}
			p.Detail, p.Field, p.Type = qe.Message, qe.Field, typeOf[qe.Code]
			if p.Status == http.StatusInternalServerError {
				log.Error("internal error", "err", err, "path", c.Path(), "request_id", RequestID(c))
				p.Detail = "internal error"
			}
		case errors.As(err, &fe):
			p.Status, p.Detail = fe.Code, fe.Message
			if fe.Code == http.StatusRequestEntityTooLarge {
				p.Detail = "request body too large"
			}
			if fe.Code >= 500 {
				log.Error("internal error", "err", err, "path", c.Path(), "request_id", RequestID(c))
				p.Detail = "internal error"
			}
		default:
			log.Error("internal error", "err", err, "path", c.Path(), "request_id", RequestID(c))
			p.Status, p.Detail = http.StatusInternalServerError, "internal error"
		}
		if page != nil && isPage(c.Path()) {
			perr := page(c, p)
			if perr == nil {
				return nil
			}
			log.Error("error page failed", "err", perr, "path", c.Path(), "request_id", RequestID(c))
		}
		return WriteProblem(c, p)
	}
}
