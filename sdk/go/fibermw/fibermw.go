// Package fibermw admits the requests of a Fiber v2 app through Tollgate,
// with a tollgate.Gate: the Fiber counterpart of Gate.Middleware, in a
// package of its own so that net/http users do not build Fiber. It must
// hold no admission logic of its own: the Gate decides.
package fibermw

import (
	"errors"
	"strings"

	"github.com/gofiber/fiber/v2"

	tollgate "github.com/tollgate/tollgate/sdk/go"
)

// Config names what a request counts.
type Config struct {
	// Meter returns the meter of c; nil or "": the Gate's Meter.
	Meter func(c *fiber.Ctx) string
	// Cost returns the cost of c; nil or 0: the Gate's Cost.
	Cost func(c *fiber.Ctx) int64
}

// localsKey is where the Admission of a request is kept in its Locals.
const localsKey = "tollgate.admission"

// New returns a handler that admits each request through g before the
// next handlers serve it. The API key comes from Authorization: Bearer or
// X-API-Key. Every answer carries the quota headers Tollgate answered; a
// refusal is answered with Tollgate's status, headers and body unchanged
// (or from the deny cache until its Retry-After passes), and the next
// handlers do not run. An admitted request's Admission is in Admission(c)
// and in its user context (tollgate.AdmissionFrom).
func New(g *tollgate.Gate, cfg Config) fiber.Handler {
	return func(c *fiber.Ctx) error {
		var meter string
		var cost int64
		if cfg.Meter != nil {
			meter = cfg.Meter(c)
		}
		if cfg.Cost != nil {
			cost = cfg.Cost(c)
		}
		key := tollgate.APIKeyOf(c.Get(fiber.HeaderAuthorization), c.Get("X-API-Key"))
		ctx := c.UserContext()
		// Fiber reuses the path's buffer: copy it.
		a := g.Admit(ctx, key, meter, cost, strings.Clone(c.Path()))
		for k, v := range a.Header {
			c.Set(k, v)
		}
		if !a.Allowed {
			return c.Status(a.Status).Send(a.Body)
		}
		c.Locals(localsKey, a)
		c.SetUserContext(tollgate.WithAdmission(ctx, a))
		err := c.Next()
		status := c.Response().StatusCode()
		if err != nil {
			status = fiber.StatusInternalServerError
			var fe *fiber.Error
			if errors.As(err, &fe) {
				status = fe.Code
			}
		}
		g.Finish(ctx, a, status)
		return err
	}
}

// Admission returns the Admission of a request New admitted, or nil.
func Admission(c *fiber.Ctx) *tollgate.Admission {
	a, _ := c.Locals(localsKey).(*tollgate.Admission)
	return a
}
