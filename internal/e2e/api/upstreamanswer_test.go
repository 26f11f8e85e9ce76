package api

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// What the proxy does with an upstream's answer it cannot pass on: headers
// past TOLLGATE_PROXY_MAX_RESPONSE_HEADER_BYTES are a 502 that says the
// answer could not be read, and the request stays counted (the upstream did
// the work); a refund_on_5xx route refunds only an upstream that did not
// answer, or answered 5xx.

// headerUpstream answers /big/N with 200 and a header line of N bytes (name,
// colon, space and value), /fail with 500, and counts the requests of each
// path.
type headerUpstream struct {
	mu   sync.Mutex
	hits map[string]int
	srv  *httptest.Server
}

func newHeaderUpstream(tb testing.TB) *headerUpstream {
	tb.Helper()
	u := &headerUpstream{hits: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.hits[r.URL.Path]++
		u.mu.Unlock()
		if n, ok := strings.CutPrefix(r.URL.Path, "/big/"); ok {
			size, _ := strconv.Atoi(n)
			w.Header().Set("X-Big", strings.Repeat("b", size-len("X-Big: ")))
		}
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusInternalServerError)
		}
		fmt.Fprint(w, "done")
	}))
	tb.Cleanup(u.srv.Close)
	return u
}

func (u *headerUpstream) hitsOf(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[path]
}

// hangUpUpstream reads each request and closes the connection without a
// byte of answer.
func hangUpUpstream(tb testing.TB) string {
	tb.Helper()
	return "http://" + testenv.ServeConns(tb, func(c net.Conn) {
		buf := make([]byte, 4096)
		_, _ = c.Read(buf)
	})
}

// TestUpstreamAnswerHeaders: answers with 4,100 and 60 KiB of headers pass
// whole and stay counted; past the limit (64 KiB by default, or
// TOLLGATE_PROXY_MAX_RESPONSE_HEADER_BYTES) the client gets a 502 that says
// the answer could not be read, the upstream was asked once (never again
// for the same request) and nothing is refunded; an upstream 5xx, a
// refused connection and an upstream that hangs up before answering are
// refunded.
func TestUpstreamAnswerHeaders(t *testing.T) {
	t.Parallel()
	up := newHeaderUpstream(t)
	s := mustStack(t)
	s.writeRoutes(t, `{"method": "*", "path": "/api/h/", "meter": "h", "cost": 1, "upstream": "%[1]s/", "timeout": "5s", "refund_on_5xx": true},
		{"method": "*", "path": "/api/dead/", "meter": "h", "cost": 1, "upstream": "http://127.0.0.1:1/", "timeout": "5s", "refund_on_5xx": true},
		{"method": "*", "path": "/api/hangup/", "meter": "h", "cost": 1, "upstream": "`+hangUpUpstream(t)+`/", "timeout": "5s", "refund_on_5xx": true}`, up.srv.URL)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	_, key := s.tenant(tier.Slug)
	base := s.start()
	small := s.startWith(map[string]string{"TOLLGATE_PROXY_MAX_RESPONSE_HEADER_BYTES": "16384"})

	// probe costs one unit and returns the daily units left after it.
	probe := func() int64 {
		t.Helper()
		r := rawGet(t, base, "/api/h/probe", key)
		if r.status != 200 {
			t.Fatalf("probe: status %d %s", r.status, r.body)
		}
		return remaining(t, r.header)["daily"]
	}
	for _, tc := range []struct {
		api, method, target string
		status              int
		refunded            bool
		detail              string // part of the problem's detail, for an error
	}{
		{base, "GET", "/api/h/big/4100", 200, false, ""},
		{base, "GET", "/api/h/big/61440", 200, false, ""},
		{base, "POST", "/api/h/big/4101", 200, false, ""},
		{small, "GET", "/api/h/big/16000", 200, false, ""},
		{base, "GET", "/api/h/big/70000", 502, false, "could not be read"},
		{base, "POST", "/api/h/big/70001", 502, false, "could not be read"},
		{small, "GET", "/api/h/big/16500", 502, false, "could not be read"},
		{base, "GET", "/api/h/fail", 500, true, ""},
		{base, "GET", "/api/dead/x", 502, true, "could not be reached"},
		{base, "GET", "/api/hangup/x", 502, true, "could not be reached"},
	} {
		before := probe()
		r := raw(t, tc.api, tc.method+" "+tc.target+" HTTP/1.1", "Authorization: Bearer "+key)
		after := probe() + 1 // what the request left
		what := tc.method + " " + tc.target
		if r.status != tc.status {
			t.Errorf("%s: status %d %.300s, want %d", what, r.status, r.body, tc.status)
			continue
		}
		if n, ok := strings.CutPrefix(tc.target, "/api/h/big/"); ok && tc.status == 200 {
			size, _ := strconv.Atoi(n)
			if got := len(r.header.Get("X-Big")) + len("X-Big: "); got != size {
				t.Errorf("%s: the X-Big header line arrived with %d bytes, want %d", what, got, size)
			}
		}
		if tc.detail != "" && (r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.body), tc.detail)) {
			t.Errorf("%s: %q %s, want a problem+json saying %q", what, r.header.Get("Content-Type"), r.body, tc.detail)
		}
		wantLeft, wantHeader := before-1, ""
		if tc.refunded {
			wantLeft, wantHeader = before, "1"
		}
		if got := r.header.Get("Tollgate-Refunded"); got != wantHeader {
			t.Errorf("%s: Tollgate-Refunded %q, want %q", what, got, wantHeader)
		}
		if after != wantLeft {
			t.Errorf("%s: daily units left %d after it, %d before; want %d", what, after, before, wantLeft)
		}
		if path, ok := strings.CutPrefix(tc.target, "/api/h/"); ok {
			path = "/" + path
			if got := up.hitsOf(path); got != 1 {
				t.Errorf("%s: the upstream got the request %d times, want once", what, got)
			}
		}
	}
}
