package httpapi

import (
	"bytes"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
)

// FuzzCheckDecoder feeds arbitrary bodies to /v1/check's decoder: it must
// answer 204 (valid) or a 4xx problem, never a 5xx or a panic.
func FuzzCheckDecoder(f *testing.F) {
	f.Add([]byte(`{"api_key": 5, "meter": ["m"], "cost": -0.5}`))
	f.Add([]byte(`{"tenant_id": "x", "meter": "m", "cost": 1e400, "dry_run": true}`))
	app := fiber.New(fiber.Config{ErrorHandler: httpx.ErrorHandler(slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)})
	app.Post("/", func(c *fiber.Ctx) error {
		var b CheckRequest
		if err := httpx.DecodeJSON(c, &b); err != nil {
			return err
		}
		return c.SendStatus(fiber.StatusNoContent)
	})
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest("POST", "/", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := app.Test(req, -1)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("answered %d to %q", resp.StatusCode, body)
		}
	})
}
