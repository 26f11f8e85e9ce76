package httpx

import (
	"bytes"
	"crypto/subtle"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/utils"

	"github.com/tollgate/tollgate/internal/locallimit"
	"github.com/tollgate/tollgate/internal/quota"
)

// Bearer returns the token of an Authorization header value, or "" when it
// is not a Bearer one.
func Bearer(authorization string) string {
	scheme, tok, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// ClientIP returns the address of the client that sent the request, the one
// every per-client decision (failed-attempt limits) and the X-Forwarded-For
// sent upstream use: the connection's peer, or, when the peer is a trusted
// proxy (TOLLGATE_TRUSTED_PROXIES), the right-most X-Forwarded-For address
// that is not a trusted proxy itself. Each proxy appends the address it got
// the request from, so everything left of that one was written by the client
// and is never believed. Fiber's c.IP() with a ProxyHeader would take the
// left-most address of the list: the client's choice.
func (g *Guard) ClientIP(c *fiber.Ctx) netip.Addr {
	peer := peerAddr(c)
	if len(g.trusted) == 0 {
		return peer
	}
	return ForwardedClient(peer, c.Request().Header.PeekAll(fiber.HeaderXForwardedFor), g.trusted)
}

// peerAddr is the address of the connection's other end.
func peerAddr(c *fiber.Ctx) netip.Addr {
	if a, ok := c.Context().RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// FromProxy reports whether the request came from a trusted proxy
// (TOLLGATE_TRUSTED_PROXIES): the one decision of whether its
// X-Forwarded-Host and X-Forwarded-Proto count. The app's Fiber config
// trusts no proxy, so that Fiber's own c.Hostname(), c.Protocol() and
// c.IP() never believe these headers: read them through the Guard.
func (g *Guard) FromProxy(c *fiber.Ctx) bool {
	return len(g.trusted) > 0 && isTrusted(peerAddr(c), g.trusted)
}

// Scheme returns the scheme the client used: "https" over TLS, or when a
// trusted proxy says so in X-Forwarded-Proto; else "http".
func (g *Guard) Scheme(c *fiber.Ctx) string {
	if c.Context().IsTLS() {
		return "https"
	}
	if g.FromProxy(c) && bytes.EqualFold(lastForwarded(c, fiber.HeaderXForwardedProto), []byte("https")) {
		return "https"
	}
	return "http"
}

// Host returns the host (with its port, if any) the client asked for: the
// X-Forwarded-Host of a trusted proxy, else the request's Host.
func (g *Guard) Host(c *fiber.Ctx) string { return string(g.HostBytes(c)) }

// HostBytes is Host without a copy: valid only within the handler, until
// the request's headers change.
func (g *Guard) HostBytes(c *fiber.Ctx) []byte {
	if g.FromProxy(c) {
		if h := lastForwarded(c, fiber.HeaderXForwardedHost); len(h) > 0 {
			return h
		}
	}
	return c.Request().URI().Host()
}

// lastForwarded returns the right-most value of the header's lines: the
// one the nearest proxy wrote, whether it replaced the header or appended
// to it. Anything left of it may have come from the client.
func lastForwarded(c *fiber.Ctx, name string) []byte {
	lines := c.Request().Header.PeekAll(name)
	if len(lines) == 0 {
		return nil
	}
	v := lines[len(lines)-1]
	if i := bytes.LastIndexByte(v, ','); i >= 0 {
		v = v[i+1:]
	}
	return bytes.TrimSpace(v)
}

// ForwardedClient walks the X-Forwarded-For header lines xff from the right,
// starting at the connection's peer, past the trusted proxies, and returns
// the first address that is not one. An entry that is not an address means a
// trusted proxy passed on what it was sent without appending to it: the
// client is then the last trusted hop as far as anyone can tell, never an
// address the client wrote.
func ForwardedClient(peer netip.Addr, xff [][]byte, trusted []netip.Prefix) netip.Addr {
	hop := peer.Unmap()
	if !isTrusted(hop, trusted) {
		return hop
	}
	for i := len(xff) - 1; i >= 0; i-- {
		list := xff[i]
		for {
			j := bytes.LastIndexByte(list, ',')
			a, ok := forwardedAddr(bytes.TrimSpace(list[j+1:]))
			if !ok {
				return hop
			}
			if !isTrusted(a, trusted) {
				return a
			}
			hop = a
			if j < 0 {
				break
			}
			list = list[:j]
		}
	}
	return hop
}

// forwardedAddr parses one X-Forwarded-For entry: an address, with or
// without a port ("192.0.2.1:4711", "[2001:db8::1]:4711"), as some proxies
// write them.
func forwardedAddr(b []byte) (netip.Addr, bool) {
	// No copy: s does not outlive the call (the parse errors holding it are
	// dropped, and an Addr keeps none of it), and this runs on every
	// request from a trusted proxy.
	s := utils.UnsafeString(b)
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, perr := netip.ParseAddrPort(s)
		if perr != nil {
			if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
				return netip.Addr{}, false
			}
			if a, err = netip.ParseAddr(s[1 : len(s)-1]); err != nil {
				return netip.Addr{}, false
			}
		} else {
			a = ap.Addr()
		}
	}
	if a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Failures limits failed attempts to authenticate per client address,
// in process: 20 at once, then one every 3 seconds (a locallimit.Keyed GCRA
// table). Each realm (API keys, the admin token, the service token) has its
// own, so that failing in one locks nothing in another. An IPv6 client
// counts by its /64, which one host usually holds whole and could otherwise
// rotate through.
type Failures struct {
	mu  sync.Mutex
	tat locallimit.Keyed[netip.Prefix]
	now func() time.Time
}

const (
	authFailureBurst    = 20
	authFailureInterval = 3 * time.Second
	// authFailureMaxAddrs bounds the memory of an address spray; entries
	// whose failures have drained are dropped first.
	authFailureMaxAddrs = 100_000
)

var authFailureRule = locallimit.Rule{Burst: authFailureBurst, Interval: authFailureInterval, MaxKeys: authFailureMaxAddrs}

// NewFailures returns an empty Failures on the clock now; it is safe for
// concurrent use.
func NewFailures(now func() time.Time) *Failures {
	return &Failures{tat: locallimit.Keyed[netip.Prefix]{}, now: now}
}

func failureKey(ip netip.Addr) netip.Prefix {
	if ip.Is4() {
		return netip.PrefixFrom(ip, 32)
	}
	p, _ := ip.Prefix(64) // the zero Prefix for an invalid address: one key for all of those
	return p
}

// blocked reports whether ip has used up its failures, and for how long.
func (a *Failures) blocked(ip netip.Addr) (time.Duration, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waitLocked(failureKey(ip), a.now())
}

func (a *Failures) waitLocked(k netip.Prefix, now time.Time) (time.Duration, bool) {
	return a.tat.Wait(authFailureRule, k, now)
}

// fail counts a failed attempt from ip, unless ip has used up its failures
// already; then it reports so, and for how long, and counts nothing.
func (a *Failures) fail(ip netip.Addr) (time.Duration, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tat.Take(authFailureRule, failureKey(ip), a.now())
}

// TooManyFailures is the answer to an address that has used up its failed
// attempts: 429 with Retry-After.
func TooManyFailures(c *fiber.Ctx, wait time.Duration, what string) error {
	c.Set(fiber.HeaderRetryAfter, strconv.FormatInt(quota.CeilSeconds(wait), 10))
	return &quota.Error{Code: quota.CodeTooMany, Message: "too many failed " + what + " from this address; retry later"}
}

// KeyFailed counts a failed API key (or dashboard sign-in) from the
// request's address and returns the 429 to answer once the address has used
// up its failures, else nil. Only failures are counted and refused: a valid
// key authenticates from any address, so that clients sharing an address
// (behind one NAT or proxy) are not locked out by one of them. Keys have 238
// random bits, so telling a right key from a wrong one helps no guesser; the
// 429 and its Retry-After tell a misconfigured client to back off. The key
// is looked up before it is known to fail, so a limited address's unknown
// keys still cost a cache miss each.
func (g *Guard) KeyFailed(c *fiber.Ctx, what string) error {
	g.onFailure()
	if wait, blocked := g.Keys.fail(g.ClientIP(c)); blocked {
		return TooManyFailures(c, wait, what)
	}
	return nil
}

// TokenIs compares a presented admin or service token with want in constant
// time, counting failures per address in fails (an empty want refuses
// everything). Unlike API keys, an address that has used up its failures is
// refused before the comparison, even with the right token: these are fixed
// secrets that may be short enough to guess, and a limit that still told a
// right guess from a wrong one would not slow guessing at all. Only the
// limited address is refused; the token works from any other.
func (g *Guard) TokenIs(c *fiber.Ctx, fails *Failures, got, want, what string) (bool, error) {
	ip := g.ClientIP(c)
	if wait, blocked := fails.blocked(ip); blocked {
		return false, TooManyFailures(c, wait, what)
	}
	if want == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		fails.fail(ip)
		g.onFailure()
		return false, nil
	}
	return true, nil
}

// BearerAuth checks the request's Bearer token with TokenIs and answers 401
// with a challenge for realm when it is wrong.
func (g *Guard) BearerAuth(c *fiber.Ctx, fails *Failures, want, realm, what string) error {
	ok, err := g.TokenIs(c, fails, Bearer(c.Get(fiber.HeaderAuthorization)), want, what+"s")
	if err != nil || ok {
		return err
	}
	c.Set(fiber.HeaderWWWAuthenticate, `Bearer realm="`+realm+`"`)
	return quota.Errorf(quota.CodeUnauthorized, "the %s is required", what)
}

// Guard counts failed attempts to authenticate, per client address and
// realm, for every part of the HTTP layer: API keys (the metered routes, /v1
// and the dashboard's sign-in), the admin token (the admin API and the
// console's sign-in) and the service token (/v1/check).
type Guard struct {
	Keys, Admin, Service *Failures

	trusted   []netip.Prefix
	onFailure func()
}

// NewGuard returns a Guard that believes X-Forwarded-For only from the
// trusted proxies, calling onFailure on every failed attempt (metrics).
func NewGuard(trusted []netip.Prefix, now func() time.Time, onFailure func()) *Guard {
	if onFailure == nil {
		onFailure = func() {}
	}
	return &Guard{Keys: NewFailures(now), Admin: NewFailures(now), Service: NewFailures(now),
		trusted: trusted, onFailure: onFailure}
}
