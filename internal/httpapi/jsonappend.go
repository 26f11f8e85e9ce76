package httpapi

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// The metered hot path writes its JSON bodies (the demo handlers' answers,
// problem details) with the append functions below instead of encoding/json:
// no reflection, no maps, no allocation beyond the buffer they append to.
// The output is byte for byte what encoding/json.Marshal writes for the same
// values (keys in the order it would use, strings escaped as it escapes
// them, HTML characters included), so that clients see no difference;
// jsonappend_test.go holds them to it.

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

// appendJSONString appends s to dst as a JSON string.
func appendJSONString[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	dst = appendJSONChars(dst, s)
	return append(dst, '"')
}

// appendJSONChars appends the escaped characters of s, without the quotes,
// so that a string can be assembled from pieces (each ending on a character
// boundary). Control characters are escaped (\n, \t… or \u00XX), as are ",
// \, <, > and &; invalid UTF-8 becomes \ufffd, one per bad byte; U+2028 and
// U+2029, valid JSON but line ends to JavaScript, are escaped too.
func appendJSONChars[S ~string | ~[]byte](dst []byte, s S) []byte {
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

// appendJSONKey appends "key": to dst, after a comma unless dst ends an
// opening brace. Keys are constants of ours that need no escaping.
func appendJSONKey(dst []byte, key string) []byte {
	if n := len(dst); n > 0 && dst[n-1] != '{' && dst[n-1] != '[' {
		dst = append(dst, ',')
	}
	dst = append(dst, '"')
	dst = append(dst, key...)
	return append(dst, '"', ':')
}

// appendJSONInt appends n to dst as a JSON number.
func appendJSONInt(dst []byte, n int64) []byte { return strconv.AppendInt(dst, n, 10) }

// appendJSONIntPtr appends *n, or null for nil.
func appendJSONIntPtr(dst []byte, n *int64) []byte {
	if n == nil {
		return append(dst, "null"...)
	}
	return strconv.AppendInt(dst, *n, 10)
}

// appendJSONTime appends t as a JSON string in layout (RFC 3339 layouts
// only: they need no escaping).
func appendJSONTime(dst []byte, t time.Time, layout string) []byte {
	dst = append(dst, '"')
	dst = t.AppendFormat(dst, layout)
	return append(dst, '"')
}

// builtinBytes is room for a demo handler's answer without growing its
// buffer.
const builtinBytes = 512

// echoBody is the answer of the echo handler.
type echoBody struct {
	tenantID, tier, method, path string
	query                        []byte // as sent, not decoded
	meter                        string
	cost                         int64
	time                         time.Time // of the decision
}

// appendJSON appends e with the members in the order encoding/json gave
// the map it used to be (sorted keys).
func (e echoBody) appendJSON(b []byte) []byte {
	b = append(b, '{')
	b = appendJSONKey(b, "cost")
	b = appendJSONInt(b, e.cost)
	b = appendJSONKey(b, "meter")
	b = appendJSONString(b, e.meter)
	b = appendJSONKey(b, "method")
	b = appendJSONString(b, e.method)
	b = appendJSONKey(b, "path")
	b = appendJSONString(b, e.path)
	b = appendJSONKey(b, "query")
	b = appendJSONString(b, e.query)
	b = appendJSONKey(b, "tenant_id")
	b = appendJSONString(b, e.tenantID)
	b = appendJSONKey(b, "tier")
	b = appendJSONString(b, e.tier)
	b = appendJSONKey(b, "time")
	b = appendJSONTime(b, e.time.UTC(), time.RFC3339Nano)
	return append(b, '}')
}

// reportMetrics are the rows of the report handler's made-up report.
var reportMetrics = [...]string{"requests", "errors", "latency_p99_ms"}

// reportBody is the answer of the report handler: a made-up report whose
// values depend only on the tenant, dated by the decision.
type reportBody struct {
	tenantID string
	now      time.Time
}

// appendJSON appends r with the members in the order encoding/json gave
// the map it used to be (sorted keys).
func (r reportBody) appendJSON(b []byte) []byte {
	now := r.now.UTC()
	b = append(b, '{')
	b = appendJSONKey(b, "generated_at")
	b = appendJSONTime(b, now, time.RFC3339)
	b = appendJSONKey(b, "report_id")
	b = append(b, `"rpt_`...)
	b = now.AppendFormat(b, time.DateOnly)
	b = append(b, '_')
	b = strconv.AppendInt(b, r.now.UnixMicro(), 10)
	b = append(b, '"')
	b = appendJSONKey(b, "rows")
	b = append(b, '[')
	for i, name := range reportMetrics {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		b = appendJSONKey(b, "metric")
		b = appendJSONString(b, name)
		b = appendJSONKey(b, "value")
		b = appendJSONInt(b, int64((len(r.tenantID)+i*7)%100))
		b = append(b, '}')
	}
	b = append(b, ']')
	b = appendJSONKey(b, "tenant_id")
	b = appendJSONString(b, r.tenantID)
	return append(b, '}')
}
