package httpx

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/quota"
)

// DecodeJSON reads the request body into v strictly: a JSON media type, one
// object (not null), no unknown fields and no member named twice at any
// depth (jsondup.go), no trailing data. Every failure is a CodeInvalid (or
// CodeUnsupported) error naming the field where one can be named.
func DecodeJSON(c *fiber.Ctx, v any) error {
	ct := strings.ToLower(strings.TrimSpace(strings.Split(c.Get(fiber.HeaderContentType), ";")[0]))
	if ct != fiber.MIMEApplicationJSON && !strings.HasSuffix(ct, "+json") {
		return quota.Errorf(quota.CodeUnsupported, "the body must be application/json")
	}
	// The handlers decode after their authentication: the body is read
	// here, if no middleware read it before (body.go).
	if err := plain(c); err != nil {
		return err
	}
	if err := ReadBody(c, c.App().Config().BodyLimit); err != nil {
		return err
	}
	body := c.Request().Body()
	if len(bytes.TrimSpace(body)) == 0 {
		return quota.Errorf(quota.CodeInvalid, "the body is empty; send a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return quota.Errorf(quota.CodeInvalid, "the body must hold one JSON object and nothing after it")
	}
	// A struct decodes from an object or from null, which leaves it as it
	// was: a patch of nothing, a create of zeros.
	if body[bytes.IndexFunc(body, func(r rune) bool { return !isJSONSpace(r) })] != '{' {
		return quota.Errorf(quota.CodeInvalid, "the body must be a JSON object, not null")
	}
	if path, unknown := badMember(body, shapeOf(reflect.TypeOf(v))); unknown {
		return quota.FieldError(path, "unknown field")
	} else if path != "" {
		return quota.FieldError(path, "is given more than once; send each member once")
	}
	if field := nulField(reflect.ValueOf(v), ""); field != "" {
		return quota.FieldError(field, "must not contain NUL characters")
	}
	return nil
}

func isJSONSpace(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\r' }

// nulField returns the JSON name of the first string in v holding a NUL
// byte, which Postgres cannot store in text, or "".
func nulField(v reflect.Value, name string) string {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return nulField(v.Elem(), name)
		}
	case reflect.String:
		if strings.ContainsRune(v.String(), 0) {
			return name
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			child := name
			if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag != "" && tag != "-" {
				child = strings.TrimPrefix(name+"."+tag, ".")
			}
			if got := nulField(v.Field(i), child); got != "" {
				return got
			}
		}
	}
	return ""
}

func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return quota.Errorf(quota.CodeInvalid, "malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return quota.Errorf(quota.CodeInvalid, "the body must be a JSON object, not %s", typ.Value)
		}
		return quota.FieldError(typ.Field, "must be %s, not %s", jsonKind(typ.Type.Kind().String()), typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return quota.FieldError(field, "unknown field")
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return quota.Errorf(quota.CodeInvalid, "malformed JSON: unexpected end of body")
	default:
		var qe *quota.Error
		if errors.As(err, &qe) {
			return qe
		}
		return quota.Errorf(quota.CodeInvalid, "malformed JSON: %v", err)
	}
}

func jsonKind(k string) string {
	switch k {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "slice":
		return "an array"
	default:
		return fmt.Sprintf("a %s", k)
	}
}

// CheckQuery refuses query parameters that are not valid UTF-8 or hold NUL
// or other control characters: they can only be mistakes or probes, and
// Postgres would refuse them as text.
func CheckQuery(c *fiber.Ctx) error {
	var bad string
	c.Context().QueryArgs().VisitAll(func(k, v []byte) {
		if bad == "" && (!Printable(k) || !Printable(v)) {
			bad = string(k)
			if !utf8.ValidString(bad) {
				bad = "query"
			}
		}
	})
	if bad != "" {
		return quota.FieldError(bad, "must be valid UTF-8 without control characters")
	}
	return c.Next()
}

// Printable reports whether b is valid UTF-8 without control characters.
func Printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}
