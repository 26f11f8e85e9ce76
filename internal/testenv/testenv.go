// Package testenv gives tests real Redis and Postgres servers, each test
// isolated by its own key prefix or its own database.
//
// Servers come from REDIS_URL and DATABASE_URL (make test sets both, starting
// local servers when none is reachable). Without them, when a Docker engine is
// reachable, testcontainers starts throwaway containers. Otherwise the test
// fails with a message saying how to start them: integration tests never skip
// because a service is missing.
//
// Under go test -short (make test-unit) every helper that needs a service
// (Redis, Postgres, a Redis Cluster, stripe-mock, a browser) skips the test
// instead, whether the service is there or not: -short runs the unit tests
// alone, without services, in seconds. That is the only skip.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/redisdb"
)

const howTo = "run `make test`, which starts local Redis and Postgres, or set REDIS_URL and DATABASE_URL " +
	"(e.g. REDIS_URL=redis://127.0.0.1:6379/0 DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)"

var (
	containerOnce sync.Map // image -> *containerResult
)

type containerResult struct {
	once sync.Once
	url  string
	err  error
}

// fromContainer starts (once per test binary) a container of image and
// returns a URL for it. The testcontainers reaper removes it at exit.
func fromContainer(image, port string, env map[string]string, scheme func(endpoint string) string) (string, error) {
	v, _ := containerOnce.LoadOrStore(image, &containerResult{})
	r := v.(*containerResult)
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if p, err := testcontainers.NewDockerProvider(); err != nil || p.Health(ctx) != nil {
			r.err = fmt.Errorf("no Docker engine reachable")
			return
		}
		c, err := testcontainers.Run(ctx, image,
			testcontainers.WithExposedPorts(port),
			testcontainers.WithEnv(env),
			testcontainers.WithWaitStrategy(wait.ForListeningPort(port).WithStartupTimeout(2*time.Minute)))
		if err != nil {
			r.err = err
			return
		}
		ep, err := c.PortEndpoint(ctx, port, "")
		if err != nil {
			r.err = err
			return
		}
		r.url = scheme(ep)
	})
	return r.url, r.err
}

// Integration skips the test under go test -short, saying that it needs
// service (make test-unit runs with -short, make test without): it is how an
// integration test that starts or reaches a service outside the test
// process (a server, a browser, a load generator, a build of the binaries)
// is left out of the unit run. Without -short it does nothing, and the
// test fails later, saying how to start what is missing, when it is.
// testenv's own helpers call it; a test that starts such a thing by other
// means calls it first.
func Integration(tb testing.TB, service string) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("needs " + service + ": an integration test; make test runs it")
	}
}

// RedisURL returns the Redis server tests use.
func RedisURL(tb testing.TB) string {
	tb.Helper()
	Integration(tb, "Redis")
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	u, err := fromContainer("redis:7", "6379/tcp", nil, func(ep string) string { return "redis://" + ep + "/0" })
	if err != nil {
		tb.Fatalf("testenv: REDIS_URL is not set and testcontainers could not start Redis (%v): %s", err, howTo)
	}
	return u
}

// DatabaseURL returns the Postgres server's URL tests create databases in.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	Integration(tb, "Postgres")
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	u, err := fromContainer("postgres:16", "5432/tcp",
		map[string]string{"POSTGRES_PASSWORD": "postgres", "POSTGRES_HOST_AUTH_METHOD": "trust"},
		func(ep string) string { return "postgres://postgres@" + ep + "/postgres?sslmode=disable" })
	if err != nil {
		tb.Fatalf("testenv: DATABASE_URL is not set and testcontainers could not start Postgres (%v): %s", err, howTo)
	}
	return u
}

// Redis returns a client of its own for the test, closed at cleanup.
func Redis(tb testing.TB) redis.UniversalClient {
	tb.Helper()
	opts, err := redisdb.ParseURL(RedisURL(tb))
	if err != nil {
		tb.Fatalf("testenv: REDIS_URL: %v", err)
	}
	c, err := redisdb.Open(context.Background(), opts)
	if err != nil {
		tb.Fatalf("testenv: %v: %s", err, howTo)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a Redis key prefix unique to the test; its keys are deleted
// at cleanup.
func Prefix(tb testing.TB, c redis.UniversalClient) string {
	tb.Helper()
	p := "test-" + RandomHex(6)
	tb.Cleanup(func() { DeleteKeys(c, p+"*") })
	return p
}

// DeleteKeys deletes every key matching pattern, on every master of a cluster.
func DeleteKeys(c redis.UniversalClient, pattern string) {
	ctx := context.Background()
	del := func(ctx context.Context, n *redis.Client) error {
		iter := n.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			n.Del(ctx, iter.Val())
		}
		return iter.Err()
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, del)
		return
	}
	if n, ok := c.(*redis.Client); ok {
		_ = del(ctx, n)
	}
}

// RandomHex returns 2n random hex digits.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NewDatabase creates an empty database of the test's own, dropped at cleanup,
// and returns its URL.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	base := DatabaseURL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		tb.Fatalf("testenv: connect %s: %v: %s", redact(base), err, howTo)
	}
	defer admin.Close(context.Background())
	name := "tg_test_" + RandomHex(6)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("testenv: create database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			tb.Errorf("testenv: drop database %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		tb.Fatalf("testenv: DATABASE_URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// MigratedDatabase is NewDatabase with every migration applied.
func MigratedDatabase(tb testing.TB) string {
	tb.Helper()
	u := NewDatabase(tb)
	if err := pgdb.MigrateUp(u); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return u
}

// Postgres returns a pool on a migrated database of the test's own.
func Postgres(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgdb.Open(context.Background(), MigratedDatabase(tb))
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return strings.SplitN(raw, "@", 2)[0]
}

// StripeMockURL returns the base URL of the stripe-mock server (a real
// Stripe API mock answering fixtures) the Stripe export's tests call, from
// STRIPE_MOCK_URL, once it has answered; without one the test fails saying
// how to start it.
func StripeMockURL(tb testing.TB) string {
	tb.Helper()
	Integration(tb, "stripe-mock")
	const howToStripe = "run `make test`, which starts stripe-mock, or `eval \"$(scripts/services.sh stripe-mock)\"`, " +
		"or start one (go install github.com/stripe/stripe-mock@v0.203.0; stripe-mock -http-addr 127.0.0.1:12111) " +
		"and set STRIPE_MOCK_URL=http://127.0.0.1:12111"
	u := os.Getenv("STRIPE_MOCK_URL")
	if u == "" {
		tb.Fatalf("testenv: STRIPE_MOCK_URL is not set: %s", howToStripe)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(u, "/")+"/v1/balance", nil)
	if err != nil {
		tb.Fatalf("testenv: STRIPE_MOCK_URL=%q: %v: %s", u, err, howToStripe)
	}
	req.SetBasicAuth("sk_test_tollgate", "")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("testenv: stripe-mock at STRIPE_MOCK_URL=%s does not answer (%v): %s", u, err, howToStripe)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("testenv: STRIPE_MOCK_URL=%s answered GET /v1/balance with %s, not like stripe-mock: %s", u, resp.Status, howToStripe)
	}
	return strings.TrimSuffix(u, "/")
}
