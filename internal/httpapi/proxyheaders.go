package httpapi

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// Headers across the proxy. Tollgate speaks to the upstream in headers of
// its own (X-Tollgate-Tenant-Id, Tollgate-Request-Id, X-Forwarded-For) and
// to the client in others (Tollgate-*, the rate-limit headers,
// Idempotent-Replayed); neither side may put words in its mouth. A header
// counts as one of these whatever its case and with _ read as - (a CGI-style
// upstream reads X_Tollgate_Tenant_Id as HTTP_X_TOLLGATE_TENANT_ID, the same
// variable as X-Tollgate-Tenant-Id), and the whole namespace is reserved, not
// only the names in use today: a header Tollgate adds later is then never a
// client's. The hop-by-hop headers of RFC 9110 (section 7.6.1), and those a
// Connection header names, belong to one connection and are not passed on
// either way.

// toUpstreamReserved are the request headers a client never passes to the
// upstream, besides the Tollgate namespace: what Tollgate sets
// (the forwarding headers: forwarded.go), the tenant's credentials, the method
// overrides (the route, meter and cost are the request method's; an
// upstream honouring X-HTTP-Method-Override would act as another), and the
// hop-by-hop headers.
var toUpstreamReserved = []string{
	"authorization", "x-api-key", "proxy-authorization",
	"x-http-method-override", "x-http-method", "x-method-override",
	"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
}

// toClientReserved are the answer headers an upstream never passes to the
// client, besides the Tollgate namespace and the rate-limit headers: the
// replay marker, Clear-Site-Data (it would act on the whole origin, the
// dashboard's and the console's sign-ins included) and the hop-by-hop
// headers.
var toClientReserved = []string{
	"idempotent-replayed", "clear-site-data",
	"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "proxy-authenticate",
}

// tollgateNamespace reports whether a header name is Tollgate's.
func tollgateNamespace(name []byte) bool {
	return headerHasPrefix(name, "tollgate-") || headerHasPrefix(name, "x-tollgate-")
}

// maxStrips bounds the visits of one header set: more distinct reserved
// names than any request holds.
const maxStrips = 64

// stripRequestHeaders removes from the request to the upstream every header
// reserved to Tollgate or to the client's connection; Tollgate sets its own
// after it.
//
// fasthttp's headers cannot be deleted while they are visited, so each visit
// finds one reserved name, copied onto the stack, and deletes it (all its
// values, and every spelling fasthttp normalises alike; the others are found
// by the next visit). A request with nothing to strip (nearly all) costs one
// visit and no allocation.
func stripRequestHeaders(h *fasthttp.RequestHeader) {
	// Connection (other than "close", which fasthttp keeps as a flag) may
	// name more hop-by-hop headers.
	var listedBuf, nameBuf [128]byte
	listed := append(listedBuf[:0], h.Peek(fasthttp.HeaderConnection)...)
	for range maxStrips {
		name, found := nameBuf[:0], false
		h.VisitAll(func(key, _ []byte) {
			if !found && (tollgateNamespace(key) || forwardingHeader(key) || headerIsOneOf(key, toUpstreamReserved) || connectionLists(listed, key)) {
				name, found = append(name, key...), true
			}
		})
		if !found {
			return
		}
		h.DelBytes(name)
	}
}

// stripAnswerHeaders removes from the upstream's answer every header that
// would speak for Tollgate or for the upstream's connection, as
// stripRequestHeaders does for the request. keepActualCost leaves
// Tollgate-Actual-Cost (exactly so named) to a settle route's settling,
// which removes it.
func stripAnswerHeaders(h *fasthttp.ResponseHeader, keepActualCost bool) {
	var nameBuf [128]byte
	for range maxStrips {
		name, found := nameBuf[:0], false
		h.VisitAll(func(key, _ []byte) {
			if !found && answerReserved(key, keepActualCost) {
				name, found = append(name, key...), true
			}
		})
		if !found {
			return
		}
		h.DelBytes(name)
	}
}

// stripAnswerCookies removes from the upstream's answer every cookie named
// as the pages' are (tg_*, in any case, - for _ alike: the namespace, not
// only today's tg_dashboard, tg_console and tg_login). The api's origin is
// the pages' origin: such a cookie would sign a browser out of the console
// or into a session the upstream chose. The upstream's other cookies pass.
// An answer without cookies (nearly all) costs nothing.
func stripAnswerCookies(h *fasthttp.ResponseHeader) {
	var nameBuf [128]byte
	for range maxStrips {
		name, found := nameBuf[:0], false
		h.VisitAllCookie(func(key, _ []byte) {
			if !found && headerHasPrefix(key, "tg-") {
				name, found = append(name, key...), true
			}
		})
		if !found {
			return
		}
		h.DelCookieBytes(name)
	}
}

// confineAnswer marks an answer whose content is not Tollgate's (an
// upstream's, live or replayed, or a policy's fallback) so that a browser
// never runs it as the api's origin, which is also the dashboard's and the
// console's: Content-Security-Policy: sandbox puts a document in an opaque
// origin with no script, no forms, no popups, so it reads no cookie and no
// page of the origin, and nosniff keeps a browser from taking an answer for
// another type than it says (an upstream's own Content-Type stands). The
// policy is added beside any the upstream sent: a browser enforces every
// one. Two constant headers: no allocation once the response's header
// storage has grown to hold them.
func confineAnswer(h *fasthttp.ResponseHeader) {
	h.Add(fasthttp.HeaderContentSecurityPolicy, "sandbox")
	h.Set(fasthttp.HeaderXContentTypeOptions, "nosniff")
}

func answerReserved(name []byte, keepActualCost bool) bool {
	if keepActualCost && string(name) == hdrActualCost {
		return false
	}
	return tollgateNamespace(name) || headerIs(name, "ratelimit") || headerHasPrefix(name, "ratelimit-") ||
		headerHasPrefix(name, "x-ratelimit-") || headerIsOneOf(name, toClientReserved)
}

// headerIs reports whether name is want, both in any case and with _ read
// as -: one header to a CGI-style upstream.
func headerIs(name []byte, want string) bool {
	if len(name) != len(want) {
		return false
	}
	for i := range len(name) {
		if foldHeaderByte(name[i]) != foldHeaderByte(want[i]) {
			return false
		}
	}
	return true
}

// headerHasPrefix is headerIs for a prefix of name.
func headerHasPrefix(name []byte, prefix string) bool {
	return len(name) >= len(prefix) && headerIs(name[:len(prefix)], prefix)
}

func headerIsOneOf(name []byte, names []string) bool {
	for _, n := range names {
		if headerIs(name, n) {
			return true
		}
	}
	return false
}

func foldHeaderByte(c byte) byte {
	switch {
	case c == '_':
		return '-'
	case 'A' <= c && c <= 'Z':
		return c + 'a' - 'A'
	}
	return c
}

// connectionLists reports whether a Connection header's value (a comma
// separated list of names) names the header name.
func connectionLists(value, name []byte) bool {
	for len(value) > 0 {
		var token []byte
		token, value, _ = bytes.Cut(value, []byte{','})
		if token = bytes.TrimSpace(token); len(token) == len(name) && sameHeader(token, name) {
			return true
		}
	}
	return false
}

// sameHeader reports whether two names of equal length are one header.
func sameHeader(a, b []byte) bool {
	for i := range len(a) {
		if foldHeaderByte(a[i]) != foldHeaderByte(b[i]) {
			return false
		}
	}
	return true
}

// oneContentLength reports whether a request states its length at most
// once. fasthttp takes the last of several Content-Length values, where RFC
// 9112 (section 6.3) makes differing ones an unrecoverable error: a proxy in
// front of the api that took the first would read the rest of the body as
// another request. Only a request that has the header is read again.
func oneContentLength(h *fasthttp.RequestHeader) bool {
	if len(h.Peek(fasthttp.HeaderContentLength)) == 0 {
		return true
	}
	var first []byte
	one := true
	h.VisitAllInOrder(func(key, value []byte) {
		if string(key) != fasthttp.HeaderContentLength {
			return
		}
		if first == nil {
			first = value
		} else if !bytes.Equal(first, value) {
			one = false
		}
	})
	return one
}
