package api

import (
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Request bodies cost the api memory only once their sender is known: a
// metered route reads the body after the key, the admin API after the
// token, /v1/check after the service token, the signed-in pages after the
// session; before that the api holds the few kilobytes fasthttp reads
// ahead, whatever length a request announces.

// TestBodiesBeforeAuthenticationHoldNoMemory runs the api as a process of
// its own and opens 3,000 connections that each announce a body of 1 MiB
// (the body limit) and send one byte of it, with no valid key, token or
// session, to a metered route, the admin API, /v1/check and the sign-in
// form. While they are open the api's resident memory stays within
// 100 MiB of what it was before, and after they close within 150 MiB (five
// times that under the race detector); a server that reserves the
// announced length holds gigabytes. A tenant's own 1 MiB
// body is still taken whole.
func TestBodiesBeforeAuthenticationHoldNoMemory(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc to read the api's memory from")
	}
	up := newSeeingUpstream(t, nil)
	s := mustStack(t)
	s.writeRoutes(t, `{"method": "*", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": "%[1]s/"}`, up.srv.URL)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	_, key := s.tenant(tier.Slug)
	pid, base := startAPIProcess(t, s.env(map[string]string{
		"TOLLGATE_BODY_LIMIT": "1048576", "TOLLGATE_MAX_CONNS": "5000", "TOLLGATE_MAX_CONNS_PER_IP": "0"}))
	whole := strings.Repeat("x", 1<<20)
	if r := raw(t, base, "POST /api/up/warm HTTP/1.1", "Authorization: Bearer "+key, "", whole); r.status != 200 {
		t.Fatalf("warm-up: %d %.200s", r.status, r.body)
	}
	time.Sleep(500 * time.Millisecond)
	before := memKB(t, pid, "VmRSS")

	targets := []string{
		"POST /api/up/x HTTP/1.1\r\nAuthorization: Bearer " + badKey(1),
		"POST /api/up/x HTTP/1.1",
		"POST /admin/v1/tiers HTTP/1.1\r\nAuthorization: Bearer not-the-admin-token",
		"POST /v1/check HTTP/1.1\r\nAuthorization: Bearer not-the-service-token",
		"POST /dashboard/login HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded",
		"POST /console/tiers HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded",
	}
	const n = 3000
	conns := make([]net.Conn, 0, n)
	for i := range n {
		c := dialFrom(t, base, fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250))
		head := targets[i%len(targets)] + "\r\nHost: t\r\nContent-Length: 1048576\r\n\r\n{"
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	peak := before
	for range 12 {
		time.Sleep(250 * time.Millisecond)
		peak = max(peak, memKB(t, pid, "VmRSS"))
	}
	for _, c := range conns {
		c.Close()
	}
	time.Sleep(2 * time.Second)
	after := memKB(t, pid, "VmRSS")
	t.Logf("the api's resident memory: %d MiB before, %d MiB with %d connections announcing 1 MiB, %d MiB after they closed",
		before>>10, peak>>10, n, after>>10)
	if growth := peak - before; growth > memFactor*100<<10 {
		t.Errorf("with %d connections announcing 1 MiB bodies before authentication, the api's resident memory grew %d MiB (from %d MiB), want under %d MiB",
			n, growth>>10, before>>10, memFactor*100)
	}
	// Closing them runs their handlers (each refuses, 401 or so): the
	// garbage that leaves waits for the next collection, hence the room.
	if growth := after - before; growth > memFactor*150<<10 {
		t.Errorf("after those connections closed, the api's resident memory is %d MiB above the %d MiB before, want under %d MiB",
			growth>>10, before>>10, memFactor*150)
	}
	if r := raw(t, base, "POST /api/up/after HTTP/1.1", "Authorization: Bearer "+key, "", whole); r.status != 200 {
		t.Errorf("a tenant's 1 MiB body after the flood: %d %.200s, want 200", r.status, r.body)
	}
	if got := up.take(); len(got) != 2 {
		t.Errorf("the upstream got %d requests, want the tenant's 2", len(got))
	}
}

// bodyUpstream answers every request with the length and SHA-256 of the
// body it received, and its Content-Length.
func bodyUpstream(tb testing.TB) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d %x %d %q", len(b), sha256.Sum256(b), r.ContentLength, r.TransferEncoding)
	}))
	tb.Cleanup(srv.Close)
	return srv
}

// chunked frames body in chunks of n bytes.
func chunked(body string, n int) string {
	var b strings.Builder
	for len(body) > 0 {
		k := min(n, len(body))
		fmt.Fprintf(&b, "%x\r\n%s\r\n", k, body[:k])
		body = body[k:]
	}
	return b.String() + "0\r\n\r\n"
}

// exchange writes req on a connection of its own and reads every answer
// that comes until the api closes it (or 10 s pass).
func exchange(tb testing.TB, base, req string, halfClose bool) []heard {
	tb.Helper()
	c := dialFrom(tb, base, "127.0.0.1")
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		tb.Fatal(err)
	}
	if halfClose {
		_ = c.(*net.TCPConn).CloseWrite()
	}
	br := bufio.NewReader(c)
	var out []heard
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return out
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out = append(out, heard{status: resp.StatusCode, header: resp.Header, body: string(b)})
	}
}

// TestRequestBodiesReadAfterAuthentication: bodies are read whole after
// the key, token or session, within TOLLGATE_BODY_LIMIT: a chunked body
// past it is 413 once the sender is known (401 before), a long body reaches
// the upstream whole with its Content-Length, one that breaks off is 400
// and one that stalls 408, neither forwarded; and a body left unread (a
// refusal before authentication) closes its connection, so that what
// follows it is never read as a request.
func TestRequestBodiesReadAfterAuthentication(t *testing.T) {
	t.Parallel()
	up := bodyUpstream(t)
	s := mustStack(t)
	s.writeRoutes(t, `{"method": "*", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": "%[1]s/"}`, up.URL)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	_, key := s.tenant(tier.Slug)
	base := s.startWith(map[string]string{"TOLLGATE_BODY_LIMIT": "65536", "TOLLGATE_READ_TIMEOUT": "2s"})

	long := strings.Repeat("0123456789abcdef", 50000/16)
	sum := fmt.Sprintf("%x", sha256.Sum256([]byte(long)))
	for _, framing := range []string{
		"Content-Length: 50000\r\n\r\n" + long,
		"Transfer-Encoding: chunked\r\n\r\n" + chunked(long, 7000),
	} {
		got := exchange(t, base, "POST /api/up/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "+key+"\r\nConnection: close\r\n"+framing, false)
		if len(got) != 1 || got[0].status != 200 || got[0].body != `50000 `+sum+` 50000 []` {
			t.Errorf("a 50,000-byte body (%.40q): %+v, want 200 and the upstream to get it whole, with its length", framing, got)
		}
	}

	past := "Transfer-Encoding: chunked\r\n\r\n" + chunked(strings.Repeat("x", 70000), 10000)
	for _, tc := range []struct {
		what, head string
		want       int
	}{
		{"metered, the tenant's key", "POST /api/up/x HTTP/1.1\r\nAuthorization: Bearer " + key, 413},
		{"metered, no key", "POST /api/up/x HTTP/1.1", 401},
		{"admin, the token", "POST /admin/v1/tiers HTTP/1.1\r\nContent-Type: application/json\r\nAuthorization: Bearer " + adminToken, 413},
		{"admin, a wrong token", "POST /admin/v1/tiers HTTP/1.1\r\nContent-Type: application/json\r\nAuthorization: Bearer " + adminToken + "x", 401},
		{"check, the service token", "POST /v1/check HTTP/1.1\r\nContent-Type: application/json\r\nAuthorization: Bearer " + serviceToken, 413},
	} {
		got := exchange(t, base, tc.head+"\r\nHost: t\r\n"+past, false)
		if len(got) != 1 || got[0].status != tc.want || got[0].header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s, a chunked body of 70,000 bytes past the 65,536 limit: %+v, want one %d problem+json", tc.what, got, tc.want)
		}
	}

	// Past the bytes read ahead of the handler (4 KiB and one), a body
	// holds a request of its own: refused before its body is read, the
	// request closes its connection, and what its body holds is never
	// read as a request.
	body := strings.Repeat("x", 4097) + "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
	got := exchange(t, base, fmt.Sprintf("POST /api/up/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s",
		badKey(7), len(body), body), false)
	if len(got) != 1 || got[0].status != 401 {
		t.Errorf("a refused request with a request in its unread body: %+v, want one 401 and the connection closed", got)
	}

	got = exchange(t, base, "POST /api/up/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "+key+"\r\nContent-Length: 10000\r\n\r\n"+long[:6000], true)
	if len(got) != 1 || got[0].status != 400 || !strings.Contains(got[0].body, "broke off") {
		t.Errorf("a body that breaks off at 6,000 of 10,000 bytes: %+v, want one 400 saying so", got)
	}
	got = exchange(t, base, "POST /api/up/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "+key+"\r\nContent-Length: 10000\r\n\r\n"+long[:6000], false)
	if len(got) != 1 || got[0].status != 408 {
		t.Errorf("a body that stalls at 6,000 of 10,000 bytes past the read timeout: %+v, want one 408", got)
	}
}

// gzipOfZeros is the gzip of n zero bytes: a body of a few hundred KiB
// that inflates to n.
func gzipOfZeros(tb testing.TB, n int) string {
	tb.Helper()
	var b strings.Builder
	zw := gzip.NewWriter(&b)
	zeros := make([]byte, 1<<20)
	for range n >> 20 {
		if _, err := zw.Write(zeros); err != nil {
			tb.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		tb.Fatal(err)
	}
	return b.String()
}

// TestCompressedBodiesAreNotInflated: a body sent with Content-Encoding is
// taken as the bytes it is, within the body limit: a metered route hashes
// those for its Idempotency-Key and forwards them as they came, and the
// routes that read JSON refuse an encoded body (415) rather than inflate
// it. A gzip of 256 MiB of zeros, 256 KiB on the wire, leaves the api's
// resident memory within 64 MiB of what it was.
func TestCompressedBodiesAreNotInflated(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc to read the api's memory from")
	}
	up := bodyUpstream(t)
	s := mustStack(t)
	s.writeRoutes(t, `{"method": "*", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": "%[1]s/"}`, up.URL)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	tenant, key := s.tenant(tier.Slug)
	pid, base := startAPIProcess(t, s.env(map[string]string{"TOLLGATE_BODY_LIMIT": "1048576"}))
	bomb := gzipOfZeros(t, 256<<20)
	if r := rawGet(t, base, "/api/up/warm", key); r.status != 200 {
		t.Fatalf("warm-up: %d %s", r.status, r.body)
	}
	before := memKB(t, pid, "VmRSS")

	r := raw(t, base, "POST /api/up/x HTTP/1.1", "Authorization: Bearer "+key, "Idempotency-Key: bomb-1", "Content-Encoding: gzip", "", bomb)
	if want := fmt.Sprintf("%d %x %d []", len(bomb), sha256.Sum256([]byte(bomb)), len(bomb)); r.status != 200 || string(r.body) != want {
		t.Errorf("a gzip body on a metered route: %d %s, want 200 and the upstream to get it as sent (%s)", r.status, r.body, want)
	}
	for _, tc := range []struct{ what, line, auth string }{
		{"admin", "POST /admin/v1/tiers HTTP/1.1", adminToken},
		{"a key's admin", "POST /admin/v1/tenants/" + tenant.ID + "/keys HTTP/1.1", adminToken},
		{"check", "POST /v1/check HTTP/1.1", serviceToken},
	} {
		r := raw(t, base, tc.line, "Authorization: Bearer "+tc.auth, "Content-Type: application/json", "Content-Encoding: gzip", "", bomb)
		if r.status != 415 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s, a gzip body: %d %.200s, want 415 problem+json", tc.what, r.status, r.body)
		}
	}
	peak := memKB(t, pid, "VmHWM")
	t.Logf("the api's resident memory: %d MiB before, %d MiB at its peak", before>>10, peak>>10)
	if growth := peak - before; growth > memFactor*64<<10 {
		t.Errorf("bodies of 256 KiB that inflate to 256 MiB took the api's resident memory %d MiB above the %d MiB before, want at most %d MiB",
			growth>>10, before>>10, memFactor*64)
	}
}
