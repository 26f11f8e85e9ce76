package api

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// The api's own limits on connections: a cap in all (503) and one per
// client address (429), answered and closed at once; a request read
// within TOLLGATE_READ_TIMEOUT, or its connection closed; and a process
// out of file descriptors that keeps serving.

// dialFrom opens a connection to base from the loopback address from
// (127.0.0.x: Linux routes the whole of 127/8 to the loopback interface),
// closed at cleanup.
func dialFrom(tb testing.TB, base, from string) net.Conn {
	tb.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		tb.Fatalf("dial from %s: %v", from, err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// heard is what a connection received within a wait.
type heard struct {
	status int // an answer's status; 0: nothing (held); -1: closed without an answer
	header http.Header
	body   string
}

// listen reads what each of conns receives within wait, all at once.
func listen(conns []net.Conn, wait time.Duration) []heard {
	out := make([]heard, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(wait))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				out[i] = heard{status: 0}
			case err != nil:
				out[i] = heard{status: -1}
			default:
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				out[i] = heard{status: resp.StatusCode, header: resp.Header, body: string(b)}
			}
		}()
	}
	wg.Wait()
	return out
}

// openFrom opens n connections from one address, sending nothing.
func openFrom(tb testing.TB, base, from string, n int) []net.Conn {
	tb.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = dialFrom(tb, base, from)
	}
	return conns
}

// tally counts the statuses heard.
func tally(hs []heard) map[int]int {
	m := map[int]int{}
	for _, h := range hs {
		m[h.status]++
	}
	return m
}

// TestConnectionCaps: with TOLLGATE_MAX_CONNS 12 and
// TOLLGATE_MAX_CONNS_PER_IP 5, a sixth connection from one address is
// answered 429 and closed, a thirteenth in all 503 (with Retry-After), as
// problem+json, /healthz included; the connections held, which never send
// a request, are closed by the api after TOLLGATE_READ_TIMEOUT, and then
// every address is served again.
func TestConnectionCaps(t *testing.T) {
	t.Parallel()
	base, _, key := startKeyed(t, map[string]string{
		"TOLLGATE_MAX_CONNS": "12", "TOLLGATE_MAX_CONNS_PER_IP": "5", "TOLLGATE_READ_TIMEOUT": "10s"})

	var held []net.Conn // the connections the api holds
	step := func(from string, n int) []heard {
		t.Helper()
		conns := openFrom(t, base, from, n)
		hs := listen(conns, 1500*time.Millisecond) // a refusal comes at once; a held connection hears nothing
		for i, h := range hs {
			if h.status == 0 {
				held = append(held, conns[i])
			}
		}
		return hs
	}
	a := step("127.0.0.2", 7)
	if got := tally(a); got[0] != 5 || got[429] != 2 {
		t.Fatalf("7 connections from one address under a cap of 5 an address: %v (status: count; 0 held), want 5 held and 2 answered 429", got)
	}
	for _, h := range a {
		if h.status == 429 && (h.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(h.body, `"status":429`)) {
			t.Errorf("a connection past the cap of its address: %q %s, want problem+json", h.header.Get("Content-Type"), h.body)
		}
	}
	if got := tally(step("127.0.0.3", 5)); got[0] != 5 {
		t.Fatalf("5 connections from a second address: %v, want 5 held", got)
	}
	c := step("127.0.0.4", 4)
	if got := tally(c); got[0] != 2 || got[503] != 2 {
		t.Fatalf("4 connections from a third address with 10 of 12 open: %v, want 2 held and 2 answered 503", got)
	}
	for _, h := range c {
		if h.status == 503 && (h.header.Get("Content-Type") != "application/problem+json" || h.header.Get("Retry-After") != "1") {
			t.Errorf("a connection past the cap: %q, Retry-After %q, want problem+json and 1", h.header.Get("Content-Type"), h.header.Get("Retry-After"))
		}
	}
	hc := dialFrom(t, base, "127.0.0.5")
	_, _ = io.WriteString(hc, "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
	if h := listen([]net.Conn{hc}, 2*time.Second)[0]; h.status != 503 {
		t.Errorf("GET /healthz with every connection taken: %d %s, want 503", h.status, h.body)
	}

	// The 12 held connections sent nothing: the api ends each once the
	// read timeout has passed (with a 408, or without a word).
	for i, h := range listen(held, 20*time.Second) {
		if h.status != 408 && h.status != -1 {
			t.Errorf("held connection %d: %d %s, want it closed by the api (408 or nothing) within 20 s", i, h.status, h.body)
		}
	}
	for _, from := range []string{"127.0.0.2", "127.0.0.5"} {
		hc := dialFrom(t, base, from)
		_, _ = io.WriteString(hc, "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
		if h := listen([]net.Conn{hc}, 10*time.Second)[0]; h.status != 200 {
			t.Errorf("GET /healthz from %s after the read timeout: %d %s, want 200", from, h.status, h.body)
		}
	}
	if r := rawGet(t, base, "/api/demo/echo", key); r.status != 200 {
		t.Errorf("a metered request after the read timeout: %d %s, want 200", r.status, r.body)
	}
}

// TestOutOfDescriptorsTheAPIKeepsServing: an api process limited to 256
// open files takes 600 connections that each send half a request, more
// than its connection cap and than its descriptors: with the default cap
// (half the descriptors) the connections past it are answered 503, and
// with a cap above the descriptors, which then run out first, the api
// waits for some to close. Either way it stays up, answers /healthz (once
// the read timeout has closed enough of the flood), and serves metered
// requests after the flood.
func TestOutOfDescriptorsTheAPIKeepsServing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, maxConns string
		refused        bool // the cap refuses some of the flood
	}{
		{"default cap", "0", true},
		{"cap above the descriptors", "1000", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := mustStack(t)
			tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
			_, key := s.tenant(tier.Slug)
			env := s.env(map[string]string{"TOLLGATE_MAX_CONNS": tc.maxConns, "TOLLGATE_MAX_CONNS_PER_IP": "0", "TOLLGATE_READ_TIMEOUT": "3s"})
			// ulimit sets the hard limit too: the Go runtime cannot raise it.
			pid, base := startAPICommand(t, exec.Command("sh", "-c", `ulimit -n 256 && exec "$0"`, os.Args[0]), env)
			if r := rawGet(t, base, "/api/demo/echo", key); r.status != 200 {
				t.Fatalf("warm-up: %d %s", r.status, r.body)
			}

			flood := make([]net.Conn, 600)
			for i := range flood {
				flood[i] = dialFrom(t, base, "127.0.0.1")
				_, _ = io.WriteString(flood[i], "GET /healthz HTTP/1.1\r\nHost: t\r\n")
			}
			if got := tally(listen(flood, time.Second)); (got[503] > 0) != tc.refused {
				t.Errorf("600 connections sending half a request: %v (status: count; 0 held), want 503s: %t", got, tc.refused)
			}
			healthy := false
			for deadline := time.Now().Add(60 * time.Second); !healthy && time.Now().Before(deadline); {
				hc := dialFrom(t, base, "127.0.0.1")
				_, _ = io.WriteString(hc, "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
				healthy = listen([]net.Conn{hc}, 15*time.Second)[0].status == 200
				hc.Close()
				if !healthy {
					time.Sleep(500 * time.Millisecond)
				}
			}
			if err := syscall.Kill(pid, 0); err != nil {
				t.Fatalf("the api process is gone after 600 connections with 256 descriptors: %v", err)
			}
			if !healthy {
				t.Fatal("GET /healthz behind 600 connections with 256 descriptors: no 200 within 60 s")
			}
			for _, c := range flood {
				c.Close()
			}
			if r := rawGet(t, base, "/api/demo/echo", key); r.status != 200 {
				t.Fatalf("a metered request after the flood: %d %s, want 200", r.status, r.body)
			}
			if err := syscall.Kill(pid, 0); err != nil {
				t.Fatalf("the api process is gone: %v", err)
			}
		})
	}
}
