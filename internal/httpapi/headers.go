package httpapi

import (
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// ProblemQuotaExceeded is the problem type of a refusal (IANA HTTP problem
// types registry).
const ProblemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// tightest picks the limit the X-RateLimit-* trio describes: the first
// violated limit on a refusal, else the one with the least remaining room
// relative to its size (ties go to the earlier, shorter-window limit).
func tightest(d quota.Decision) (quota.LimitState, bool) {
	if len(d.Limits) == 0 && len(d.Policies) == 0 {
		return quota.LimitState{}, false
	}
	if !d.Allowed && len(d.Violated) > 0 {
		if l, ok := d.Limit(d.Violated[0]); ok {
			return l, true
		}
		for _, st := range d.Policies {
			if st.Policy.Name == string(d.Violated[0]) {
				return policyLimit(st), true
			}
		}
	}
	var best quota.LimitState
	found := false
	consider := func(l quota.LimitState) {
		// Compare remaining/limit without floats: r1*l2 < r2*l1.
		if !found || float64(l.Remaining)*float64(max(best.Limit, 1)) < float64(best.Remaining)*float64(max(l.Limit, 1)) {
			best, found = l, true
		}
	}
	for _, l := range d.Limits {
		consider(l)
	}
	for _, st := range d.Policies {
		if st.Enforced() {
			consider(policyLimit(st))
		}
	}
	return best, found
}

// policyLimit is a policy's state as a limit item of the headers.
func policyLimit(st quota.PolicyState) quota.LimitState {
	return quota.LimitState{Name: quota.LimitName(st.Policy.Name), Limit: st.Limit, Remaining: st.Remaining,
		Reset: st.Reset, Window: st.Window}
}

// The names of the headers setRateLimitHeaders writes, in the form
// fasthttp would normalize them to (RateLimit-Policy goes out as
// Ratelimit-Policy, as it always did), so that they are set with
// SetCanonical: no normalizing, no copy of the name per request.
var (
	hdrDegraded   = httpx.CanonicalHeader("Tollgate-Degraded")
	hdrReplayed   = httpx.CanonicalHeader("Idempotent-Replayed")
	hdrPolicy     = httpx.CanonicalHeader("RateLimit-Policy")
	hdrState      = httpx.CanonicalHeader("RateLimit")
	hdrLimit      = httpx.CanonicalHeader("X-RateLimit-Limit")
	hdrRemaining  = httpx.CanonicalHeader("X-RateLimit-Remaining")
	hdrReset      = httpx.CanonicalHeader("X-RateLimit-Reset")
	hdrRetryAfter = httpx.CanonicalHeader(fiber.HeaderRetryAfter)
	valueFailOpen = []byte("fail-open")
	valueTrue     = []byte("true")
)

// rateLimitHdrBytes is room for the longest field, four limits' items, so
// that the buffer never grows.
const rateLimitHdrBytes = 256

// setRateLimitHeaders writes a decision's headers: the
// draft-ietf-httpapi-ratelimit-headers-10 fields (one item per active limit),
// the X-RateLimit-* trio for the tightest limit, Retry-After on a refusal that
// can ever pass, and the markers of a fail-open or replayed decision.
//
// It runs on every metered answer, so the values are appended into one
// buffer on the stack and set as bytes (fasthttp copies them): no fmt, no
// strings, no allocation.
func setRateLimitHeaders(c *fiber.Ctx, d quota.Decision) {
	writeRateLimitHeaders(&c.Response().Header, d)
}

// writeRateLimitHeaders writes setRateLimitHeaders' headers into h.
func writeRateLimitHeaders(h *fasthttp.ResponseHeader, d quota.Decision) {
	if d.Degraded {
		h.SetCanonical(hdrDegraded, valueFailOpen)
	}
	if d.Replayed() {
		h.SetCanonical(hdrReplayed, valueTrue)
	}
	var scratch [rateLimitHdrBytes]byte
	if len(d.Limits) > 0 || len(d.Policies) > 0 {
		b := scratch[:0]
		n := 0
		for _, l := range d.Limits {
			b = appendPolicyItem(b, n, l)
			n++
		}
		for _, st := range d.Policies {
			if st.Enforced() {
				b = appendPolicyItem(b, n, policyLimit(st))
				n++
			}
		}
		if n > 0 {
			h.SetCanonical(hdrPolicy, b)
		}
		b = scratch[:0]
		n = 0
		for _, l := range d.Limits {
			b = appendStateItem(b, n, l, d.Now)
			n++
		}
		for _, st := range d.Policies {
			if st.Enforced() {
				b = appendStateItem(b, n, policyLimit(st), d.Now)
				n++
			}
		}
		if n > 0 {
			h.SetCanonical(hdrState, b)
		}
		if len(d.Policies) > 0 {
			if names := appendPolicyNames(scratch[:0], d, quota.PolicyShadowRefused); len(names) > 0 {
				h.SetCanonical(hdrShadowRefused, names)
			}
		}
	}
	if l, ok := tightest(d); ok {
		h.SetCanonical(hdrLimit, strconv.AppendInt(scratch[:0], l.Limit, 10))
		h.SetCanonical(hdrRemaining, strconv.AppendInt(scratch[:0], l.Remaining, 10))
		h.SetCanonical(hdrReset, strconv.AppendInt(scratch[:0], quota.ResetTime(l.Reset).Unix(), 10))
	}
	if !d.Allowed && d.RetryAfter >= 0 {
		h.SetCanonical(hdrRetryAfter, strconv.AppendInt(scratch[:0], max(1, quota.CeilSeconds(d.RetryAfter)), 10))
	}
}

// appendPolicyItem appends the RateLimit-Policy item of l, the n-th: its
// name, q, and w where it has a window (a concurrency or warm_up policy
// has none).
func appendPolicyItem(b []byte, n int, l quota.LimitState) []byte {
	if n > 0 {
		b = append(b, ", "...)
	}
	b = appendSFString(b, string(l.Name))
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, l.Limit, 10)
	if l.Window > 0 {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, quota.WindowSeconds(l.Window), 10)
	}
	return b
}

// appendStateItem appends the RateLimit item of l, the n-th, at now.
func appendStateItem(b []byte, n int, l quota.LimitState, now time.Time) []byte {
	if n > 0 {
		b = append(b, ", "...)
	}
	b = appendSFString(b, string(l.Name))
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, l.Remaining, 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, quota.CeilSeconds(l.Reset.Sub(now)), 10)
}

// appendSFString appends s as a structured-field string (RFC 9651, section
// 3.3.3): quoted, with " and \ escaped by a backslash. An sf-string holds
// only printable ASCII; limit names are fixed identifiers that never hold
// anything else, but should one, each byte outside 0x20-0x7E is written as
// '?' so that the field still parses.
func appendSFString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch b := s[i]; {
		case b == '"' || b == '\\':
			dst = append(dst, '\\', b)
		case b < 0x20 || b > 0x7e:
			dst = append(dst, '?')
		default:
			dst = append(dst, b)
		}
	}
	return append(dst, '"')
}

// refusal is the 429 body of API.md: the refusing limits, the state of
// the first of them, the retry time and the upgrade hint. It is rendered by
// appendJSON, typed: a refusal from the deny cache makes no map, no
// reflection and no allocation.
type refusal struct {
	violated []quota.LimitName
	upgrade  *quota.Upgrade
	instance string
	// hasLimit tells whether limit, remaining and reset are set (a decision
	// without limits has none to show).
	hasLimit         bool
	limit, remaining int64
	reset            time.Time // rounded up as quota.ResetTime rounds it
	// retryAfter is in whole seconds, at least 1; -1 when the request can
	// never pass (costs more than the limit allows at all).
	retryAfter int64
}

// refusalProblem is the 429 body of a refusal d of the request to instance.
func refusalProblem(d quota.Decision, upgrade *quota.Upgrade, instance string) refusal {
	r := refusal{violated: d.Violated, upgrade: upgrade, instance: instance, retryAfter: -1}
	if l, ok := tightest(d); ok {
		r.hasLimit, r.limit, r.remaining, r.reset = true, l.Limit, l.Remaining, quota.ResetTime(l.Reset)
	}
	if d.RetryAfter >= 0 {
		r.retryAfter = max(1, quota.CeilSeconds(d.RetryAfter))
	}
	return r
}

// appendJSON appends the problem+json body of r, members in the order
// encoding/json gave the map this body used to be (sorted).
func (r refusal) appendJSON(b []byte) []byte {
	b = append(b, '{')
	b = httpx.AppendJSONKey(b, "detail")
	b = append(b, `"the `...)
	for i, v := range r.violated {
		if i > 0 {
			b = append(b, " and "...)
		}
		b = httpx.AppendJSONChars(b, string(v))
	}
	b = append(b, " limit is exhausted"...)
	if r.retryAfter >= 0 {
		b = append(b, "; retry in "...)
		b = strconv.AppendInt(b, r.retryAfter, 10)
		b = append(b, " s"...)
	} else {
		b = append(b, "; this request costs more than the limit allows at all"...)
	}
	if r.upgrade != nil {
		b = append(b, ", or upgrade to "...)
		b = httpx.AppendJSONChars(b, r.upgrade.Name)
	}
	b = append(b, '"')
	if r.instance != "" {
		b = httpx.AppendJSONKey(b, "instance")
		b = httpx.AppendJSONString(b, r.instance)
	}
	if r.hasLimit {
		b = httpx.AppendJSONKey(b, "limit")
		b = httpx.AppendJSONInt(b, r.limit)
		b = httpx.AppendJSONKey(b, "remaining")
		b = httpx.AppendJSONInt(b, r.remaining)
		b = httpx.AppendJSONKey(b, "reset")
		b = httpx.AppendJSONTime(b, r.reset, time.RFC3339)
	}
	b = httpx.AppendJSONKey(b, "retry_after")
	if r.retryAfter >= 0 {
		b = httpx.AppendJSONInt(b, r.retryAfter)
	} else {
		b = append(b, "null"...)
	}
	b = httpx.AppendJSONKey(b, "status")
	b = httpx.AppendJSONInt(b, fiber.StatusTooManyRequests)
	b = httpx.AppendJSONKey(b, "title")
	b = append(b, `"Quota exceeded"`...)
	b = httpx.AppendJSONKey(b, "type")
	b = httpx.AppendJSONString(b, ProblemQuotaExceeded)
	b = httpx.AppendJSONKey(b, "upgrade")
	b = appendUpgrade(b, r.upgrade)
	b = httpx.AppendJSONKey(b, "violated-policies")
	b = append(b, '[')
	for i, v := range r.violated {
		if i > 0 {
			b = append(b, ',')
		}
		b = httpx.AppendJSONString(b, string(v))
	}
	return append(b, ']', '}')
}

// appendUpgrade appends u as encoding/json writes a *quota.Upgrade: its
// fields in declaration order, null for nil.
func appendUpgrade(b []byte, u *quota.Upgrade) []byte {
	if u == nil {
		return append(b, "null"...)
	}
	b = append(b, '{')
	b = httpx.AppendJSONKey(b, "tier")
	b = httpx.AppendJSONString(b, u.Tier)
	b = httpx.AppendJSONKey(b, "name")
	b = httpx.AppendJSONString(b, u.Name)
	b = httpx.AppendJSONKey(b, "price_cents")
	b = httpx.AppendJSONInt(b, u.PriceCents)
	b = httpx.AppendJSONKey(b, "daily_quota")
	b = httpx.AppendJSONIntPtr(b, u.DailyQuota)
	b = httpx.AppendJSONKey(b, "monthly_quota")
	b = httpx.AppendJSONIntPtr(b, u.MonthlyQuota)
	b = httpx.AppendJSONKey(b, "url")
	b = httpx.AppendJSONString(b, u.URL)
	return append(b, '}')
}

// writeRefusal sends r as the 429 problem+json.
func writeRefusal(c *fiber.Ctx, r refusal) error {
	var scratch [httpx.ProblemBytes]byte
	return httpx.SendProblemBody(c, fiber.StatusTooManyRequests, r.appendJSON(scratch[:0]))
}
