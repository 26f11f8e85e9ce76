// Package benchpeer holds the two reference servers `make bench` measures
// the api against, so that its figures read as ratios rather than absolute
// numbers of one machine:
//
//   - Bare: Fiber answering one JSON route, the ceiling of any Fiber app on
//     the machine;
//   - RedisRate: the same route behind one github.com/go-redis/redis_rate
//     GCRA check (one EVALSHA per request), what a rate limiter costs when it
//     does the least a Redis-backed limiter can do: on one key (Path), or on
//     a key per client (KeyedPath: the value of the request's KeyHeader, as
//     the api limits each tenant by its API key).
//
// cmd/loadgen serves them through Serve (`loadgen -peer bare -addr
// 127.0.0.1:18081`), and so needs no Fiber of its own.
//
// It is for measurement only: the api never serves it, and it imports no
// package of Tollgate's.
package benchpeer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/gofiber/fiber/v2"
	"github.com/redis/go-redis/v9"
)

// Path is the route both apps serve.
const Path = "/echo"

// KeyedPath is RedisRate's route limited per client, by the value of the
// request's KeyHeader (the header the api reads a tenant's API key from).
const (
	KeyedPath = "/keyed"
	KeyHeader = "Authorization"
)

// Echo is the answer of both apps: small, typed, encoded by c.JSON as the
// api's demo route is.
type Echo struct {
	Method    string `json:"method"`
	Path      string `json:"path"`
	Allowed   bool   `json:"allowed"`
	Remaining int    `json:"remaining"`
}

// limit is far above what loopback load can reach (10^6 requests a second,
// a second's worth of burst), so RedisRate never refuses and every request
// does the full GCRA write.
var limit = redis_rate.Limit{Rate: 1_000_000, Burst: 1_000_000, Period: time.Second}

func newApp() *fiber.App {
	// The settings of the api's app that matter per request; everything
	// else is Fiber's defaults.
	return fiber.New(fiber.Config{DisableStartupMessage: true, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second})
}

// Bare returns a Fiber app answering GET Path with an Echo.
func Bare() *fiber.App {
	app := newApp()
	app.Get(Path, func(c *fiber.Ctx) error {
		return c.JSON(Echo{Method: c.Method(), Path: c.Path(), Allowed: true})
	})
	return app
}

// RedisRate returns a Fiber app answering GET Path with an Echo after one
// redis_rate Allow of key on rdb (redis_rate stores it as "rate:" + key),
// and GET KeyedPath the same way on key + ":" + the request's KeyHeader
// (401 without one); 429 if refused (never, at loopback rates), 503 if
// Redis fails.
func RedisRate(rdb redis.UniversalClient, key string) *fiber.App {
	limiter := redis_rate.NewLimiter(rdb)
	allow := func(c *fiber.Ctx, key string) error {
		res, err := limiter.Allow(c.UserContext(), key, limit)
		if err != nil {
			return fiber.NewError(fiber.StatusServiceUnavailable, "redis: "+err.Error())
		}
		if res.Allowed == 0 {
			return c.Status(fiber.StatusTooManyRequests).JSON(Echo{Method: c.Method(), Path: c.Path()})
		}
		return c.JSON(Echo{Method: c.Method(), Path: c.Path(), Allowed: true, Remaining: res.Remaining})
	}
	app := newApp()
	app.Get(Path, func(c *fiber.Ctx) error { return allow(c, key) })
	app.Get(KeyedPath, func(c *fiber.Ctx) error {
		client := c.Get(KeyHeader)
		if client == "" {
			return fiber.NewError(fiber.StatusUnauthorized, "no "+KeyHeader+" header")
		}
		return allow(c, key+":"+client)
	})
	return app
}

// shutdownTimeout is how long Serve gives the requests in flight once its
// context ends.
const shutdownTimeout = 5 * time.Second

// Serve serves app on ln until ctx ends, then shuts app down, which closes
// ln. It returns nil after a clean shutdown, and an error if app stopped
// serving on its own or the shutdown failed.
func Serve(ctx context.Context, app *fiber.App, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- app.Listener(ln) }()
	select {
	case err := <-errc:
		if err == nil {
			err = errors.New("stopped before its context ended")
		}
		return fmt.Errorf("benchpeer: serve: %w", err)
	case <-ctx.Done():
	}
	if err := app.ShutdownWithTimeout(shutdownTimeout); err != nil {
		return fmt.Errorf("benchpeer: shut down: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("benchpeer: serve: %w", err)
	}
	return nil
}
