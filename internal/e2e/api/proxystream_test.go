package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Answers stream through the proxy: the api holds a bounded part of an
// upstream's answer, whatever its size, keeps the 1 MiB of an idempotent
// answer it stores, and passes on no more than
// TOLLGATE_PROXY_MAX_RESPONSE_BYTES.

// patternByte is byte i of every body bytesUpstream serves: generated, never
// stored, and checkable at any offset.
func patternByte(i int64) byte { return byte(i % 251) }

// bytesUpstream serves generated bodies: /len/N with Content-Length N,
// /chunked/N chunked (flushed every 32 KiB), anything else a short "ok".
func bytesUpstream(tb testing.TB) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		if len(parts) != 2 {
			fmt.Fprint(w, "ok")
			return
		}
		n, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if parts[0] == "len" {
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		if r.Method == http.MethodHead {
			return
		}
		buf := make([]byte, 32<<10)
		for off := int64(0); off < n; {
			m := min(int64(len(buf)), n-off)
			for i := range m {
				buf[i] = patternByte(off + i)
			}
			if _, err := w.Write(buf[:m]); err != nil {
				return // the api hung up
			}
			off += m
			if f, ok := w.(http.Flusher); ok && parts[0] == "chunked" {
				f.Flush()
			}
		}
	}))
	tb.Cleanup(srv.Close)
	return srv
}

// downloadRoutes is a table whose /api/dl/ proxies to upstream, refunding
// an upstream 5xx (not the api's own 502 for an answer too large: the
// upstream answered).
const downloadRoutes = `{"method": "*", "path": "/api/dl/", "meter": "dl", "cost": 1, "upstream": "%[1]s/", "timeout": "2m", "refund_on_5xx": true}`

// downloadStack is a stack with downloadRoutes in front of a bytesUpstream,
// and a tenant's key on a tier of 1000 units a day; start its API.
func downloadStack(tb testing.TB) (*stack, string) {
	tb.Helper()
	up := bytesUpstream(tb)
	s := mustStack(tb)
	s.writeRoutes(tb, downloadRoutes, up.URL)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	_, key := s.tenant(tier.Slug)
	return s, key
}

// startAPIProcess runs the api as a process of its own (this test binary,
// as TestMain lets it) with env, and returns its pid and base URL; it is
// interrupted, then killed, at cleanup.
func startAPIProcess(tb testing.TB, env map[string]string) (int, string) {
	tb.Helper()
	return startAPICommand(tb, exec.Command(os.Args[0]), env)
}

// startAPICommand is startAPIProcess with the command that runs this test
// binary given (through a shell that sets a limit first, say).
func startAPICommand(tb testing.TB, cmd *exec.Cmd, env map[string]string) (int, string) {
	tb.Helper()
	env["TOLLGATE_ADDR"] = "127.0.0.1:0"
	cmd.Env = append(os.Environ(), "TOLLGATE_TEST_RUN_MAIN=1")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan struct{})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addr <- line.Addr
			}
		}
		_ = cmd.Wait()
		close(exited)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	select {
	case a := <-addr:
		return cmd.Process.Pid, "http://" + a
	case <-exited:
		tb.Fatal("the api process ended before listening")
	case <-time.After(30 * time.Second):
		tb.Fatal("the api process did not listen within 30s")
	}
	return 0, ""
}

// memKB reads one memory figure (VmRSS, VmHWM) of a process, in KiB.
func memKB(tb testing.TB, pid int, field string) int64 {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return n
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// slowDownload GETs target with key and reads the first want bytes of the
// answer's body in small reads, pausing between them, checking each byte
// against the pattern; then it hangs up. It returns the status and what
// went wrong, if anything.
func slowDownload(base, target, key string, want int64) (int, error) {
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(90 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: tollgate.test\r\nAuthorization: Bearer %s\r\n\r\n", target, key); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 4096), nil)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 8<<10)
	for got := int64(0); got < want; {
		n, err := resp.Body.Read(buf[:min(int64(len(buf)), want-got)])
		for i := range int64(n) {
			if buf[i] != patternByte(got+i) {
				return resp.StatusCode, fmt.Errorf("byte %d is %d, want %d", got+i, buf[i], patternByte(got+i))
			}
		}
		got += int64(n)
		if err != nil && got < want {
			return resp.StatusCode, fmt.Errorf("after %d bytes: %w", got, err)
		}
		time.Sleep(time.Millisecond)
	}
	return resp.StatusCode, nil
}

// TestProxyStreamsLargeAnswers runs the api as a process of its own and has
// three slow clients download 256 MiB answers from a real upstream (two of
// known length, one chunked), reading 16 MiB each in 8 KiB steps: the
// api's resident memory at its peak stays within 64 MiB of what it was
// before. A proxy that reads answers whole before sending them holds the
// three, 768 MiB.
func TestProxyStreamsLargeAnswers(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc to read the api's memory from")
	}
	s, key := downloadStack(t)
	pid, base := startAPIProcess(t, s.env(nil))
	if r := rawGet(t, base, "/api/dl/len/70000", key); r.status != 200 || len(r.body) != 70000 {
		t.Fatalf("warm-up: status %d, %d bytes; want 200 and 70000 (%.200s)", r.status, len(r.body), r.body)
	}
	before := memKB(t, pid, "VmRSS")

	const size, read = 256 << 20, 16 << 20
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, target := range []string{"/api/dl/len/", "/api/dl/len/", "/api/dl/chunked/"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, err := slowDownload(base, target+strconv.Itoa(size), key, read)
			if err == nil && status != 200 {
				err = fmt.Errorf("status %d", status)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	peak := memKB(t, pid, "VmHWM")
	for i, err := range errs {
		if err != nil {
			t.Errorf("client %d: %v", i, err)
		}
	}
	t.Logf("the api's resident memory: %d MiB before the downloads, %d MiB at its peak", before>>10, peak>>10)
	if growth := peak - before; growth > 64<<10 {
		t.Errorf("the api's resident memory peaked %d MiB above its %d MiB before the downloads, want at most 64 MiB", growth>>10, before>>10)
	}
	// The upstream connections the clients left are not reused with the
	// rest of an answer on them.
	if r := rawGet(t, base, "/api/dl/len/70000", key); r.status != 200 || len(r.body) != 70000 {
		t.Errorf("after the downloads: status %d, %d bytes; want 200 and 70000 (%.200s)", r.status, len(r.body), r.body)
	}
}

// TestProxyMaxResponseBytes: with TOLLGATE_PROXY_MAX_RESPONSE_BYTES, an
// answer whose Content-Length passes it is 502 problem+json (not refunded
// on a refund_on_5xx route: the upstream answered), a chunked one is cut
// there, and answers up to it, or to a HEAD, pass whole.
func TestProxyMaxResponseBytes(t *testing.T) {
	t.Parallel()
	s, key := downloadStack(t)
	base := s.startWith(map[string]string{"TOLLGATE_PROXY_MAX_RESPONSE_BYTES": "100000"})

	for _, target := range []string{"/api/dl/len/100000", "/api/dl/chunked/100000", "/api/dl/len/99999"} {
		r := rawGet(t, base, target, key)
		if r.status != 200 || int64(len(r.body)) != mustAtoi(t, target[strings.LastIndex(target, "/")+1:]) {
			t.Errorf("GET %s: status %d, %d bytes; want 200 and the whole body", target, r.status, len(r.body))
		}
	}
	r := raw(t, base, "HEAD /api/dl/len/300000 HTTP/1.1", "Authorization: Bearer "+key)
	if r.status != 200 {
		t.Errorf("HEAD of a long answer: status %d, want 200", r.status)
	}
	left := remaining(t, r.header)["daily"]

	r = rawGet(t, base, "/api/dl/len/100001", key)
	if r.status != 502 || r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.body), "larger") {
		t.Errorf("GET a 100001-byte answer: status %d %q %.100q, want 502 problem+json", r.status, r.header.Get("Content-Type"), r.body)
	}
	// The upstream answered (200): the work was done, and the refund route
	// does not give it back.
	if r.header.Get("Tollgate-Refunded") != "" {
		t.Errorf("GET a 100001-byte answer: Tollgate-Refunded %q, want none", r.header.Get("Tollgate-Refunded"))
	}
	if r := rawGet(t, base, "/api/dl/small", key); remaining(t, r.header)["daily"] != left-2 {
		t.Errorf("after a 502 for an answer too large: daily remaining %d, want %d", remaining(t, r.header)["daily"], left-2)
	}

	// A chunked answer past the maximum: its status and headers are sent,
	// then the body stops at the maximum and the connection ends.
	status, err := slowDownload(base, "/api/dl/chunked/300000", key, 300000)
	if status != 200 || err == nil || !strings.Contains(err.Error(), "after 100000 bytes") {
		t.Errorf("GET a chunked 300000-byte answer: status %d, %v; want 200 cut after 100000 bytes", status, err)
	}
}

func mustAtoi(tb testing.TB, s string) int64 {
	tb.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestIdempotentAnswersKeepTheReplayLimit: a streamed answer is stored for
// idempotent repeats when it fits MaxReplayBody (1 MiB), chunked or not,
// and replayed byte for byte; a longer one is sent once, whole, and its
// repeats are 409, as before answers streamed.
func TestIdempotentAnswersKeepTheReplayLimit(t *testing.T) {
	t.Parallel()
	s, key := downloadStack(t)
	base := s.start()
	for i, tc := range []struct {
		target string
		stored bool
	}{
		{"/api/dl/chunked/1048576", true},
		{"/api/dl/len/1048576", true},
		{"/api/dl/chunked/1048577", false},
		{"/api/dl/len/3145728", false},
	} {
		idem := fmt.Sprintf("Idempotency-Key: big-%d", i)
		want := mustAtoi(t, tc.target[strings.LastIndex(tc.target, "/")+1:])
		first := raw(t, base, "GET "+tc.target+" HTTP/1.1", "Authorization: Bearer "+key, idem)
		if first.status != 200 || int64(len(first.body)) != want || first.body[want-1] != patternByte(want-1) {
			t.Errorf("GET %s: status %d, %d bytes; want 200 and %d", tc.target, first.status, len(first.body), want)
			continue
		}
		again := raw(t, base, "GET "+tc.target+" HTTP/1.1", "Authorization: Bearer "+key, idem)
		switch {
		case tc.stored && (again.status != 200 || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body)):
			t.Errorf("repeat of GET %s: status %d, replayed %q, %d bytes; want the stored answer", tc.target, again.status, again.header.Get("Idempotent-Replayed"), len(again.body))
		case !tc.stored && (again.status != 409 || !strings.Contains(string(again.body), "larger than the 1048576 bytes stored")):
			t.Errorf("repeat of GET %s: status %d %.300s; want 409 naming the replay limit", tc.target, again.status, again.body)
		}
	}
}

// TestProxyHangUpMidAnswer: a client that hangs up in the middle of a
// streamed answer leaves no half-read upstream connection in the pool: the
// requests after it, on the same upstream, get their own answers whole.
func TestProxyHangUpMidAnswer(t *testing.T) {
	t.Parallel()
	s, key := downloadStack(t)
	base := s.start()
	for _, target := range []string{"/api/dl/len/8388608", "/api/dl/chunked/8388608"} {
		for range 3 {
			if status, err := slowDownload(base, target, key, 200000); status != 200 || err != nil {
				t.Fatalf("GET %s: status %d, %v", target, status, err)
			}
		}
		for range 5 {
			if r := rawGet(t, base, "/api/dl/len/70000", key); r.status != 200 || len(r.body) != 70000 || r.body[69999] != patternByte(69999) {
				t.Fatalf("after hanging up on %s: status %d, %d bytes (%.100q); want 200 and the 70000-byte answer", target, r.status, len(r.body), r.body)
			}
		}
	}
}
