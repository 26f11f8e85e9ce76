package httpapi

import (
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// presentedKey returns the request's API key (Authorization: Bearer, or
// X-API-Key). It is not copied: it points into the request's header buffer,
// which the next request on the connection reuses, and is good only until
// the handler returns. catalog.Resolve, its one user, copies what it keeps
// (the key's prefix, on a cache miss as on a hit), so a copy here would be
// an allocation per request for nothing.
func presentedKey(c *fiber.Ctx) string {
	if h := c.Get(fiber.HeaderAuthorization); h != "" {
		return httpx.Bearer(h)
	}
	return strings.TrimSpace(c.Get("X-API-Key"))
}

// ErrKeyRequired is the error of a request that presents no API key.
var ErrKeyRequired = quota.Errorf(quota.CodeUnauthorized, "an API key is required: Authorization: Bearer <key> or X-API-Key: <key>")

// Challenges are the WWW-Authenticate values of a 401: for a request
// without a key, and for one whose key is unknown.
const (
	ChallengeKeyRequired = `Bearer realm="tollgate"`
	ChallengeInvalidKey  = `Bearer realm="tollgate", error="invalid_token"`
)

// tenantAuth resolves the request's API key to a principal, kept in the
// context's locals for the handler.
func (s *Server) tenantAuth(c *fiber.Ctx) error {
	p, err := s.authenticate(c)
	if err != nil {
		return err
	}
	httpx.SetPrincipal(c, p)
	return c.Next()
}

// authenticate resolves the request's API key to a principal: a missing or
// unknown key is 401 with a challenge (and counts as a failure of the
// client's address), a suspended tenant 403.
func (s *Server) authenticate(c *fiber.Ctx) (catalog.Principal, error) {
	key := presentedKey(c)
	if key == "" {
		if err := s.guard.KeyFailed(c, "API keys"); err != nil {
			return catalog.Principal{}, err
		}
		c.Set(fiber.HeaderWWWAuthenticate, ChallengeKeyRequired)
		return catalog.Principal{}, ErrKeyRequired
	}
	p, err := s.catalog.Resolve(c.UserContext(), key)
	if err != nil {
		if quota.ErrorCode(err) == quota.CodeUnauthorized {
			if err := s.guard.KeyFailed(c, "API keys"); err != nil {
				return catalog.Principal{}, err
			}
			c.Set(fiber.HeaderWWWAuthenticate, ChallengeInvalidKey)
		}
		return catalog.Principal{}, err
	}
	return p, nil
}
