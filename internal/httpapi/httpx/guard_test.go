package httpx

import (
	"bytes"
	"net/netip"
	"testing"
	"time"
)

func lines(ls ...string) [][]byte {
	var out [][]byte
	for _, l := range ls {
		out = append(out, []byte(l))
	}
	return out
}

// TestForwardedClient: the client is the right-most X-Forwarded-For address
// that is not a trusted proxy, and only a trusted peer's header is read.
func TestForwardedClient(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("fd00::/8")}
	for _, tc := range []struct {
		name, peer string
		xff        [][]byte
		want       string
	}{
		{"untrusted peer, header ignored", "198.51.100.1", lines("203.0.113.9"), "198.51.100.1"},
		{"untrusted mapped peer", "::ffff:198.51.100.1", lines("203.0.113.9"), "198.51.100.1"},
		{"trusted peer, no header", "127.0.0.1", nil, "127.0.0.1"},
		{"one proxy", "127.0.0.1", lines("203.0.113.9"), "203.0.113.9"},
		{"client prepends", "127.0.0.1", lines("1.1.1.1, 2.2.2.2,203.0.113.9"), "203.0.113.9"},
		{"two proxies", "127.0.0.1", lines("198.51.100.7, 203.0.113.9, 10.1.1.1"), "203.0.113.9"},
		{"header lines, last one counts first", "127.0.0.1", lines("1.1.1.1", "203.0.113.9", "10.2.2.2"), "203.0.113.9"},
		{"ports and brackets", "127.0.0.1", lines("[2001:db8::1]:4711, 10.0.0.3:80"), "2001:db8::1"},
		{"bracketed IPv6 without port", "127.0.0.1", lines("[2001:db8::2]"), "2001:db8::2"},
		{"mapped entry", "127.0.0.1", lines("::ffff:203.0.113.9"), "203.0.113.9"},
		{"IPv6 proxy", "fd00::5", lines("2001:db8::3, fd00::6"), "2001:db8::3"},
		{"garbage is never passed", "127.0.0.1", lines("203.0.113.9, 10.0.0.4, unknown"), "127.0.0.1"},
		{"garbage: the last trusted hop", "127.0.0.1", lines("203.0.113.9, unknown, 10.0.0.4"), "10.0.0.4"},
		{"empty entry stops", "127.0.0.1", lines("203.0.113.9,"), "127.0.0.1"},
		{"empty line stops", "127.0.0.1", lines("203.0.113.9", ""), "127.0.0.1"},
		{"zone refused", "127.0.0.1", lines("fe80::1%eth0"), "127.0.0.1"},
		{"all trusted: the farthest", "127.0.0.1", lines("10.0.0.1, 10.0.0.2"), "10.0.0.1"},
	} {
		got := ForwardedClient(netip.MustParseAddr(tc.peer), tc.xff, trusted)
		if got.String() != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
}

// FuzzForwardedClient: whatever a client writes left of what the trusted
// proxy appended, the client is what the proxy appended; and the answer is
// always a plain address (unmapped, no zone).
func FuzzForwardedClient(f *testing.F) {
	for _, seed := range []string{"", "1.2.3.4", "a, b, c", "[::1]:80, 10.0.0.1", "\xff,,", "127.0.0.1, ::ffff:10.0.0.1"} {
		f.Add([]byte(seed), []byte{203, 0, 113, 9})
	}
	trusted := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}
	peer := netip.MustParseAddr("127.0.0.1")
	f.Fuzz(func(t *testing.T, written, appended []byte) {
		if a := ForwardedClient(peer, [][]byte{written}, trusted); !a.IsValid() || a.Is4In6() || a.Zone() != "" {
			t.Fatalf("ForwardedClient(%q) = %v, want a plain address", written, a)
		}
		if len(appended) < 4 {
			return
		}
		client := netip.AddrFrom4([4]byte(appended[:4]))
		if isTrusted(client, trusted) {
			return
		}
		for _, xff := range [][][]byte{
			{bytes.Join([][]byte{written, []byte(client.String())}, []byte(", "))},
			{written, []byte(client.String())},
			{written, []byte(client.String() + ", 10.9.8.7")},
		} {
			if got := ForwardedClient(peer, xff, trusted); got != client {
				t.Fatalf("X-Forwarded-For %q: got %v, want %v", xff, got, client)
			}
		}
	})
}

// TestAuthFailures: 20 failures at once, then one every 3 seconds; an IPv6
// client counts by its /64.
func TestAuthFailures(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	a := NewFailures(func() time.Time { return now })
	ip := netip.MustParseAddr("203.0.113.9")
	for i := range authFailureBurst {
		if wait, blocked := a.fail(ip); blocked {
			t.Fatalf("failure %d: blocked for %s, want counted", i, wait)
		}
	}
	if wait, blocked := a.fail(ip); !blocked || wait != authFailureInterval {
		t.Fatalf("failure 21: got %s, %t, want blocked for %s", wait, blocked, authFailureInterval)
	}
	if _, blocked := a.blocked(netip.MustParseAddr("203.0.113.10")); blocked {
		t.Error("another address is blocked")
	}
	now = now.Add(authFailureInterval)
	if _, blocked := a.fail(ip); blocked {
		t.Error("one interval later: blocked, want one more failure allowed")
	}
	if _, blocked := a.blocked(ip); !blocked {
		t.Error("after that failure: not blocked")
	}

	v6 := netip.MustParseAddr("2001:db8:1:2::1")
	for range authFailureBurst {
		a.fail(v6)
	}
	if _, blocked := a.blocked(netip.MustParseAddr("2001:db8:1:2:ffff::9")); !blocked {
		t.Error("another address of the same /64: not blocked")
	}
	if _, blocked := a.blocked(netip.MustParseAddr("2001:db8:1:3::1")); blocked {
		t.Error("an address of another /64: blocked")
	}
}

// TestAuthFailuresForget: past its bound, the limiter drops the addresses
// whose failures have drained, and keeps those still blocked.
func TestAuthFailuresForget(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	a := NewFailures(func() time.Time { return now })
	for i := range authFailureMaxAddrs - 1 {
		a.fail(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
	}
	now = now.Add(authFailureInterval) // those single failures have drained
	blocked := netip.MustParseAddr("198.51.100.1")
	for range authFailureBurst {
		a.fail(blocked)
	}
	a.fail(netip.MustParseAddr("203.0.113.1"))
	if n := len(a.tat); n != 2 {
		t.Errorf("got %d addresses kept, want 2", n)
	}
	if _, ok := a.blocked(blocked); !ok {
		t.Error("the blocked address was forgotten")
	}
}
