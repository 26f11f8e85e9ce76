package tollgate_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	tollgate "github.com/tollgate/tollgate/sdk/go"
	"github.com/tollgate/tollgate/sdk/go/admin"
)

// These tests run the real api and worker, built from the repository's
// root, on loopback ports, with the Redis and Postgres of REDIS_URL and
// DATABASE_URL: a database of their own (created with psql, migrated by
// the api) and a Redis key prefix of their own, both removed at the end.

const howTo = "run `make test` at the repository's root, which starts local Redis and Postgres, or set REDIS_URL and " +
	"DATABASE_URL (e.g. REDIS_URL=redis://127.0.0.1:6379/0 DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable')"

const (
	adminToken   = "sdk-test-admin-token-0123456789"
	serviceToken = "sdk-test-service-token-0123456789"
)

var (
	binsOnce sync.Once
	binDir   string
	binsErr  error

	stackOnce sync.Once
	shared    *stack
	stackErr  error
	stopAll   []func()
	stopMu    sync.Mutex
)

func TestMain(m *testing.M) {
	code := m.Run()
	stopMu.Lock()
	for i := len(stopAll) - 1; i >= 0; i-- {
		stopAll[i]()
	}
	stopMu.Unlock()
	if binDir != "" {
		if err := os.RemoveAll(binDir); err != nil {
			fmt.Fprintln(os.Stderr, "removing the binaries:", err)
		}
	}
	os.Exit(code)
}

func atExit(f func()) {
	stopMu.Lock()
	stopAll = append(stopAll, f)
	stopMu.Unlock()
}

// integration skips the test under go test -short (make test-unit): the
// tests that build and run the api and worker need Redis and Postgres.
// Without -short a missing server fails the test, saying how to start it.
func integration(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("needs Redis, Postgres and a build of the api and worker: an integration test; make test runs it")
	}
}

// binaries builds cmd/api and cmd/worker (and the examples) once.
func binaries(tb testing.TB) string {
	tb.Helper()
	integration(tb)
	binsOnce.Do(func() {
		if binDir, binsErr = os.MkdirTemp("", "tollgate-sdk-bin-"); binsErr != nil {
			return
		}
		var out bytes.Buffer
		cmd := exec.Command("go", "build", "-C", "../..", "-o", binDir+string(filepath.Separator), "./cmd/api", "./cmd/worker")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			binsErr = fmt.Errorf("go build ./cmd/api ./cmd/worker: %w\n%s", err, out.Bytes())
			return
		}
		cmd = exec.Command("go", "build", "-o", binDir+string(filepath.Separator), "./examples/...")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			binsErr = fmt.Errorf("go build ./examples/...: %w\n%s", err, out.Bytes())
		}
	})
	if binsErr != nil {
		tb.Fatal(binsErr)
	}
	return binDir
}

// stack is a database and a Redis prefix of the tests' own, with an api
// and a worker on them.
type stack struct {
	env   []string
	base  string
	admin *admin.ClientWithResponses
}

// sharedStack starts (once for the test binary) the stack the tests share;
// each test makes a tier and tenant of its own in it.
func sharedStack(tb testing.TB) *stack {
	tb.Helper()
	integration(tb)
	stackOnce.Do(func() { shared, stackErr = newStack(tb) })
	if stackErr != nil {
		tb.Fatal(stackErr)
	}
	return shared
}

func newStack(tb testing.TB) (*stack, error) {
	bins := binaries(tb)
	redisURL, dbURL := os.Getenv("REDIS_URL"), os.Getenv("DATABASE_URL")
	if redisURL == "" || dbURL == "" {
		return nil, fmt.Errorf("REDIS_URL and DATABASE_URL must name the Redis and Postgres to test with: %s", howTo)
	}
	suffix := randomHex(6)
	db, err := createDatabase(dbURL, "tg_sdk_"+suffix)
	if err != nil {
		return nil, err
	}
	prefix := "test-sdk-" + suffix
	atExit(func() { _ = deleteRedisKeys(redisURL, prefix+"*") })
	s := &stack{env: append(os.Environ(),
		"REDIS_URL="+redisURL, "DATABASE_URL="+db, "TOLLGATE_REDIS_PREFIX="+prefix,
		"TOLLGATE_ADMIN_TOKEN="+adminToken, "TOLLGATE_SERVICE_TOKEN="+serviceToken,
		"TOLLGATE_LOG_LEVEL=info", "TOLLGATE_LOG_FORMAT=json", "TOLLGATE_SHUTDOWN_TIMEOUT=2s",
		"TOLLGATE_RECONCILE_INTERVAL=1s", "TOLLGATE_WORKER_METRICS_ADDR=127.0.0.1:0")}
	base, stop, err := s.startAPI(bins)
	if err != nil {
		return nil, err
	}
	atExit(stop)
	s.base = base
	_, stopWorker, err := startProcess(filepath.Join(bins, "worker"), s.env, "worker started", "metrics_addr")
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	atExit(stopWorker)
	if s.admin, err = admin.New(base, adminToken, nil); err != nil {
		return nil, err
	}
	return s, nil
}

// startAPI starts one more api on the stack's database and prefix and
// returns its base URL and a func that stops it (SIGTERM, then waits).
func (s *stack) startAPI(bins string) (string, func(), error) {
	env := append(append([]string(nil), s.env...), "TOLLGATE_ADDR=127.0.0.1:0")
	addr, stop, err := startProcess(filepath.Join(bins, "api"), env, "listening", "addr")
	if err != nil {
		return "", nil, fmt.Errorf("api: %w", err)
	}
	return "http://" + addr, stop, nil
}

// startProcess runs bin with env and waits (30 s at most) for the JSON log
// line whose msg is msg; it returns that line's field.
func startProcess(bin string, env []string, msg, field string) (string, func(), error) {
	cmd := exec.Command(bin)
	cmd.Env = env
	dieWithTests(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sent := false
		for sc.Scan() {
			var line map[string]any
			if !sent && json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == msg {
				v, _ := line[field].(string)
				found <- v
				sent = true
			}
		}
		close(found)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
	}
	select {
	case v, ok := <-found:
		if !ok || v == "" {
			stop()
			return "", nil, fmt.Errorf("%s ended before logging %q: %s", filepath.Base(bin), msg, stderr.Bytes())
		}
		return v, stop, nil
	case <-time.After(30 * time.Second):
		stop()
		return "", nil, fmt.Errorf("%s logged no %q within 30s: %s", filepath.Base(bin), msg, stderr.Bytes())
	}
}

// createDatabase creates database name on the server of base (with psql,
// which scripts/services.sh needs too) and returns its URL; it is dropped
// when the tests end.
func createDatabase(base, name string) (string, error) {
	bin, err := exec.LookPath("psql")
	if err != nil { // Debian's server package keeps it here
		found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
		if len(found) == 0 {
			return "", fmt.Errorf("psql is needed to create the tests' database (apt-get install postgresql-client): %s", howTo)
		}
		bin = found[len(found)-1]
	}
	psql := func(sql string) error {
		out, err := exec.Command(bin, base, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql).CombinedOutput()
		if err != nil {
			return fmt.Errorf("psql %q: %w: %s: %s", sql, err, out, howTo)
		}
		return nil
	}
	if err := psql("CREATE DATABASE " + name); err != nil {
		return "", err
	}
	atExit(func() { _ = psql("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") })
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("DATABASE_URL: %w", err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// deleteRedisKeys deletes the keys matching pattern, in RESP over TCP (the
// SDK takes no Redis client for its tests).
func deleteRedisKeys(redisURL, pattern string) error {
	u, err := url.Parse(redisURL)
	if err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	send := func(args ...string) error {
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := io.WriteString(c, b.String()); err != nil {
			return err
		}
		line, err := r.ReadString('\n')
		if err == nil && strings.HasPrefix(line, "-") {
			err = fmt.Errorf("redis: %s", strings.TrimSpace(line))
		}
		return err
	}
	if pw, ok := u.User.Password(); ok {
		if err := send("AUTH", pw); err != nil {
			return err
		}
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" && db != "0" {
		if err := send("SELECT", db); err != nil {
			return err
		}
	}
	return send("EVAL", `local n = 0
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k); n = n + 1 end
return n`, "0", pattern)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var tierRank atomic.Int64

// tenant is a tenant of a tier of its own, with an API key.
type tenant struct {
	id, key, tier string
}

// newTenant makes a tier with dailyQuota (0: none), a tenant on it and a
// key, through the admin client.
func (s *stack) newTenant(tb testing.TB, dailyQuota int64) tenant {
	tb.Helper()
	ctx := context.Background()
	slug := "sdk-" + randomHex(4)
	tier := admin.Tier{Slug: slug, Name: "SDK " + slug, Rank: int(100 + tierRank.Add(1)), PriceCents: 0, Overage: admin.TierOverage("block")}
	if dailyQuota > 0 {
		tier.DailyQuota = &dailyQuota
	}
	tr, err := s.admin.CreateTierWithResponse(ctx, tier)
	if err != nil {
		tb.Fatalf("create tier: %v", err)
	} else if tr.JSON201 == nil {
		tb.Fatalf("create tier: %d %s, want 201", tr.StatusCode(), tr.Body)
	}
	te, err := s.admin.CreateTenantWithResponse(ctx, admin.TenantCreate{Name: "SDK tenant " + slug, Tier: slug})
	if err != nil {
		tb.Fatalf("create tenant: %v", err)
	} else if te.JSON201 == nil {
		tb.Fatalf("create tenant: %d %s, want 201", te.StatusCode(), te.Body)
	}
	name := "sdk test"
	k, err := s.admin.IssueKeyWithResponse(ctx, te.JSON201.Id, admin.KeyCreate{Name: &name})
	if err != nil {
		tb.Fatalf("issue key: %v", err)
	} else if k.JSON201 == nil {
		tb.Fatalf("issue key: %d %s, want 201", k.StatusCode(), k.Body)
	}
	return tenant{id: te.JSON201.Id.String(), key: k.JSON201.Secret, tier: slug}
}

// counter counts the requests an http.Client sends, by path.
type counter struct {
	mu   sync.Mutex
	hits map[string]int
	next http.RoundTripper
	// last keeps the last /v1/check answer's body.
	last []byte
}

func newCounter() *counter { return &counter{hits: map[string]int{}, next: http.DefaultTransport} }

func (c *counter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.hits[r.URL.Path]++
	c.mu.Unlock()
	resp, err := c.next.RoundTrip(r)
	if err == nil && r.URL.Path == "/v1/check" {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b))
		if rerr == nil {
			c.mu.Lock()
			c.last = b
			c.mu.Unlock()
		}
	}
	return resp, err
}

func (c *counter) count(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits[path]
}

func (c *counter) lastCheck() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// serviceClient is a client of s's api whose calls c counts.
func (s *stack) serviceClient(c *counter) *tollgate.ServiceClient {
	return tollgate.NewServiceClient(s.base, serviceToken, tollgate.WithHTTPClient(&http.Client{Transport: c}))
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func jsonInto(b []byte, v any) error { return json.Unmarshal(b, v) }
