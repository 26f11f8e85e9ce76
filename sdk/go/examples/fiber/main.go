// Command fiber is an API served with Fiber v2 whose requests Tollgate
// admits (package fibermw): GET /hello counts one unit of the meter
// "hello"; a refused request is answered Tollgate's 429 (or 402) as it is;
// a handler's error is refunded.
//
//	TOLLGATE_URL=http://127.0.0.1:8080 TOLLGATE_SERVICE_TOKEN=... ADDR=127.0.0.1:8091 go run ./examples/fiber
//	curl -H 'X-API-Key: tg_...' http://127.0.0.1:8091/hello
//
// FAIL_OPEN=true serves requests while Tollgate is unreachable.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v2"

	tollgate "github.com/tollgate/tollgate/sdk/go"
	"github.com/tollgate/tollgate/sdk/go/fibermw"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	if err := run(ctx, log); err != nil {
		fmt.Fprintln(os.Stderr, "fiber:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger) error {
	base, token := os.Getenv("TOLLGATE_URL"), os.Getenv("TOLLGATE_SERVICE_TOKEN")
	if base == "" || token == "" {
		return errors.New("set TOLLGATE_URL and TOLLGATE_SERVICE_TOKEN")
	}
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8091"
	}
	failOpen, _ := strconv.ParseBool(os.Getenv("FAIL_OPEN"))

	client := tollgate.NewServiceClient(base, token, tollgate.WithTimeout(time.Second))
	gate := tollgate.NewGate(client, tollgate.GateOptions{
		Meter: "hello", FailOpen: failOpen, RefundOnServerError: true,
		OnError: func(err error) { log.Warn("tollgate", "err", err) },
	})
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(fibermw.New(gate, fibermw.Config{}))
	app.Get("/hello", func(c *fiber.Ctx) error {
		return c.SendString("hello, tenant " + fibermw.Admission(c).TenantID + "\n")
	})
	app.Get("/broken", func(c *fiber.Ctx) error {
		return errors.New("something broke") // 500, refunded
	})

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	log.Info("listening", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- app.Listener(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	return app.ShutdownWithTimeout(5 * time.Second)
}
