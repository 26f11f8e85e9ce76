package quota

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// CheckName checks a name people read in lists and pages (a tier's, a
// tenant's, an API key's): 1 to MaxNameLen bytes of text as CheckText
// wants it. It returns a CodeInvalid *Error naming field.
func CheckName(field, s string) error {
	if s == "" || len(s) > MaxNameLen {
		return FieldError(field, "must be 1 to %d characters", MaxNameLen)
	}
	return CheckText(field, s)
}

// CheckText checks a short text shown to people (a name, a credit's
// reason): at least one visible character, no control character, and no
// white space at either end. A name of spaces alone would show as a blank
// row nobody can click; one padded with spaces would look like another
// name it is not. Nothing is trimmed silently: the API refuses such a
// value, naming field (the console's forms trim what is typed before).
func CheckText(field, s string) error {
	if !utf8.ValidString(s) {
		return FieldError(field, "must be valid UTF-8")
	}
	if strings.ContainsFunc(s, unicode.IsControl) {
		return FieldError(field, "must not contain control characters")
	}
	switch {
	case !Visible(s):
		return FieldError(field, "must hold a visible character, not only white space")
	case strings.TrimSpace(s) != s:
		return FieldError(field, "must not begin or end with white space")
	}
	return nil
}

// Visible reports whether s shows something: a letter, mark, number,
// punctuation or symbol, not only white space or invisible characters.
func Visible(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return unicode.IsGraphic(r) && !unicode.IsSpace(r) })
}

// CheckKeyName checks an API key's name, which may be empty (none).
func CheckKeyName(name string) error {
	if name == "" {
		return nil
	}
	return CheckName("name", name)
}
