package httpapi

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/quota"
)

// ProblemQuotaExceeded is the problem type of a refusal (IANA HTTP problem
// types registry).
const ProblemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// ceilSeconds rounds d up to whole seconds, never below zero.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// windowSeconds is a policy window in whole seconds, at least 1: draft-10's
// w parameter is an integer.
func windowSeconds(d time.Duration) int64 {
	return max(1, ceilSeconds(d))
}

// tightest picks the limit the X-RateLimit-* trio describes: the first
// violated limit on a refusal, else the one with the least remaining room
// relative to its size (ties go to the earlier, shorter-window limit).
func tightest(d quota.Decision) (quota.LimitState, bool) {
	if len(d.Limits) == 0 {
		return quota.LimitState{}, false
	}
	if !d.Allowed && len(d.Violated) > 0 {
		if l, ok := d.Limit(d.Violated[0]); ok {
			return l, true
		}
	}
	best := d.Limits[0]
	for _, l := range d.Limits[1:] {
		// Compare remaining/limit without floats: r1*l2 < r2*l1.
		if float64(l.Remaining)*float64(max(best.Limit, 1)) < float64(best.Remaining)*float64(max(l.Limit, 1)) {
			best = l
		}
	}
	return best, true
}

// setRateLimitHeaders writes a decision's headers: the
// draft-ietf-httpapi-ratelimit-headers-10 fields (one item per active limit),
// the X-RateLimit-* trio for the tightest limit, Retry-After on a refusal that
// can ever pass, and the markers of a fail-open or replayed decision.
func setRateLimitHeaders(c *fiber.Ctx, d quota.Decision) {
	if d.Degraded {
		c.Set("Tollgate-Degraded", "fail-open")
	}
	if d.Replayed {
		c.Set("Idempotent-Replayed", "true")
	}
	if len(d.Limits) > 0 {
		var policy, state strings.Builder
		for i, l := range d.Limits {
			if i > 0 {
				policy.WriteString(", ")
				state.WriteString(", ")
			}
			fmt.Fprintf(&policy, "%q;q=%d;w=%d", l.Name, l.Limit, windowSeconds(l.Window))
			fmt.Fprintf(&state, "%q;r=%d;t=%d", l.Name, l.Remaining, ceilSeconds(l.Reset.Sub(d.Now)))
		}
		c.Set("RateLimit-Policy", policy.String())
		c.Set("RateLimit", state.String())
	}
	if l, ok := tightest(d); ok {
		c.Set("X-RateLimit-Limit", strconv.FormatInt(l.Limit, 10))
		c.Set("X-RateLimit-Remaining", strconv.FormatInt(l.Remaining, 10))
		c.Set("X-RateLimit-Reset", strconv.FormatInt(resetTime(l.Reset).Unix(), 10))
	}
	if !d.Allowed && d.RetryAfter >= 0 {
		c.Set(fiber.HeaderRetryAfter, strconv.FormatInt(max(1, ceilSeconds(d.RetryAfter)), 10))
	}
}

// resetTime is a limit's reset as every answer shows it (X-RateLimit-Reset,
// the problem's and /v1/usage's reset): rounded up to the whole second, so
// that no client that waits for it is early, and all of them agree.
func resetTime(t time.Time) time.Time {
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second).UTC()
	}
	return t.UTC()
}

// refusalProblem is the 429 body of API.md: the refusing limits, the state
// of the first of them, the retry time and the upgrade hint.
func refusalProblem(d quota.Decision, upgrade *quota.Upgrade, instance string) Problem {
	names := make([]string, len(d.Violated))
	for i, v := range d.Violated {
		names[i] = string(v)
	}
	extra := map[string]any{"violated-policies": names, "upgrade": upgrade}
	detail := fmt.Sprintf("the %s limit is exhausted", strings.Join(names, " and "))
	if l, ok := tightest(d); ok {
		extra["limit"] = l.Limit
		extra["remaining"] = l.Remaining
		extra["reset"] = resetTime(l.Reset).Format(time.RFC3339)
	}
	if d.RetryAfter >= 0 {
		secs := max(1, ceilSeconds(d.RetryAfter))
		extra["retry_after"] = secs
		detail += fmt.Sprintf("; retry in %d s", secs)
	} else {
		extra["retry_after"] = nil
		detail += "; this request costs more than the limit allows at all"
	}
	if upgrade != nil {
		detail += fmt.Sprintf(", or upgrade to %s", upgrade.Name)
	}
	return Problem{
		Type: ProblemQuotaExceeded, Title: "Quota exceeded", Status: fiber.StatusTooManyRequests,
		Detail: detail, Instance: instance, Extra: extra,
	}
}
