package httpapi

import (
	"errors"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/utils"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/routes"
)

// pathKey keys, in the request's locals, its path in normal form when that
// differs from the path as sent.
type pathKey struct{}

// resolveRoute matches the request to its metered route on the path in
// normal form (routes.Resolve), once per request, and keeps that path for
// proxyPath. A path that cannot be matched safely is bad input (400 naming
// the path); one that matches no route is 404.
func (s *Server) resolveRoute(c *fiber.Ctx) (*routes.Route, error) {
	raw := utils.UnsafeString(c.Request().URI().PathOriginal())
	route, path, err := s.routes.Resolve(c.Method(), raw)
	switch {
	case err == nil:
	case errors.Is(err, routes.ErrAmbiguous):
		return nil, quota.FieldError("path", "must read as one route to every upstream: with %%2F, %%5C or \\ read as /, a ;parameter or an empty segment dropped, or case ignored, it names another route")
	default:
		return nil, quota.FieldError("path", "must be a plain path: no dot segments (. or .., escaped or not), bad escapes or control characters")
	}
	if route == nil {
		return nil, quota.Errorf(quota.CodeNotFound, "no metered route for %s %s", c.Method(), c.Path())
	}
	if path != raw {
		// Only a path sent with escapes to normalise costs this allocation.
		c.Locals(pathKey{}, path)
	}
	return route, nil
}

// proxyPath is the request's path in normal form (routes.Normalize): what
// the metered route was matched on, what the upstream receives and what
// the policies match. resolveRoute computes it once per request, before
// anything reads it. fasthttp's URI().Path() is another thing (unescaped
// and cleaned), and so is Fiber's c.Path() once Config.UnescapePath is on.
// The string may alias the request's buffer: use it before the request URI
// is rewritten (forward does) and never keep it past the handler.
func proxyPath(c *fiber.Ctx) string {
	if p, ok := c.Locals(pathKey{}).(string); ok {
		return p
	}
	return utils.UnsafeString(c.Request().URI().PathOriginal())
}

// proxyTarget is the upstream URL for the request: the route's base, then the
// rest of the path in normal form and the query as the client sent it.
// Target copies both, so the result outlives the request's buffers.
func proxyTarget(c *fiber.Ctx, route *routes.Route) string {
	return route.Target(proxyPath(c), utils.UnsafeString(c.Request().URI().QueryString()))
}
