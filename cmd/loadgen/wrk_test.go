package main

import (
	"context"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/httpapi/benchpeer"
	"github.com/tollgate/tollgate/internal/testenv"
)

// wrkOutput is what wrk 4.1 printed for a run with wrk.lua.
const wrkOutput = `Running 1s test @ http://127.0.0.1:18991/echo
  2 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    69.72us  112.64us   2.50ms   95.63%
    Req/Sec    34.50k     2.17k   40.07k    77.27%
  75380 requests in 1.10s, 12.08MB read
  Non-2xx or 3xx responses: 12
Requests/sec:  68544.47
Transfer/sec:     10.98MB
loadgen-wrk requests=75380 duration_us=1100000 p50_us=50 p99_us=532 connect=1 read=2 write=3 status=12 timeout=4
`

func TestParseWrk(t *testing.T) {
	got, err := parseWrk(wrkOutput)
	if err != nil {
		t.Fatal(err)
	}
	want := wrkSummary{requests: 75380, durationUS: 1_100_000, p50US: 50, p99US: 532, connect: 1, read: 2, write: 3, status: 12, timeout: 4}
	if got != want {
		t.Errorf("parseWrk = %+v, want %+v", got, want)
	}
	line := "loadgen-wrk requests=1 duration_us=1000 p50_us=5 p99_us=9 connect=0 read=0 write=0 status=0 timeout=0"
	for _, bad := range []string{
		"",
		strings.Split(wrkOutput, "loadgen-wrk")[0], // wrk's own report only
		strings.Replace(line, " timeout=0", "", 1),
		strings.Replace(line, "status=0", "status=x", 1),
		strings.Replace(line, "status=0", "status=-1", 1),
		strings.Replace(line, "duration_us=1000", "duration_us=0", 1),
	} {
		if s, err := parseWrk(bad); err == nil {
			t.Errorf("parseWrk(%q) = %+v, want an error", bad, s)
		}
	}
}

func TestWrkSummaryResult(t *testing.T) {
	s := wrkSummary{requests: 1000, durationUS: 2_000_000, p50US: 150, p99US: 2500, status: 10}
	for _, tc := range []struct {
		name              string
		t                 target
		sum               wrkSummary
		ok, errs, refused int64
		firstErr          string
	}{
		{"want 200", target{want: 200}, s, 990, 10, 0, "10 answers with a status of 400 or more"},
		{"want 429", target{want: 429}, s, 10, 990, 0, "990 answers with a status below 400"},
		{"refusals apart", target{want: 200, refuse: 429}, s, 990, 0, 10, ""},
		{"no answers", target{want: 200}, wrkSummary{requests: 1000, durationUS: 2_000_000, connect: 1, read: 2, write: 3, timeout: 4},
			1000, 10, 0, "no answer: connect 1, read 2, write 3, timeout 4"},
	} {
		tc.t.row = tc.name
		r := tc.sum.result(&tc.t)
		if r.OK != tc.ok || r.Errors != tc.errs || r.Refused != tc.refused || r.Requests != r.OK+r.Errors+r.Refused {
			t.Errorf("%s: ok %d, errors %d, refused %d of %d; want %d, %d, %d", tc.name, r.OK, r.Errors, r.Refused, r.Requests, tc.ok, tc.errs, tc.refused)
		}
		if !strings.HasPrefix(r.FirstErr, tc.firstErr) || (tc.firstErr == "") != (r.FirstErr == "") {
			t.Errorf("%s: first error %q, want %q", tc.name, r.FirstErr, tc.firstErr)
		}
		if r.RPS != float64(tc.sum.requests)/2 || r.P50 != time.Duration(tc.sum.p50US)*time.Microsecond || r.Row != tc.name {
			t.Errorf("%s: %.1f req/s, p50 %s, row %q; want %.1f, the summary's, the target's", tc.name, r.RPS, r.P50, r.Row, float64(tc.sum.requests)/2)
		}
	}
	if r := s.result(&target{want: 200}); r.P99 != 2500*time.Microsecond {
		t.Errorf("p99 = %s, want 2.5ms", r.P99)
	}
}

func TestWrkSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int{100 * time.Millisecond: 1, 1400 * time.Millisecond: 1, 2500 * time.Millisecond: 3, 5 * time.Second: 5} {
		if got := wrkSeconds(d); got != want {
			t.Errorf("wrkSeconds(%s) = %d, want %d", d, got, want)
		}
	}
}

// countingServer answers every request 200, or want429 for POST, and
// counts them by their benchpeer.KeyHeader.
type countingServer struct {
	url   string
	mu    sync.Mutex
	byKey map[string]int
	seen  []string // "<method> <content type> <body>" of the requests, deduplicated
}

func newCountingServer(t *testing.T) *countingServer {
	t.Helper()
	s := &countingServer{byKey: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		what := r.Method + " " + r.Header.Get("Content-Type") + " " + string(body)
		s.mu.Lock()
		s.byKey[r.Header.Get(benchpeer.KeyHeader)]++
		if !slices.Contains(s.seen, what) {
			s.seen = append(s.seen, what)
		}
		s.mu.Unlock()
		if r.Method == "POST" {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write([]byte(`{"ok":true}`))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	s.url = "http://" + ln.Addr().String()
	return s
}

func (s *countingServer) counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.byKey)
}

func (s *countingServer) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen)
}

// balanced fails unless every key has requests, and no two keys' counts
// differ by more than slack.
func balanced(t *testing.T, counts map[string]int, keys []string, slack int) {
	t.Helper()
	lo, hi := -1, 0
	for _, k := range keys {
		n := counts[k]
		if lo < 0 || n < lo {
			lo = n
		}
		hi = max(hi, n)
	}
	if lo <= 0 || hi-lo > slack || len(counts) != len(keys) {
		t.Errorf("requests by key: %v; want each of the %d keys (and no other) with counts within %d of each other", counts, len(keys), slack)
	}
}

// testWrk is the wrk of the tests: TOLLGATE_WRK, else wrk on PATH.
func testWrk(t *testing.T) string {
	t.Helper()
	testenv.Integration(t, "wrk")
	name := os.Getenv("TOLLGATE_WRK")
	if name == "" {
		name = "wrk"
	}
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("no wrk (%v): install it with eval \"$(scripts/services.sh wrk)\", or set TOLLGATE_WRK", err)
	}
	return path
}

func childCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestWrkDrivesAServer runs wrk.lua for a second each: keys sent round
// robin from every thread, a POST with its body and one Authorization,
// an answer of 429 counted as what the row wanted, wrk's CPU time among
// loadgen's children.
func TestWrkDrivesAServer(t *testing.T) {
	srv := newCountingServer(t)
	w, err := newWrkDriver(testWrk(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.close(); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(w.dir); !os.IsNotExist(err) {
			t.Errorf("%s after close: %v, want it gone", w.dir, err)
		}
	}()

	keys := []string{"Bearer k1", "Bearer k2", "Bearer k3", "Bearer k4", "Bearer k5"}
	tg, err := newTarget("keys", srv.url, "GET", "/echo", 200, 4)
	if err != nil {
		t.Fatal(err)
	}
	tg.keys = keys
	cpu := childCPU(t)
	r, err := w.closedLoop(t.Context(), tg, time.Second, 4)
	if err != nil {
		t.Fatal(err)
	}
	if childCPU(t) <= cpu {
		t.Errorf("the children's CPU time did not grow over a run of wrk")
	}
	if r.Requests < 100 || r.Errors != 0 || r.OK != r.Requests || r.P50 <= 0 || r.P99 < r.P50 || r.RPS <= 0 {
		t.Errorf("keys: got %+v, want at least 100 requests, all ok, 0 < p50 <= p99", r)
	}
	counts := srv.counts()
	// Each thread sends the keys in turn: its counts differ by at most one,
	// and by the requests in flight when wrk stopped.
	balanced(t, counts, keys, 4+2)
	total := 0
	for _, n := range counts {
		total += n
	}
	if int64(total) < r.Requests {
		t.Errorf("the server saw %d requests, wrk reported %d answers", total, r.Requests)
	}

	srv = newCountingServer(t)
	tg, err = newTarget("post", srv.url, "POST", "/check", 429, 2)
	if err != nil {
		t.Fatal(err)
	}
	tg.auth, tg.body = "Bearer one", []byte(`{"cost":1}`)
	r, err = w.closedLoop(t.Context(), tg, 100*time.Millisecond, 2) // a whole second
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests < 100 || r.Errors != 0 || r.OK != r.Requests {
		t.Errorf("post, wanting 429: got %+v, want at least 100 requests, all ok", r)
	}
	if got := srv.counts(); len(got) != 1 || got["Bearer one"] == 0 {
		t.Errorf("post: requests by Authorization %v, want all with Bearer one", got)
	}
	if want := []string{`POST application/json {"cost":1}`}; !slices.Equal(srv.requests(), want) {
		t.Errorf("post: the server saw %q, want %q", srv.requests(), want)
	}

	tg.want = 200 // the same 429s are now errors
	if r, err = w.closedLoop(t.Context(), tg, time.Second, 2); err != nil || r.Errors != r.Requests || r.Requests == 0 {
		t.Errorf("post, wanting 200: got %+v, %v; want every answer an error", r, err)
	}

	tg.uri = "http://127.0.0.1:1/nothing" // nothing listens
	if r, err := w.closedLoop(t.Context(), tg, time.Second, 2); err == nil && r.Errors == 0 {
		t.Errorf("against a closed port: got %+v, want an error or failed requests", r)
	}
}

// TestOwnDriverSendsKeysInTurn: loadgen's own closed loop spreads the keys
// evenly too.
func TestOwnDriverSendsKeysInTurn(t *testing.T) {
	srv := newCountingServer(t)
	keys := []string{"Bearer a", "Bearer b", "Bearer c"}
	tg, err := newTarget("keys", srv.url, "GET", "/echo", 200, 2)
	if err != nil {
		t.Fatal(err)
	}
	tg.keys = keys
	r, err := ownDriver{max: 300}.closedLoop(context.Background(), tg, time.Minute, 2)
	if err != nil || r.Requests != 300 || r.Errors != 0 {
		t.Fatalf("got %+v, %v; want 300 requests, no errors", r, err)
	}
	// each connection's counts differ by at most one
	balanced(t, srv.counts(), keys, 2)
}
