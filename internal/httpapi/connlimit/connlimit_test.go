package connlimit

import (
	"bufio"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func TestKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ addr, want string }{
		{"192.0.2.7", "192.0.2.7/32"},
		{"::ffff:192.0.2.7", "192.0.2.7/32"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"},
		{"fe80::1%eth0", "fe80::/64"},
	} {
		if got := Key(netip.MustParseAddr(tc.addr)).String(); got != tc.want {
			t.Errorf("Key(%s) = %s, want %s", tc.addr, got, tc.want)
		}
	}
}

// accepted runs Accept on l in the background and delivers what it returns.
func accepted(tb testing.TB, l *Listener) <-chan net.Conn {
	tb.Helper()
	ch := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}
	}()
	tb.Cleanup(func() { l.Close() })
	return ch
}

func dial(tb testing.TB, addr net.Addr, from string) net.Conn {
	tb.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr.String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// refusedWith reads the answer a refused connection gets, or fails.
func refusedWith(tb testing.TB, c net.Conn) int {
	tb.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		tb.Fatalf("no answer on a refused connection: %v", err)
	}
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != "application/problem+json" || !resp.Close {
		tb.Errorf("refusal %d: headers %v, want problem+json and Connection: close", resp.StatusCode, resp.Header)
	}
	return resp.StatusCode
}

// TestCapsAndRelease: the caps count the connections handed out until the
// server reports them closed; an exempt address counts in all only.
func TestCapsAndRelease(t *testing.T) {
	t.Parallel()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan string, 8)
	l := New(inner, Config{Max: 4, PerIP: 2, Exempt: []netip.Prefix{netip.MustParsePrefix("127.0.0.9/32")},
		Refused: func(reason string) { refused <- reason }})
	got := accepted(t, l)

	a1 := take2(t, l, got, "127.0.0.2")
	take2(t, l, got, "127.0.0.2")
	if st := refusedWith(t, dial(t, l.Addr(), "127.0.0.2")); st != 429 {
		t.Fatalf("third connection from one address: %d, want 429", st)
	}
	// Three from an exempt address: past its cap per address, not past
	// the cap in all until the fifth connection.
	take2(t, l, got, "127.0.0.9")
	take2(t, l, got, "127.0.0.9")
	if st := refusedWith(t, dial(t, l.Addr(), "127.0.0.9")); st != 503 {
		t.Fatalf("fifth connection in all: %d, want 503", st)
	}
	if l.Open() != 4 {
		t.Fatalf("Open() = %d, want 4", l.Open())
	}
	// The server closes one of the first address's: it may open one more.
	a1.Close()
	l.ConnState(a1, fasthttp.StateClosed)
	l.ConnState(a1, fasthttp.StateClosed) // reported twice, counted once
	take2(t, l, got, "127.0.0.2")
	close(refused)
	var reasons []string
	for r := range refused {
		reasons = append(reasons, r)
	}
	if l.Open() != 4 || len(reasons) != 2 || reasons[0] != "per_ip" || reasons[1] != "max" {
		t.Fatalf("Open() = %d, refused %v; want 4 and [per_ip max]", l.Open(), reasons)
	}
}

// take2 dials from an address and returns the server's side of it.
func take2(tb testing.TB, l *Listener, got <-chan net.Conn, from string) net.Conn {
	tb.Helper()
	dial(tb, l.Addr(), from)
	select {
	case c := <-got:
		return c
	case <-time.After(5 * time.Second):
		tb.Fatalf("a connection from %s was not accepted", from)
		return nil
	}
}

// TestCloseEndsAWaitingAccept: Close ends an Accept that waits for
// descriptors as well as one that waits for a connection.
func TestCloseEndsAWaitingAccept(t *testing.T) {
	t.Parallel()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, Config{})
	done := make(chan error, 1)
	go func() { _, err := l.Accept(); done <- err }()
	time.Sleep(50 * time.Millisecond)
	l.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Accept after Close returned a connection")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return after Close")
	}
}
