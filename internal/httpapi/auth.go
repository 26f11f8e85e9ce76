package httpapi

import (
	"crypto/subtle"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/ratelimit"
)

const localPrincipal = "principal"

// presentedKey returns a copy of the request's API key (Authorization:
// Bearer, or X-API-Key); Fiber's header strings point into a buffer that the
// next request reuses.
func presentedKey(c *fiber.Ctx) string {
	return strings.Clone(headerKey(c))
}

func headerKey(c *fiber.Ctx) string {
	if h := c.Get(fiber.HeaderAuthorization); h != "" {
		if scheme, tok, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok)
		}
		return ""
	}
	return strings.TrimSpace(c.Get("X-API-Key"))
}

// bearerIs compares the request's bearer token with want in constant time;
// an empty want refuses everything.
func bearerIs(c *fiber.Ctx, want string) bool {
	h := c.Get(fiber.HeaderAuthorization)
	scheme, tok, ok := strings.Cut(h, " ")
	if want == "" || !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), []byte(want)) == 1
}

// authFailures limits failed key attempts per client address, in process:
// 20 at once, then one every 3 seconds. A client over it gets 429 before its
// key is even looked at, which blunts guessing and cache-miss floods.
type authFailures struct {
	mu     sync.Mutex
	models map[string]*ratelimit.Model
	now    func() time.Time
}

var authFailureLimits = quota.Limits{BurstRate: quota.Ptr(1.0 / 3), Burst: quota.Ptr(int64(20))}

func newAuthFailures(now func() time.Time) *authFailures {
	return &authFailures{models: map[string]*ratelimit.Model{}, now: now}
}

// blocked reports whether ip has used up its failures, and for how long.
func (a *authFailures) blocked(ip string) (time.Duration, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, ok := a.models[ip]
	if !ok {
		return 0, false
	}
	d := m.Peek(authFailureLimits, a.now())
	if l, ok := d.Limit(quota.LimitBurst); ok && l.Remaining == 0 {
		return max(time.Second, l.Reset.Sub(d.Now)/time.Duration(*authFailureLimits.Burst)), true
	}
	return 0, false
}

func (a *authFailures) record(ip string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, ok := a.models[ip]
	if !ok {
		if len(a.models) >= 100_000 {
			a.models = map[string]*ratelimit.Model{}
		}
		m = &ratelimit.Model{}
		a.models[ip] = m
	}
	m.Admit(quota.Request{TenantID: ip, Meter: "auth", Cost: 1, Limits: authFailureLimits, Overage: quota.OverageBlock}, a.now())
	m.Pending = nil
}

// tenantAuth resolves the request's API key to a principal, kept in the
// context's locals for the handler.
func (s *Server) tenantAuth(c *fiber.Ctx) error {
	ip := c.IP()
	if wait, blocked := s.authFail.blocked(ip); blocked {
		c.Set(fiber.HeaderRetryAfter, itoa(ceilSeconds(wait)))
		return writeProblem(c, Problem{Status: fiber.StatusTooManyRequests, Title: "Too many failed API keys",
			Detail: "too many requests with a bad API key from this address; retry later", Instance: c.Path()})
	}
	key := presentedKey(c)
	if key == "" {
		s.authFail.record(ip)
		s.metrics.AuthFailures.Inc()
		c.Set(fiber.HeaderWWWAuthenticate, `Bearer realm="tollgate"`)
		return quota.Errorf(quota.CodeUnauthorized, "an API key is required: Authorization: Bearer <key> or X-API-Key: <key>")
	}
	p, err := s.catalog.Resolve(c.UserContext(), key)
	if err != nil {
		if code := quota.ErrorCode(err); code == quota.CodeUnauthorized {
			s.authFail.record(ip)
			s.metrics.AuthFailures.Inc()
			c.Set(fiber.HeaderWWWAuthenticate, `Bearer realm="tollgate", error="invalid_token"`)
		}
		return err
	}
	c.Locals(localPrincipal, p)
	return c.Next()
}

func principalOf(c *fiber.Ctx) catalog.Principal {
	p, _ := c.Locals(localPrincipal).(catalog.Principal)
	return p
}
