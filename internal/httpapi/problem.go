package httpapi

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/quota"
)

// ContentTypeProblem is the media type of RFC 9457 problem details.
const ContentTypeProblem = "application/problem+json"

// Problem is an RFC 9457 problem details body. Extra members (such as
// violated-policies or upgrade) go in Extra and are merged at the top level.
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
}

// writeProblem sends p as problem+json.
func writeProblem(c *fiber.Ctx, p Problem) error {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	body := map[string]any{"type": p.Type, "title": p.Title, "status": p.Status, "detail": p.Detail}
	if p.Instance != "" {
		body["instance"] = p.Instance
	}
	if p.Field != "" {
		body["field"] = p.Field
	}
	for k, v := range p.Extra {
		body[k] = v
	}
	c.Status(p.Status)
	c.Set(fiber.HeaderContentType, ContentTypeProblem)
	b, err := c.App().Config().JSONEncoder(body)
	if err != nil {
		return err
	}
	return c.Send(b)
}

// errorHandler is the one place where errors become HTTP answers. Tollgate's
// *quota.Error maps by code; Fiber's own errors (unknown route, body too large,
// method not allowed) keep their status; anything else is a bug or an I/O
// failure, logged once here and answered as "internal error". Under the
// dashboard's and the console's paths the problem is rendered by page, as
// HTML; everywhere else it is problem+json.
func errorHandler(log *slog.Logger, page func(*fiber.Ctx, Problem) error) fiber.ErrorHandler {
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
			p.Detail, p.Field = qe.Message, qe.Field
			if p.Status == http.StatusInternalServerError {
				log.Error("internal error", "err", err, "path", c.Path(), "request_id", requestID(c))
				p.Detail = "internal error"
			}
		case errors.As(err, &fe):
			p.Status, p.Detail = fe.Code, fe.Message
			if fe.Code == http.StatusRequestEntityTooLarge {
				p.Detail = "request body too large"
			}
			if fe.Code >= 500 {
				log.Error("internal error", "err", err, "path", c.Path(), "request_id", requestID(c))
				p.Detail = "internal error"
			}
		default:
			log.Error("internal error", "err", err, "path", c.Path(), "request_id", requestID(c))
			p.Status, p.Detail = http.StatusInternalServerError, "internal error"
		}
		if page != nil && isPagePath(c.Path()) {
			perr := page(c, p)
			if perr == nil {
				return nil
			}
			log.Error("error page failed", "err", perr, "path", c.Path(), "request_id", requestID(c))
		}
		return writeProblem(c, p)
	}
}
