package tollgate_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	tollgate "github.com/tollgate/tollgate/sdk/go"
	"github.com/tollgate/tollgate/sdk/go/fibermw"
)

func TestFiberMiddleware(t *testing.T) {
	s := sharedStack(t)
	tn := s.newTenant(t, 3)
	cnt := newCounter()
	clk := &clock{now: time.Now()}
	c := s.serviceClient(cnt)
	g := tollgate.NewGate(c, tollgate.GateOptions{Meter: "calls", RefundOnServerError: true, Now: clk.Now})

	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(fibermw.New(g, fibermw.Config{Cost: func(c *fiber.Ctx) int64 { return int64(c.QueryInt("n", 0)) }}))
	var lastID atomic.Value // string
	app.Get("/ok", func(c *fiber.Ctx) error {
		a := fibermw.Admission(c)
		fromCtx, _ := tollgate.AdmissionFrom(c.UserContext())
		if a == nil || a != fromCtx || a.TenantID != tn.id {
			t.Errorf("admission %+v (context %+v), want tenant %s's in Locals and the user context", a, fromCtx, tn.id)
		} else {
			lastID.Store(a.RequestID)
		}
		return c.SendString("served")
	})
	app.Get("/fail", func(c *fiber.Ctx) error { return errors.New("the handler failed") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = app.Listener(ln) }()
	defer func() { _ = app.Shutdown() }()
	base := "http://" + ln.Addr().String()

	ok := get(t, base+"/ok", tn.key)
	if ok.status != 200 || string(ok.body) != "served" || ok.header.Get("RateLimit-Policy") == "" {
		t.Fatalf("admitted: %d %q policy %q, want 200 served with the quota headers", ok.status, ok.body, ok.header.Get("RateLimit-Policy"))
	}
	sameAsCheck(t, "admitted", ok, lastCheck(t, cnt))
	if id, _ := lastID.Load().(string); id == "" {
		t.Fatal("the handler saw no request id")
	}

	// A failing handler (500 from Fiber's error handler) is refunded.
	if a := get(t, base+"/fail", tn.key); a.status != 500 {
		t.Fatalf("/fail: %d, want 500", a.status)
	}
	if got := daily(t, mustCheck(t, c, tn.key, "calls", 1, true).Limits) + 1; got != 2 {
		t.Fatalf("after a refunded failure: %d remaining, want 2", got)
	}

	// A cost of 3 does not fit in 2: refused byte for byte, then locally.
	refused := get(t, base+"/ok?n=3", tn.key)
	want := lastCheck(t, cnt)
	if refused.status != 429 {
		t.Fatalf("cost 3 of 2 left: %d, want 429", refused.status)
	}
	sameAsCheck(t, "refused", refused, want)
	checks := cnt.count("/v1/check")
	if again := get(t, base+"/ok?n=3", tn.key); again.status != 429 || string(again.body) != string(refused.body) || cnt.count("/v1/check") != checks {
		t.Fatalf("repeat within Retry-After: %d after %d checks, want a local 429 after %d", again.status, cnt.count("/v1/check"), checks)
	}
	// A smaller cost may fit: asked, and served.
	if small := get(t, base+"/ok?n=1", tn.key); small.status != 200 || cnt.count("/v1/check") != checks+1 {
		t.Fatalf("cost 1 after a refusal of 3: %d after %d checks, want 200 asked of Tollgate", small.status, cnt.count("/v1/check"))
	}
	if a := get(t, base+"/ok", ""); a.status != 401 || a.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("no key: %d %s, want a 401 problem", a.status, a.header.Get("Content-Type"))
	}
	if _, err := c.Refund(context.Background(), tn.id, lastID.Load().(string)); err != nil {
		t.Fatalf("refund of the last request the handler saw: %v", err)
	}
}
