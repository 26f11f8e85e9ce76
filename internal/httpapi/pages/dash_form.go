package pages

import (
	"errors"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// maxFormValue bounds one form field; the longest legitimate one is a URL.
const maxFormValue = quota.MaxURLLength

// readForm reads a urlencoded body as strictly as httpx.DecodeJSON reads JSON:
// only the named fields, each at most once, each valid UTF-8 without control
// characters and at most maxFormValue bytes. Absent fields are absent from
// the map. Every failure is a CodeInvalid error naming the field.
func readForm(c *fiber.Ctx, fields ...string) (map[string]string, error) {
	return readFormText(c, nil, fields...)
}

// readFormText is readForm where the fields of text (textareas) may also
// hold line breaks and tabs, each up to its own length in bytes.
func readFormText(c *fiber.Ctx, text map[string]int, fields ...string) (map[string]string, error) {
	allowed := make(map[string]bool, len(fields)+len(text))
	for _, f := range fields {
		allowed[f] = true
	}
	for f := range text {
		allowed[f] = true
	}
	out := map[string]string{}
	var bad error
	c.Context().PostArgs().VisitAll(func(k, v []byte) {
		if bad != nil {
			return
		}
		name := string(k)
		limit, check, what := maxFormValue, httpx.Printable, "must be valid UTF-8 without control characters"
		if n := text[name]; n > 0 {
			limit, check, what = n, printableText, "must be valid UTF-8 without control characters other than line breaks and tabs"
		}
		switch {
		case !allowed[name]:
			if !utf8.ValidString(name) || !httpx.Printable(k) {
				name = "form"
			}
			bad = quota.FieldError(name, "unknown field")
		case len(v) > limit:
			bad = quota.FieldError(name, "must be at most %d characters", limit)
		case !check(v):
			bad = quota.FieldError(name, "%s", what)
		default:
			if _, dup := out[name]; dup {
				bad = quota.FieldError(name, "given more than once")
				return
			}
			out[name] = string(v)
		}
	})
	return out, bad
}

// printableText reports whether b is UTF-8 whose only control characters
// are line breaks and tabs: the text of a textarea.
func printableText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if (r < 0x20 && r != '\n' && r != '\r' && r != '\t') || r == 0x7f {
			return false
		}
	}
	return true
}

// formErrors collects the field errors of one form submission, to show each
// beside its field.
type formErrors map[string]string

func (e formErrors) add(err error) {
	var field, msg string
	var qe *quota.Error
	if errors.As(err, &qe) && qe.Field != "" {
		field, msg = qe.Field, qe.Message
	} else {
		field, msg = "form", quota.ErrorMessage(err)
	}
	if _, ok := e[field]; !ok {
		e[field] = formWords.Replace(msg)
	}
}

// formWords rewrites the domain's messages, which speak JSON (where
// unlimited is null), for a form (where it is an empty field).
var formWords = strings.NewReplacer(
	", or null", ", or empty for unlimited",
	"are both set or both null", "are both set or both empty",
	"must not be null", "must not be empty",
)

// thousands is a whole number written with thousands separators: 1,000,000.
var thousands = regexp.MustCompile(`^-?\d{1,3}(,\d{3})+$`)

// intField parses a whole number, optionally with thousands separators; ""
// is nil when nullable, else an error.
func intField(errs formErrors, f map[string]string, name string, nullable bool) *int64 {
	v := strings.TrimSpace(f[name])
	if strings.Contains(v, ",") {
		if !thousands.MatchString(v) {
			errs.add(quota.FieldError(name, "must be a whole number"))
			return nil
		}
		v = strings.ReplaceAll(v, ",", "")
	}
	if v == "" {
		if !nullable {
			errs.add(quota.FieldError(name, "is required"))
		}
		return nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		errs.add(quota.FieldError(name, "must be a whole number"))
		return nil
	}
	return &n
}

// rateField parses a number of units per second; "" is nil (unlimited).
func rateField(errs formErrors, f map[string]string, name string) *float64 {
	v := strings.TrimSpace(f[name])
	if v == "" {
		return nil
	}
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		errs.add(quota.FieldError(name, "must be a number, such as 0.5 or 10"))
		return nil
	}
	return &x
}

// decodeForm reads the form f into dst, a pointer to a struct of
// quota.Optional fields named by their json tags (httpx.TierFields): each
// scalar field is set from the form field of its name, as the admin API's
// JSON decoder would set it from the same value, written as a form writes
// it: an empty field is null (unlimited, or an error for a field that
// cannot be null), whole numbers may carry thousands separators, and a
// checkbox is on or absent. Fields that are not scalars (lists) are left
// to the caller. A value that does not parse goes to errs by field.
func decodeForm(errs formErrors, f map[string]string, dst any) {
	v := reflect.ValueOf(dst).Elem()
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		opt := v.Field(i)
		ptr := opt.FieldByName("Value")
		val := reflect.New(ptr.Type().Elem())
		raw := strings.TrimSpace(f[name])
		switch val.Elem().Kind() {
		case reflect.String:
			val.Elem().SetString(raw)
		case reflect.Bool:
			if raw != "" && raw != "on" {
				errs.add(quota.FieldError(name, "must be on or absent"))
				continue
			}
			val.Elem().SetBool(raw == "on")
		case reflect.Int, reflect.Int64:
			n := intField(errs, f, name, true)
			if n == nil {
				val = reflect.Zero(ptr.Type()) // null, or not a number (errs has it)
			} else if val.Elem().OverflowInt(*n) {
				errs.add(quota.FieldError(name, "must be a whole number"))
				continue
			} else {
				val.Elem().SetInt(*n)
			}
		case reflect.Float64:
			x := rateField(errs, f, name)
			if x == nil {
				val = reflect.Zero(ptr.Type())
			} else {
				val.Elem().SetFloat(*x)
			}
		default:
			continue
		}
		opt.FieldByName("Set").SetBool(true)
		ptr.Set(val)
	}
}
