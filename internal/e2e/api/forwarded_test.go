package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// rawSignIn signs in to the console through its form with requests written
// by hand (raw: Host tollgate.test), the sign-in POST carrying headers: it
// fetches the form and its double-submit cookie, then posts the admin token.
func rawSignIn(tb testing.TB, base string, headers ...string) reply {
	tb.Helper()
	form := raw(tb, base, "GET /console/login HTTP/1.1")
	m := regexp.MustCompile(`name="_csrf" value="([^"]+)"`).FindSubmatch(form.body)
	var cookie string
	for _, ck := range (&http.Response{Header: form.header}).Cookies() {
		if ck.Name == "tg_login" {
			cookie = ck.Value
		}
	}
	if form.status != 200 || m == nil || cookie == "" {
		tb.Fatalf("sign-in form: %d, token %q, cookie %q", form.status, m, cookie)
	}
	body := url.Values{"_csrf": {string(m[1])}, "token": {adminToken}}.Encode()
	lines := append([]string{"POST /console/login HTTP/1.1", "Content-Type: application/x-www-form-urlencoded",
		"Cookie: tg_login=" + cookie}, headers...)
	return raw(tb, base, append(lines, "", body)...)
}

// sessionCookie returns the Set-Cookie line of the console's session in r,
// or "".
func sessionCookie(r reply) string {
	for _, line := range r.header.Values("Set-Cookie") {
		if strings.HasPrefix(line, "tg_console=") {
			return line
		}
	}
	return ""
}

// TestForwardedHostAndProtoOnlyFromTrustedProxies: X-Forwarded-Host and
// X-Forwarded-Proto count only when the connection comes from a proxy of
// TOLLGATE_TRUSTED_PROXIES, as X-Forwarded-For does: from anyone else they
// neither pass the sign-in's origin check nor make its cookie Secure. From
// a trusted proxy, the value the proxy wrote (the right-most) counts.
func TestForwardedHostAndProtoOnlyFromTrustedProxies(t *testing.T) {
	t.Parallel()
	untrusted := mustStack(t).start()
	trusted := mustStack(t).startWith(map[string]string{"TOLLGATE_TRUSTED_PROXIES": "127.0.0.1, ::1"})
	for _, tc := range []struct {
		name    string
		base    string
		headers []string
		want    int  // 303 signed in, 403 refused as cross-origin
		secure  bool // the session cookie is Secure
	}{
		{"untrusted: same origin", untrusted, []string{"Origin: http://tollgate.test"}, 303, false},
		{"untrusted: other origin", untrusted, []string{"Origin: https://evil.example"}, 403, false},
		{"untrusted: other origin with its X-Forwarded-Host", untrusted,
			[]string{"Origin: https://evil.example", "X-Forwarded-Host: evil.example"}, 403, false},
		{"untrusted: X-Forwarded-Proto https over plain HTTP", untrusted,
			[]string{"Origin: http://tollgate.test", "X-Forwarded-Proto: https"}, 303, false},
		{"trusted: the proxy's host", trusted,
			[]string{"Origin: https://app.example", "X-Forwarded-Host: app.example", "X-Forwarded-Proto: https"}, 303, true},
		{"trusted: another origin than the proxy's host", trusted,
			[]string{"Origin: https://evil.example", "X-Forwarded-Host: app.example", "X-Forwarded-Proto: https"}, 403, false},
		{"trusted: the client's host left of the proxy's", trusted,
			[]string{"Origin: https://evil.example", "X-Forwarded-Host: evil.example, app.example"}, 403, false},
		{"trusted: the client's host on a line before the proxy's", trusted,
			[]string{"Origin: https://evil.example", "X-Forwarded-Host: evil.example", "X-Forwarded-Host: app.example"}, 403, false},
		{"trusted: the client's scheme left of the proxy's", trusted,
			[]string{"Origin: http://tollgate.test", "X-Forwarded-Proto: https, http"}, 303, false},
		{"trusted: no forwarded headers", trusted, []string{"Origin: http://tollgate.test"}, 303, false},
	} {
		r := rawSignIn(t, tc.base, tc.headers...)
		ck := sessionCookie(r)
		if r.status != tc.want {
			t.Errorf("%s: %d (Set-Cookie %q), want %d: %s", tc.name, r.status, ck, tc.want, r.body)
			continue
		}
		if tc.want != 303 {
			if ck != "" {
				t.Errorf("%s: refused but sets a session cookie %q", tc.name, ck)
			}
			continue
		}
		if secure := strings.Contains(strings.ToLower(ck), "; secure"); ck == "" || secure != tc.secure {
			t.Errorf("%s: session cookie %q, want Secure %v", tc.name, ck, tc.secure)
		}
	}
}

// headerRecorder is an upstream that answers 200 and keeps the headers of
// the last request it received.
type headerRecorder struct {
	mu   sync.Mutex
	last http.Header
}

func (h *headerRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.last = r.Header.Clone()
	h.mu.Unlock()
	fmt.Fprint(w, `{"ok": true}`)
}

func (h *headerRecorder) take() http.Header {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.last
	h.last = nil
	return out
}

// TestUpstreamGetsOnlyForwardedHeadersTollgateBelieves: the upstream of a
// proxied route trusts Tollgate as its proxy, so the X-Forwarded-Host and
// X-Forwarded-Proto it gets are Tollgate's own: the Host and scheme of the
// request, or those a trusted proxy in front said; what a client wrote in
// them, in Forwarded, X-Real-IP or other spellings of the scheme is not
// passed on.
func TestUpstreamGetsOnlyForwardedHeadersTollgateBelieves(t *testing.T) {
	t.Parallel()
	rec := &headerRecorder{}
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	s := mustStack(t)
	s.upstreamRoutes(t, up.URL)
	tier := s.tier(12, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	_, key := s.tenant(tier.Slug)
	untrusted := s.start()
	trusted := s.startWith(map[string]string{"TOLLGATE_TRUSTED_PROXIES": "127.0.0.1, ::1"})
	spoofed := []string{"X-Forwarded-Host: evil.example", "X-Forwarded-Proto: https", "Forwarded: for=6.6.6.6;host=evil.example;proto=https",
		"X-Real-IP: 6.6.6.6", "X-Forwarded-Ssl: on", "X-Url-Scheme: https", "X-Forwarded-Protocol: https", "X_Forwarded_Host: evil.example"}
	for _, tc := range []struct {
		name        string
		base        string
		headers     []string
		host, proto string
	}{
		{"untrusted, nothing forwarded", untrusted, nil, "tollgate.test", "http"},
		{"untrusted, spoofed", untrusted, spoofed, "tollgate.test", "http"},
		{"trusted proxy", trusted, append(append([]string{}, spoofed...), "X-Forwarded-Host: app.example", "X-Forwarded-Proto: https"),
			"app.example", "https"},
	} {
		lines := append([]string{"GET /api/up/x HTTP/1.1", "Authorization: Bearer " + key}, tc.headers...)
		if r := raw(t, tc.base, lines...); r.status != 200 {
			t.Fatalf("%s: %d: %s", tc.name, r.status, r.body)
		}
		h := rec.take()
		if got := h.Values("X-Forwarded-Host"); len(got) != 1 || got[0] != tc.host {
			t.Errorf("%s: upstream X-Forwarded-Host %q, want %q", tc.name, got, tc.host)
		}
		if got := h.Values("X-Forwarded-Proto"); len(got) != 1 || got[0] != tc.proto {
			t.Errorf("%s: upstream X-Forwarded-Proto %q, want %q", tc.name, got, tc.proto)
		}
		for _, name := range []string{"Forwarded", "X-Real-Ip", "X-Forwarded-Ssl", "X-Url-Scheme", "X-Forwarded-Protocol", "X_forwarded_host"} {
			if v, ok := h[name]; ok {
				t.Errorf("%s: upstream got the client's %s: %q", tc.name, name, v)
			}
		}
		if got := h.Get("X-Forwarded-For"); got != "127.0.0.1" {
			t.Errorf("%s: upstream X-Forwarded-For %q, want 127.0.0.1", tc.name, got)
		}
	}
}
