package httpapi

import (
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
)

// BenchmarkDecodeCheckBody decodes the body of a POST /v1/check as the
// route does (httpx.DecodeJSON, with its checks of members named twice or
// unknown at any depth).
func BenchmarkDecodeCheckBody(b *testing.B) {
	app := fiber.New()
	var fc fasthttp.RequestCtx
	fc.Request.Header.SetContentType("application/json")
	fc.Request.SetBodyString(`{"tenant_id": "0b4a3c1e-7d2f-4e5a-9b8c-1d2e3f4a5b6c", "meter": "search", "cost": 3, "idempotency_key": "req-42"}`)
	c := app.AcquireCtx(&fc)
	defer app.ReleaseCtx(c)
	b.ReportAllocs()
	for b.Loop() {
		var v CheckRequest
		if err := httpx.DecodeJSON(c, &v); err != nil {
			b.Fatal(err)
		}
	}
}
