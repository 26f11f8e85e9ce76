package httpapi

import (
	_ "embed"

	"github.com/gofiber/fiber/v2"
)

// openapiDoc is the OpenAPI 3.1 document of every route. It is written by
// hand, next to the handlers it describes; TestOpenAPICoversEveryRoute fails
// when a registered route is missing from it.
//
//go:embed openapi.json
var openapiDoc []byte

// openapi serves the OpenAPI document.
func (s *Server) openapi(c *fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Send(openapiDoc)
}
