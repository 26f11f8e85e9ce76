package quota

import (
	"errors"
	"fmt"
)

// Error codes. The HTTP layer maps each to one status; nothing else does.
const (
	CodeInvalid       = "invalid"        // the caller sent bad input (400)
	CodeUnauthorized  = "unauthorized"   // missing or wrong credentials (401)
	CodeForbidden     = "forbidden"      // authenticated but not allowed (403)
	CodeNotFound      = "not_found"      // no such resource (404)
	CodeConflict      = "conflict"       // the change conflicts with current state (409)
	CodeTooLarge      = "too_large"      // the request body is too large (413)
	CodeUnavailable   = "unavailable"    // a dependency is down and the tier fails closed (503)
	CodeInternal      = "internal"       // a bug or an I/O failure (500)
	CodeUnsupported   = "unsupported"    // unsupported media type (415)
	CodeNotAcceptable = "not_acceptable" // no acceptable representation (406)
	CodeTooMany       = "too_many"       // too many failed attempts; retry later (429)
	// CodeMismatch: an idempotency key reused for a different request (422).
	CodeMismatch = "mismatch"
	// CodeIdempotencyLimit: a new idempotency key past the tenant's room
	// for stored answers (AnswerLimits); nothing ran (429).
	CodeIdempotencyLimit = "idempotency_limit"
)

// Error is Tollgate's one error type for failures a caller should see.
// Field names the offending input field, when there is one.
type Error struct {
	Code    string
	Message string
	Field   string
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("tollgate %s: %s: %s", e.Code, e.Field, e.Message)
	}
	return fmt.Sprintf("tollgate %s: %s", e.Code, e.Message)
}

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// FieldError returns a CodeInvalid *Error naming the offending field.
func FieldError(field, format string, args ...any) *Error {
	return &Error{Code: CodeInvalid, Field: field, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of err when it wraps an *Error, else CodeInternal.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ErrorMessage returns the message of err when it wraps an *Error; any other
// error is internal and its text is not for clients.
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}
