package httpx

import (
	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/catalog"
)

const localPrincipal = "principal"

// SetPrincipal keeps the request's authenticated principal in the context's
// locals for the handler (the API's tenantAuth, the dashboard's session).
func SetPrincipal(c *fiber.Ctx, p catalog.Principal) { c.Locals(localPrincipal, p) }

// PrincipalOf is the principal SetPrincipal kept.
func PrincipalOf(c *fiber.Ctx) catalog.Principal {
	p, _ := c.Locals(localPrincipal).(catalog.Principal)
	return p
}
