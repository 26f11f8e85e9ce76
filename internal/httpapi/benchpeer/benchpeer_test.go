package benchpeer_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/benchpeer"
	"github.com/tollgate/tollgate/internal/testenv"
)

func TestPeersAnswerTheEchoRoute(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	key := "test-" + testenv.RandomHex(6)
	t.Cleanup(func() { testenv.DeleteKeys(rdb, "rate:"+key) })
	for _, tc := range []struct {
		name          string
		app           *fiber.App
		wantRemaining bool
	}{
		{"bare", benchpeer.Bare(), false},
		{"redis_rate", benchpeer.RedisRate(rdb, key), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 3 {
				resp, err := tc.app.Test(httptest.NewRequest("GET", benchpeer.Path, nil))
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("request %d: status %d, want 200: %s", i, resp.StatusCode, body)
				}
				var got benchpeer.Echo
				if err := json.Unmarshal(body, &got); err != nil {
					t.Fatalf("body %q: %v", body, err)
				}
				if got.Method != "GET" || got.Path != benchpeer.Path || !got.Allowed {
					t.Errorf("got %+v, want GET %s allowed", got, benchpeer.Path)
				}
				if tc.wantRemaining && got.Remaining <= 0 {
					t.Errorf("got remaining %d, want > 0 (a limit the bench never reaches)", got.Remaining)
				}
			}
		})
	}
	if n, err := rdb.Exists(t.Context(), "rate:"+key).Result(); err != nil || n != 1 {
		t.Errorf("got %d keys rate:%s (err %v), want 1: redis_rate did not write its state", n, key, err)
	}
}

func TestRedisRateAnswers503WhenRedisFails(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	app := benchpeer.RedisRate(rdb, "test-"+testenv.RandomHex(6))
	if err := rdb.Close(); err != nil {
		t.Fatal(err)
	}
	resp, err := app.Test(httptest.NewRequest("GET", benchpeer.Path, nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("got status %d with Redis closed, want 503", resp.StatusCode)
	}
}

// TestServeUntilTheContextEnds serves Bare on a loopback listener, answers
// one request, and returns nil once its context ends, the listener closed.
func TestServeUntilTheContextEnds(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- benchpeer.Serve(ctx, benchpeer.Bare(), ln) }()

	resp, err := http.Get("http://" + ln.Addr().String() + benchpeer.Path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("got status %d, want 200", resp.StatusCode)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after its context ended = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return 10s after its context ended")
	}
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Errorf("dialing %s after Serve returned succeeded, want the listener closed", ln.Addr())
	}
}

// TestServeReportsAServerThatStops gives Serve a closed listener: it returns
// an error at once, without waiting for its context.
func TestServeReportsAServerThatStops(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	done := make(chan error, 1)
	go func() { done <- benchpeer.Serve(t.Context(), benchpeer.Bare(), ln) }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Serve on a closed listener = nil, want an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve on a closed listener did not return within 10s")
	}
}

// TestRedisRateKeyedByTheKeyHeader: KeyedPath limits each value of
// KeyHeader on a key of its own, as the api limits each tenant, and
// refuses a request without one.
func TestRedisRateKeyedByTheKeyHeader(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	key := "test-" + testenv.RandomHex(6)
	clients := []string{"Bearer a-" + testenv.RandomHex(4), "Bearer b-" + testenv.RandomHex(4)}
	t.Cleanup(func() { testenv.DeleteKeys(rdb, "rate:"+key+"*") })
	app := benchpeer.RedisRate(rdb, key)
	get := func(client string) int {
		t.Helper()
		req := httptest.NewRequest("GET", benchpeer.KeyedPath, nil)
		if client != "" {
			req.Header.Set(benchpeer.KeyHeader, client)
		}
		resp, err := app.Test(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 4 {
		if got := get(clients[i%2]); got != 200 {
			t.Fatalf("request %d of %q: status %d, want 200", i, clients[i%2], got)
		}
	}
	if got := get(""); got != 401 {
		t.Errorf("without %s: status %d, want 401", benchpeer.KeyHeader, got)
	}
	for _, c := range clients {
		tat, err := rdb.Get(t.Context(), "rate:"+key+":"+c).Result()
		if err != nil || tat == "" {
			t.Errorf("rate:%s:%s = %q (err %v), want redis_rate's state of that client", key, c, tat, err)
		}
	}
	if n, err := rdb.Exists(t.Context(), "rate:"+key).Result(); err != nil || n != 0 {
		t.Errorf("rate:%s exists (%d, err %v): the keyed route used the one key", key, n, err)
	}
}
