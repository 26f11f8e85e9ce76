package httpapi

import (
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/utils"

	"github.com/tollgate/tollgate/internal/routes"
)

// proxyPath is the request's path exactly as the client sent it: still
// escaped, dot segments and all (routes.Match refuses those). The metered
// route is matched on it and the upstream target built from it, so the two
// read the same string. fasthttp's URI().Path() is unescaped and cleaned, and
// Fiber's c.Path() is these bytes only while Config.UnescapePath is off.
// The string aliases the request's buffer: use it before the request URI is
// rewritten (proxy.DoTimeout does) and never keep it past the handler.
func proxyPath(c *fiber.Ctx) string {
	return utils.UnsafeString(c.Request().URI().PathOriginal())
}

// proxyTarget is the upstream URL for the request: the route's base, then the
// rest of the path and the query as the client sent them. Target copies both,
// so the result outlives the request's buffers.
func proxyTarget(c *fiber.Ctx, route *routes.Route) string {
	return route.Target(proxyPath(c), utils.UnsafeString(c.Request().URI().QueryString()))
}
