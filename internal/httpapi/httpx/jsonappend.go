package httpx

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// The HTTP layer writes its hot JSON bodies (the demo handlers' answers,
// problem details, refusals) with the append functions below instead of
// encoding/json: no reflection, no maps, no allocation beyond the buffer they
// append to. The output is byte for byte what encoding/json.Marshal writes
// for the same values (keys in the order it would use, strings escaped as it
// escapes them, HTML characters included), so that clients see no
// difference; the tests hold them to it.

const hexDigits = "0123456789abcdef"

// jsonSafe reports whether an ASCII byte stands for itself inside a JSON
// string as encoding/json writes it: printable, and none of ", \ or the HTML
// characters <, > and &, which it escapes so that JSON is safe to embed in
// HTML.
var jsonSafe = func() (t [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
	}
	return t
}()

// AppendJSONString appends s to dst as a JSON string.
func AppendJSONString[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	dst = AppendJSONChars(dst, s)
	return append(dst, '"')
}

// AppendJSONChars appends the escaped characters of s, without the quotes,
// so that a string can be assembled from pieces (each ending on a character
// boundary). Control characters are escaped (\n, \t… or \u00XX), as are ",
// \, <, > and &; invalid UTF-8 becomes \ufffd, one per bad byte; U+2028 and
// U+2029, valid JSON but line ends to JavaScript, are escaped too.
func AppendJSONChars[S ~string | ~[]byte](dst []byte, s S) []byte {
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if jsonSafe[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		// At most utf8.UTFMax bytes are converted: the copy stays on the
		// stack when s is a []byte.
		c, size := utf8.DecodeRuneInString(string(s[i:min(len(s), i+utf8.UTFMax)]))
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(dst, s[start:]...)
}

// AppendJSONKey appends "key": to dst, after a comma unless dst ends an
// opening brace. Keys are constants of ours that need no escaping.
func AppendJSONKey(dst []byte, key string) []byte {
	if n := len(dst); n > 0 && dst[n-1] != '{' && dst[n-1] != '[' {
		dst = append(dst, ',')
	}
	dst = append(dst, '"')
	dst = append(dst, key...)
	return append(dst, '"', ':')
}

// AppendJSONInt appends n to dst as a JSON number.
func AppendJSONInt(dst []byte, n int64) []byte { return strconv.AppendInt(dst, n, 10) }

// AppendJSONIntPtr appends *n, or null for nil.
func AppendJSONIntPtr(dst []byte, n *int64) []byte {
	if n == nil {
		return append(dst, "null"...)
	}
	return strconv.AppendInt(dst, *n, 10)
}

// AppendJSONTime appends t as a JSON string in layout (RFC 3339 layouts
// only: they need no escaping).
func AppendJSONTime(dst []byte, t time.Time, layout string) []byte {
	dst = append(dst, '"')
	dst = t.AppendFormat(dst, layout)
	return append(dst, '"')
}
