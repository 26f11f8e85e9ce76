package api

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Policy queues under hostile clients: the waiter slots of a node, the
// clients that leave while they wait, and queued concurrency requests.

// queueWaiters reads tollgate_policy_queue_waiters from base's /metrics.
func queueWaiters(tb testing.TB, base string) int {
	tb.Helper()
	for _, l := range strings.Split(string(do(tb, "GET", base+"/metrics", "", "").body), "\n") {
		if v, ok := strings.CutPrefix(l, "tollgate_policy_queue_waiters "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				tb.Fatalf("tollgate_policy_queue_waiters %q", v)
			}
			return n
		}
	}
	tb.Fatal("/metrics has no tollgate_policy_queue_waiters")
	return 0
}

// holdingUpstream answers /v1/hold/<id> when the test lets <id> finish, and
// anything else at once.
type holdingUpstream struct {
	mu    sync.Mutex
	holds map[string]*hold
	srv   *httptest.Server
}

type hold struct {
	arrived, finish chan struct{}
	once            sync.Once
}

// end lets the held request finish.
func (h *hold) end() { h.once.Do(func() { close(h.finish) }) }

func newHoldingUpstream(tb testing.TB) *holdingUpstream {
	u := &holdingUpstream{holds: map[string]*hold{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, ok := strings.CutPrefix(r.URL.Path, "/v1/hold/"); ok {
			h := u.hold(id)
			close(h.arrived)
			<-h.finish
		}
		_, _ = io.WriteString(w, "done")
	}))
	tb.Cleanup(func() {
		// a test that failed leaves none held: Close waits for them
		u.mu.Lock()
		for _, h := range u.holds {
			h.end()
		}
		u.mu.Unlock()
		u.srv.Close()
	})
	return u
}

func (u *holdingUpstream) hold(id string) *hold {
	u.mu.Lock()
	defer u.mu.Unlock()
	h, ok := u.holds[id]
	if !ok {
		h = &hold{arrived: make(chan struct{}), finish: make(chan struct{})}
		u.holds[id] = h
	}
	return h
}

// timed is a reply and how long it took.
type timed struct {
	reply
	took time.Duration
}

// goDo sends the request in a goroutine; its answer comes on the channel.
func goDo(tb testing.TB, method, url, key string) <-chan timed {
	c := make(chan timed, 1)
	go func() {
		start := time.Now()
		r := do(tb, method, url, key, "")
		c <- timed{r, time.Since(start)}
	}()
	return c
}

// waitQueued waits until base has want requests waiting in its policy
// queues; an answer on early ends the test: the request was to wait.
func waitQueued(tb testing.TB, base string, want int, early <-chan timed, what string) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for queueWaiters(tb, base) != want {
		select {
		case r := <-early:
			tb.Fatalf("%s: answered %d after %v while it should wait in the queue: %s", what, r.status, r.took.Round(time.Millisecond), r.body)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: %d waiters after 5 s, want %d", what, queueWaiters(tb, base), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestQueuedConcurrencyRequestWaitsForTheRelease: the README's example, a
// concurrency policy of limit 1, lease 30 s, on_refuse queue, max_wait_ms
// 5000: a request that finds the slot taken waits for the holder's answer
// and is then served (on the holder's node and on another one), though the
// holder's lease would only end in 30 s; one whose max wait ends first is
// refused.
func TestQueuedConcurrencyRequestWaitsForTheRelease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		nodes     int
		maxWaitMS int
		want      int
	}{
		{"same node", 1, 5000, 200},
		{"another node", 2, 5000, 200},
		{"past max_wait_ms", 1, 300, 429},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newHoldingUpstream(t)
			s := mustStack(t)
			s.upstreamRoutes(t, up.srv.URL)
			holderBase := s.start()
			waiterBase := holderBase
			if tc.nodes == 2 {
				waiterBase = s.start()
			}
			tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
			_, key := s.tenant(tier.Slug)
			mustPolicy(t, holderBase, fmt.Sprintf(`{"name": "one-report", "algorithm": "concurrency", "limit": 1, "lease_seconds": 30,
				"on_refuse": "queue", "max_wait_ms": %d}`, tc.maxWaitMS))
			for _, base := range []string{holderBase, waiterBase} {
				eventually(t, "the policy applies on "+base, func() bool {
					return strings.Contains(do(t, "GET", base+"/api/up/quick", key, "").header.Get("RateLimit-Policy"), `"one-report"`)
				})
			}

			h := up.hold("h")
			holder := goDo(t, "GET", holderBase+"/api/up/hold/h", key)
			select {
			case <-h.arrived:
			case r := <-holder:
				t.Fatalf("holder: %d %s", r.status, r.body)
			case <-time.After(5 * time.Second):
				t.Fatal("the holder never reached the upstream")
			}
			waiter := goDo(t, "GET", waiterBase+"/api/up/quick", key)
			if tc.want == 429 {
				w := <-waiter
				h.end()
				if w.status != 429 || !strings.Contains(string(w.body), "one-report") {
					t.Fatalf("a request whose max wait ends before the release: %d %s, want 429 naming one-report", w.status, w.body)
				}
				if r := <-holder; r.status != 200 {
					t.Fatalf("holder: %d %s", r.status, r.body)
				}
				return
			}
			waitQueued(t, waiterBase, 1, waiter, "the request that finds the slot taken")
			h.end()
			if r := <-holder; r.status != 200 {
				t.Fatalf("holder: %d %s", r.status, r.body)
			}
			w := <-waiter
			if w.status != 200 || string(w.body) != "done" {
				t.Fatalf("the queued request after the holder's answer: %d %s, want 200", w.status, w.body)
			}
			if n := queueWaiters(t, waiterBase); n != 0 {
				t.Fatalf("%d waiters after the queued request was served, want 0", n)
			}
		})
	}
}

// rawWaiter sends a metered GET of key on a connection of its own and
// leaves the connection open: the caller sends more or closes it.
func rawWaiter(tb testing.TB, base, key string) net.Conn {
	tb.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, "GET /api/demo/echo HTTP/1.1\r\nHost: tollgate.test\r\nAuthorization: Bearer "+key+"\r\n\r\n"); err != nil {
		tb.Fatal(err)
	}
	return conn
}

// floodQueue opens n waiting requests of key on base at once and returns
// their connections once the node's queue stopped growing.
func floodQueue(tb testing.TB, base, key string, n int) []net.Conn {
	tb.Helper()
	conns := make([]net.Conn, n)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conns[i] = rawWaiter(tb, base, key)
		}()
	}
	wg.Wait()
	// the queue is full or the rest were refused when its size holds
	last, since := -1, time.Now()
	for time.Since(since) < 500*time.Millisecond {
		if w := queueWaiters(tb, base); w != last {
			last, since = w, time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return conns
}

// pacedTenants starts a node with extra variables whose policy "paced"
// (gcra, one request a second per tenant, burst 1, queue up to 30 s)
// applies to two tenants; each tenant's burst is spent.
func pacedTenants(t *testing.T, extra map[string]string) (base, attacker, other string) {
	t.Helper()
	s := mustStack(t)
	// (its tests hold over a thousand connections from one address:
	// past the per-address cap, which is not what they test)
	env := map[string]string{"TOLLGATE_MAX_CONNS_PER_IP": "0"}
	maps.Copy(env, extra)
	base = s.startWith(env)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(100_000))})
	_, attacker = s.tenant(tier.Slug)
	_, other = s.tenant(tier.Slug)
	mustPolicy(t, base, `{"name": "paced", "algorithm": "gcra", "rate": 1, "burst": 1, "on_refuse": "queue", "max_wait_ms": 30000}`)
	waitPolicy(t, base, attacker, "paced")
	return base, attacker, other
}

// otherTenantQueues checks that other's queued request (its burst spent by
// one request first) waits for its turn and is served, not refused because
// another tenant holds the node's queue.
func otherTenantQueues(t *testing.T, base, other, why string) {
	t.Helper()
	if r := do(t, "GET", base+"/api/demo/echo", other, ""); r.status != 200 {
		t.Fatalf("the other tenant's first request: %d %s", r.status, r.body)
	}
	start := time.Now()
	if r := do(t, "GET", base+"/api/demo/echo", other, ""); r.status != 200 {
		t.Errorf("the other tenant's queued request: %d after %v, want 200 once its turn comes (%s): %s",
			r.status, time.Since(start).Round(time.Millisecond), why, r.body)
	}
}

// TestClosedWaitersLeaveTheQueueWhateverTheySent: one tenant's 1,030 queued
// requests, each followed by one more byte and then closed, leave the queue
// within a bound (a closed connection is seen whatever it left unread), and
// another tenant's queued request is served meanwhile.
func TestClosedWaitersLeaveTheQueueWhateverTheySent(t *testing.T) {
	t.Parallel()
	base, attacker, other := pacedTenants(t, nil)
	conns := floodQueue(t, base, attacker, 1030)
	for _, c := range conns {
		_, _ = io.WriteString(c, "X") // left unread: the request is waiting
	}
	time.Sleep(100 * time.Millisecond) // (the byte is in the server's socket)
	closed := time.Now()
	for _, c := range conns {
		c.Close()
	}
	otherTenantQueues(t, base, other, "the first tenant's requests were closed")
	for n := queueWaiters(t, base); n != 0; n = queueWaiters(t, base) {
		if time.Since(closed) > 3*time.Second {
			t.Fatalf("%d closed requests still wait %v after their clients closed, want none after 3 s", n, time.Since(closed).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOneTenantCannotHoldTheNodesQueue: one tenant's 1,030 live queued
// requests take at most its share of the node's waiter slots (the rest
// are refused at once), and another tenant's queued request is served.
func TestOneTenantCannotHoldTheNodesQueue(t *testing.T) {
	t.Parallel()
	base, attacker, other := pacedTenants(t, nil)
	conns := floodQueue(t, base, attacker, 1030)
	if n := queueWaiters(t, base); n > 64 {
		t.Errorf("one tenant holds %d waiter slots, want at most 64 (TOLLGATE_QUEUE_WAITERS_PER_TENANT)", n)
	}
	otherTenantQueues(t, base, other, "the first tenant's requests still wait")
	// those refused at once got a 429 naming the policy (a waiter may have
	// been served in its turn meanwhile)
	// "At once" is long before the policy's 30 s wait: every answer may
	// take up to 2 s from here (a loaded machine may still be writing the
	// refusals), then 10 ms each.
	refused, served, by := 0, 0, time.Now().Add(2*time.Second)
	for _, c := range conns {
		dl := time.Now().Add(10 * time.Millisecond)
		if dl.Before(by) {
			dl = by
		}
		_ = c.SetReadDeadline(dl)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == 200: // served in its turn
			served++
		case resp.StatusCode != 429 || !strings.Contains(string(b), "paced"):
			t.Fatalf("a refused waiter: %d %s, want 429 naming paced", resp.StatusCode, b)
		default:
			refused++
		}
	}
	// Every request was refused, or took one of the tenant's 64 slots: a
	// waiter served in its turn (one a second) freed its slot for another.
	if refused < 1030-64-served {
		t.Fatalf("%d of 1030 requests refused at once, %d served, want at least %d refused", refused, served, 1030-64-served)
	}
}

// TestPolicyQueueLeavesRoomForOthers: a policy's waiters take at most
// TOLLGATE_QUEUE_WAITERS_PER_POLICY of a node's slots, a tenant's at most
// TOLLGATE_QUEUE_WAITERS_PER_TENANT: requests past them are refused at
// once, and another policy's request still finds a slot.
func TestPolicyQueueLeavesRoomForOthers(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.startWith(map[string]string{"TOLLGATE_QUEUE_WAITERS": "4",
		"TOLLGATE_QUEUE_WAITERS_PER_TENANT": "2", "TOLLGATE_QUEUE_WAITERS_PER_POLICY": "3"})
	busy := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	quiet := s.tier(2, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	_, a1 := s.tenant(busy.Slug)
	_, a2 := s.tenant(busy.Slug)
	_, b := s.tenant(quiet.Slug)
	mustPolicy(t, base, `{"name": "busy-q", "algorithm": "gcra", "rate": 0.05, "burst": 1, "on_refuse": "queue", "max_wait_ms": 60000,
		"match": {"tiers": ["`+busy.Slug+`"]}}`)
	mustPolicy(t, base, `{"name": "quiet-q", "algorithm": "gcra", "rate": 1, "burst": 1, "on_refuse": "queue", "max_wait_ms": 5000,
		"match": {"tiers": ["`+quiet.Slug+`"]}}`)
	waitPolicy(t, base, a1, "busy-q")
	waitPolicy(t, base, a2, "busy-q")
	waitPolicy(t, base, b, "quiet-q")

	// a1: two wait, the third is past the tenant's share
	for range 2 {
		rawWaiter(t, base, a1)
	}
	waitQueued(t, base, 2, nil, "a1's two requests")
	if r := do(t, "GET", base+"/api/demo/echo", a1, ""); r.status != 429 {
		t.Fatalf("a1's third queued request: %d, want 429 at once (the tenant's share is 2)", r.status)
	}
	// a2: one waits, the second is past the policy's share
	rawWaiter(t, base, a2)
	waitQueued(t, base, 3, nil, "a2's request")
	if r := do(t, "GET", base+"/api/demo/echo", a2, ""); r.status != 429 {
		t.Fatalf("a2's second queued request: %d, want 429 at once (the policy's share is 3)", r.status)
	}
	// another policy's request still waits for its turn and is served
	if r := do(t, "GET", base+"/api/demo/echo", b, ""); r.status != 200 {
		t.Fatalf("b's first request: %d", r.status)
	}
	if r := do(t, "GET", base+"/api/demo/echo", b, ""); r.status != 200 {
		t.Fatalf("b's queued request: %d %s, want 200 after its turn", r.status, r.body)
	}
	m := string(do(t, "GET", base+"/metrics", "", "").body)
	for _, line := range []string{`tollgate_policy_queue_full_total{bound="tenant"} 1`, `tollgate_policy_queue_full_total{bound="policy"} 1`} {
		if !strings.Contains(m, line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

// TestWaiterLeavesWhenItsCloseIsBehindMoreThanTheSocketHolds: a client that
// sends 1 MiB behind its queued request and closes (more than the socket's
// buffer: its close cannot arrive until the bytes are read) leaves the
// queue all the same.
func TestWaiterLeavesWhenItsCloseIsBehindMoreThanTheSocketHolds(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	_, key := s.tenant(tier.Slug)
	// one request per 50 s: the second waits its whole max wait
	mustPolicy(t, base, `{"name": "slow-q", "algorithm": "gcra", "rate": 0.02, "burst": 1, "on_refuse": "queue", "max_wait_ms": 60000}`)
	waitPolicy(t, base, key, "slow-q")
	conn := rawWaiter(t, base, key)
	waitQueued(t, base, 1, nil, "the request")
	go func() {
		_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = conn.Write(make([]byte, 1<<20))
		conn.Close()
	}()
	deadline := time.Now().Add(3 * time.Second)
	for n := queueWaiters(t, base); n != 0; n = queueWaiters(t, base) {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests still wait 3 s after their client sent 1 MiB more and closed, want none", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPipelinedWaiterIsServedThenClosed: a client that pipelines a request
// behind its queued one keeps its place and is served in its turn; the
// pipelined request, read off the socket while the first waited, is not
// answered: the connection closes after the first answer (a pipelining
// client retries what was left unanswered).
func TestPipelinedWaiterIsServedThenClosed(t *testing.T) {
	t.Parallel()
	base, key, _ := pacedTenants(t, map[string]string{})
	conn := rawWaiter(t, base, key)
	waitQueued(t, base, 1, nil, "the request")
	if _, err := io.WriteString(conn, "GET /api/demo/echo HTTP/1.1\r\nHost: tollgate.test\r\nAuthorization: Bearer "+key+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the queued request's answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("the queued request: %d, Connection %q: want 200 and the connection closed after it", resp.StatusCode, resp.Header.Get("Connection"))
	}
	if _, err := http.ReadResponse(br, nil); err == nil {
		t.Fatal("the pipelined request read off the socket while the first waited was answered, want the connection closed")
	}
}
