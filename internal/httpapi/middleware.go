package httpapi

import (
	"log/slog"
	"net/netip"
	"time"

	"github.com/gofiber/fiber/v2"
)

const localRequestID = "requestid"

func requestID(c *fiber.Ctx) string {
	if v, ok := c.Locals(localRequestID).(string); ok {
		return v
	}
	return ""
}

// accessLog logs one line per request at the edge, after the error handler
// has set the final status.
func accessLog(log *slog.Logger, clientIP func(*fiber.Ctx) netip.Addr) fiber.Handler {
	return func(c *fiber.Ctx) error {
		start := time.Now()
		err := c.Next()
		if err != nil {
			// Let the error handler write the answer now so the status is final.
			if herr := c.App().ErrorHandler(c, err); herr != nil {
				_ = c.SendStatus(fiber.StatusInternalServerError)
			}
		}
		status := c.Response().StatusCode()
		level := slog.LevelInfo
		if status >= 500 {
			level = slog.LevelError
		}
		log.LogAttrs(c.UserContext(), level, "request",
			slog.String("method", c.Method()),
			slog.String("path", c.Path()),
			slog.Int("status", status),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
			slog.String("request_id", requestID(c)),
			slog.String("remote_ip", clientIP(c).String()),
		)
		return nil
	}
}
