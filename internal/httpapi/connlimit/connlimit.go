// Package connlimit is the api's listener: it caps the client connections
// open at once, in all and from one client address, and keeps accepting
// through a shortage of file descriptors, where fasthttp's server would
// stop serving for good (it takes EMFILE for a permanent accept error).
//
// It owns the connections' count and the short answer a refused connection
// gets, nothing of HTTP beyond it: the server reads and times out requests
// (fasthttp's ReadTimeout and IdleTimeout), and tells the listener when a
// connection it served is closed (ConnState). Accepted connections are
// handed to the server as they are (*net.TCPConn), not wrapped, so that
// the handlers may still reach the socket.
package connlimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Config is what the listener caps.
type Config struct {
	// Max is the number of connections open at once; past it a new one is
	// answered 503 and closed. 0: no cap.
	Max int
	// PerIP is the number of connections open at once from one client
	// address (an IPv6 client by its /64, which any one of them holds
	// whole); past it a new one is answered 429 and closed. 0: no cap.
	PerIP int
	// Exempt are the peers not capped per address: the trusted proxies in
	// front of the api, whose connections carry many clients.
	Exempt []netip.Prefix
	// Log takes the warnings (out of file descriptors, connections
	// refused), at most one a minute of each kind.
	Log *slog.Logger
	// Refused counts a refused connection, by reason ("max", "per_ip"); nil:
	// not counted.
	Refused func(reason string)
}

// Listener is a net.Listener that caps connections; see the package doc.
// Install its ConnState as the server's (fasthttp.Server.ConnState), or the
// connections it counts are never released.
type Listener struct {
	net.Listener
	cfg     Config
	refusal map[string][]byte // the answer to a refused connection, by reason

	mu    sync.Mutex
	open  int
	perIP map[netip.Prefix]int
	// conns are the connections counted, with the key of their address
	// (the zero prefix: exempt, counted in open only).
	conns map[net.Conn]netip.Prefix

	closed    chan struct{}
	closeOnce sync.Once
	warned    map[string]time.Time // last warning of each kind
}

// New wraps ln.
func New(ln net.Listener, cfg Config) *Listener {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Listener{
		Listener: ln, cfg: cfg,
		refusal: map[string][]byte{
			"max": answer(503, "Service Unavailable",
				"this server holds as many connections as it takes; retry in a moment", "Retry-After: 1\r\n"),
			"per_ip": answer(429, "Too Many Requests",
				"your address holds as many connections to this server as it takes from one address; reuse them or close some", ""),
		},
		perIP:  map[netip.Prefix]int{},
		conns:  map[net.Conn]netip.Prefix{},
		closed: make(chan struct{}),
		warned: map[string]time.Time{},
	}
}

// answer is a whole HTTP answer with a problem+json body, the connection
// closed after it.
func answer(status int, title, detail, extra string) []byte {
	body := fmt.Sprintf(`{"detail":%q,"status":%d,"title":%q,"type":"about:blank"}`, detail, status, title)
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/problem+json\r\n%sConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		status, title, extra, len(body), body)
}

// maxBackoff bounds the wait between two accepts that found no descriptor.
const maxBackoff = time.Second

// Accept returns the next connection within the caps. A connection past
// them is answered and closed here. When the process (or the system) is
// out of file descriptors, Accept waits, 5 ms at first, doubling up to a
// second, and tries again: the connections waiting meanwhile stay in the
// kernel's queue, and are accepted once the server has closed some (every
// connection ends by its read or idle timeout at the latest).
func (l *Listener) Accept() (net.Conn, error) {
	var wait time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !outOfResources(err) {
				return nil, err
			}
			wait = min(max(2*wait, 5*time.Millisecond), maxBackoff)
			l.warn("accept", "accepting a connection failed; waiting before the next try", "err", err, "wait", wait.String())
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-l.closed:
				t.Stop()
				return nil, net.ErrClosed
			}
			continue
		}
		wait = 0
		if reason := l.admit(c); reason != "" {
			l.refuse(c, reason)
			continue
		}
		return c, nil
	}
}

// outOfResources reports an accept error that passes: the process or the
// system has no descriptor, buffer or memory for one more connection now.
func outOfResources(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// admit counts c in, or returns why it is refused.
func (l *Listener) admit(c net.Conn) string {
	key, exempt := l.keyOf(c)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cfg.Max > 0 && l.open >= l.cfg.Max {
		return "max"
	}
	if !exempt {
		if l.cfg.PerIP > 0 && l.perIP[key] >= l.cfg.PerIP {
			return "per_ip"
		}
		l.perIP[key]++
	}
	l.open++
	l.conns[c] = key
	return ""
}

// keyOf is the key c's address is counted under, and whether it is exempt
// from the cap per address. A connection whose address is not an IP one
// (not TCP) is exempt.
func (l *Listener) keyOf(c net.Conn) (netip.Prefix, bool) {
	tcp, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.Prefix{}, true
	}
	addr := tcp.AddrPort().Addr().Unmap()
	for _, p := range l.cfg.Exempt {
		if p.Contains(addr) {
			return netip.Prefix{}, true
		}
	}
	return Key(addr), false
}

// Key is the prefix an address is counted under: an IPv4 address alone, an
// IPv6 one by its /64.
func Key(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	bits := 32
	if addr.Is6() {
		bits = 64
	}
	p, _ := addr.WithZone("").Prefix(bits)
	return p
}

// refuse answers c and closes it. The answer is a few hundred bytes on a
// connection just opened: the socket's buffer takes it at once, and the
// deadline only guards against the impossible.
func (l *Listener) refuse(c net.Conn, reason string) {
	if l.cfg.Refused != nil {
		l.cfg.Refused(reason)
	}
	l.warn("refused_"+reason, "refusing connections past a cap", "reason", reason, "max", l.cfg.Max, "per_ip", l.cfg.PerIP,
		"addr", c.RemoteAddr().String())
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(l.refusal[reason])
	_ = c.Close()
}

// ConnState is the server's connection hook (fasthttp.Server.ConnState): a
// connection the server closed, or took over, leaves the count.
func (l *Listener) ConnState(c net.Conn, state fasthttp.ConnState) {
	if state != fasthttp.StateClosed && state != fasthttp.StateHijacked {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	key, ok := l.conns[c]
	if !ok {
		return // not one of ours (fasthttp's ServeConn, in tests)
	}
	delete(l.conns, c)
	l.open--
	if key.IsValid() {
		if l.perIP[key]--; l.perIP[key] <= 0 {
			delete(l.perIP, key)
		}
	}
}

// Open returns the number of connections counted open.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Close closes the listener and ends an Accept waiting for descriptors.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// warn logs msg at most once a minute for each kind.
func (l *Listener) warn(kind, msg string, args ...any) {
	l.mu.Lock()
	last := l.warned[kind]
	now := time.Now()
	due := now.Sub(last) >= time.Minute
	if due {
		l.warned[kind] = now
	}
	l.mu.Unlock()
	if due {
		l.cfg.Log.Warn(msg, args...)
	}
}

// DefaultMax is the cap on connections when none is configured: 10,000, or
// half the process's limit on open files when that is lower, since every
// client connection may hold one to an upstream as well, and Redis and
// Postgres need theirs.
func DefaultMax() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur == 0 {
		return 10000
	}
	return int(min(10000, max(lim.Cur/2, 1)))
}
