package httpapi

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

func mustServer(tb testing.TB, rdb redis.UniversalClient) *Server {
	tb.Helper()
	if rdb == nil {
		rdb = testenv.Redis(tb)
	}
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	s, err := New(Deps{Log: log, Sessions: redisdb.NewSessions(rdb, "tg")}, Options{BodyLimit: 1024})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func mustProblem(tb testing.TB, app *fiber.App, method, path, body string, wantStatus int) map[string]any {
	tb.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	resp, err := app.Test(req, 10_000)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != wantStatus {
		tb.Fatalf("%s %s: status %d, want %d (%s)", method, path, resp.StatusCode, wantStatus, raw)
	}
	if ct := resp.Header.Get("Content-Type"); ct != httpx.ContentTypeProblem {
		tb.Fatalf("%s %s: Content-Type %q, want %q", method, path, ct, httpx.ContentTypeProblem)
	}
	var p map[string]any
	if err := json.Unmarshal(raw, &p); err != nil {
		tb.Fatalf("%s %s: body %q is not JSON: %v", method, path, raw, err)
	}
	for _, k := range []string{"type", "title", "status", "detail"} {
		if _, ok := p[k]; !ok {
			tb.Errorf("%s %s: problem lacks %q: %s", method, path, k, raw)
		}
	}
	return p
}

func TestPanicBecomesProblem(t *testing.T) {
	t.Parallel()
	s := mustServer(t, nil)
	s.App().Get("/boom", func(*fiber.Ctx) error { panic("secret internals") })
	p := mustProblem(t, s.App(), "GET", "/boom", "", 500)
	if p["detail"] != "internal error" {
		t.Errorf("detail = %q, want %q (no internals leaked)", p["detail"], "internal error")
	}
}

// TestOversizedBodyIs413 goes through a real listener: a body announced
// past the limit is refused before any handler runs (httpx.BodyGuard), and
// the answer must still be problem+json.
func TestOversizedBodyIs413(t *testing.T) {
	t.Parallel()
	s := mustServer(t, nil)
	s.App().Post("/echo", func(c *fiber.Ctx) error { return c.Send(c.Body()) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.App().Listener(ln) }()
	t.Cleanup(func() { _ = s.App().Shutdown() })
	resp, err := http.Post("http://"+ln.Addr().String()+"/echo", "text/plain", strings.NewReader(strings.Repeat("x", 4096)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || resp.Header.Get("Content-Type") != httpx.ContentTypeProblem {
		t.Fatalf("status %d, Content-Type %q, want 413 %s (%s)", resp.StatusCode, resp.Header.Get("Content-Type"), httpx.ContentTypeProblem, raw)
	}
}
