package main

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The kinds of tenant, by tier: what the audit holds each to.
const (
	kindPost    = "postpaid"  // fail-closed, a monthly quota that blocks
	kindBill    = "spend-cap" // fail-closed, bills overage up to a spend cap
	kindPrepaid = "prepaid"   // draws overage from its credit, fails closed
	kindOpen    = "fail-open" // admitted in process while Redis is away
)

// tenant is one of the soak's tenants and what its client saw.
type tenant struct {
	id, key, kind string

	mu sync.Mutex
	// low and high bound the units the tenant's answers admitted: low counts
	// the answers that said so (2xx, after the refunds and settlements
	// answered), high adds every unit a lost answer may have admitted.
	low, high int64
	// byMeter splits low and high by meter, as the ledger does.
	byMeter map[string][2]int64
	// degraded counts, per meter, the admissions answered by a node's
	// fail-open limiter (Tollgate-Degraded: fail-open, or degraded: true).
	degraded map[string]int64
	// quota is the most units the tenant may be billed past its overage
	// (its monthly quota plus grants); -1: no quota checked.
	quota int64
	// capUnits is the most overage units its spend cap or credit pays for;
	// -1: none checked.
	capUnits int64
}

// add records what one exchange of a meter may have admitted.
func (t *tenant) add(meter string, low, high int64) {
	t.mu.Lock()
	t.low += low
	t.high += high
	if t.byMeter == nil {
		t.byMeter = map[string][2]int64{}
	}
	m := t.byMeter[meter]
	m[0] += low
	m[1] += high
	t.byMeter[meter] = m
	t.mu.Unlock()
}

// tally counts the answers of the whole run by what they were.
type tally struct {
	mu     sync.Mutex
	counts map[string]int64
	// fiveXX are the api's own 5xx answers (an upstream's carry its mark).
	fiveXX []answer5xx
	// odd are answers outside the contract (a 404 to a refund of a known
	// request id, a 5xx of the upstream not refunded, …), with their time.
	odd []oddity
}

// answer5xx is one 5xx answer the api wrote itself.
type answer5xx struct {
	at     time.Time
	status int
	what   string
}

func (t *tally) inc(what string) {
	t.mu.Lock()
	t.counts[what]++
	t.mu.Unlock()
}

func (t *tally) fiveHundred(status int, what string) {
	t.mu.Lock()
	t.fiveXX = append(t.fiveXX, answer5xx{time.Now(), status, what})
	t.mu.Unlock()
}

// oddity is one answer outside the contract.
type oddity struct {
	at   time.Time
	what string
}

func (t *tally) oddity(format string, args ...any) {
	t.mu.Lock()
	if len(t.odd) < 10000 {
		t.odd = append(t.odd, oddity{time.Now(), fmt.Sprintf(format, args...)})
	}
	t.mu.Unlock()
}

// node is one api node as the load sees it: down while the soak has it killed.
type node struct {
	base string
	down atomic.Bool
}

// driver sends the load: ops from many goroutines at a steady rate to the
// live api nodes, each op recorded on its tenant and in the tally.
type driver struct {
	nodes        []*node
	tenants      []*tenant
	serviceToken string
	client       *http.Client
	tally        *tally
	up           *upstream
}

// Route costs, as the route table the soak writes says.
const (
	costPlain  = 1
	costRefund = 2
	costSettle = 5
	costCheck  = 3
)

// routeTable is the api's TOLLGATE_ROUTES for an upstream at base.
func routeTable(base string) []byte {
	b, _ := json.Marshal(map[string]any{"routes": []map[string]any{
		{"method": "*", "path": "/api/p/", "meter": "plain", "cost": costPlain, "upstream": base + "/p/", "timeout": "10s"},
		{"method": "*", "path": "/api/r/", "meter": "refund", "cost": costRefund, "upstream": base + "/r/", "timeout": "10s", "refund_on_5xx": true},
		{"method": "*", "path": "/api/s/", "meter": "settle", "cost": costSettle, "upstream": base + "/s/", "timeout": "10s", "settle": true},
	}})
	return b
}

// run sends ops at rate per second from clients goroutines until ctx ends.
func (d *driver) run(ctx context.Context, rate, clients int) {
	ops := make(chan struct{}, clients)
	go func() {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				close(ops)
				return
			case <-tick.C:
				select {
				case ops <- struct{}{}:
				default: // every client busy: the op is not sent
					d.tally.inc("skipped")
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range ops {
				d.op()
			}
		})
	}
	wg.Wait()
}

// op sends one op of a random kind for a random tenant.
func (d *driver) op() {
	t := d.tenants[rand.IntN(len(d.tenants))]
	switch n := rand.IntN(100); {
	case n < 30:
		d.plain(t)
	case n < 50:
		d.refundRoute(t, rand.IntN(2) == 0)
	case n < 70:
		d.settle(t, rand.IntN(6), rand.IntN(10) < 3)
	case n < 85:
		d.idempotent(t)
	default:
		d.check(t, rand.IntN(2) == 0)
	}
}

// pick is a random live node.
func (d *driver) pick() *node {
	for range 8 {
		n := d.nodes[rand.IntN(len(d.nodes))]
		if !n.down.Load() {
			return n
		}
	}
	return d.nodes[0]
}

// reply is what one HTTP exchange came to.
type reply struct {
	status int
	header http.Header
	body   []byte
	// lost: no answer, and the request may have reached the api (any error
	// but a refused connection, which nothing received).
	lost    bool
	refused bool
	// node answered (or was asked): a fail-open admission is settled or
	// refunded by the node that holds it, so the follow-up goes there.
	node *node
}

func (d *driver) do(method, url string, header map[string]string, body []byte) reply {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	// Whether any attempt wrote the request: Go's transport sends a
	// replayable request again on a new connection when a kept-alive one
	// breaks, and the second attempt's refused connection must not hide a
	// first one that reached a node killed mid-request.
	var wrote atomic.Bool
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) }})
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		panic(err) // the soak's own URLs
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) && !wrote.Load() {
			return reply{refused: true}
		}
		return reply{lost: true}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return reply{lost: true}
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// metered sends a metered request as tenant t and classifies the answer:
// admitted (2xx), and records everything but the units, which the caller
// knows.
func (d *driver) metered(t *tenant, method, path string, extra map[string]string) reply {
	h := map[string]string{"Authorization": "Bearer " + t.key}
	for k, v := range extra {
		h[k] = v
	}
	n := d.pick()
	r := d.do(method, n.base+path, h, nil)
	r.node = n
	d.classify(t, r, path)
	if r.status >= 200 && r.status < 300 && r.header.Get("Tollgate-Degraded") == "fail-open" || r.status >= 500 && r.header.Get("Tollgate-Degraded") == "fail-open" {
		d.tally.inc("admitted fail-open")
		t.failOpen(meterOf(path))
	}
	return r
}

// classify counts an answer in the tally: its class, and every 5xx the api
// wrote itself.
func (d *driver) classify(t *tenant, r reply, what string) {
	switch {
	case r.refused:
		d.tally.inc("connection refused")
	case r.lost:
		d.tally.inc("lost")
	case r.status >= 200 && r.status < 300:
		d.tally.inc("admitted")
	case r.status == http.StatusTooManyRequests:
		d.tally.inc("refused 429")
	case r.status == http.StatusPaymentRequired:
		d.tally.inc("refused 402")
	case r.status >= 500 && r.header.Get("X-Soak-Upstream") != "":
		d.tally.inc("upstream 5xx")
	case r.status >= 500:
		d.tally.inc("api 5xx")
		d.tally.fiveHundred(r.status, t.kind+" "+what)
	default:
		d.tally.inc(fmt.Sprintf("status %d", r.status))
	}
}

// bounds are the (low, high) units of an answer to a request of cost c
// that was not refunded or settled: an admission counts c, a lost answer
// or an api 5xx up to c, anything else nothing.
func bounds(r reply, c int64) (int64, int64) {
	switch {
	case r.refused:
		return 0, 0
	case r.lost:
		return 0, c
	case r.status >= 200 && r.status < 300:
		return c, c
	case r.status >= 500 && r.header.Get("X-Soak-Upstream") == "":
		return 0, c
	default:
		return 0, 0
	}
}

func (d *driver) plain(t *tenant) {
	r := d.metered(t, http.MethodGet, "/api/p/plain", nil)
	t.addReply("plain", r, costPlain)
}

// refundRoute calls the refund_on_5xx route; fail asks the upstream for a
// 503, whose units must come back.
func (d *driver) refundRoute(t *tenant, fail bool) {
	path := "/api/r/ok"
	if fail {
		path = "/api/r/fail"
	}
	r := d.metered(t, http.MethodGet, path, nil)
	if r.status >= 500 && r.header.Get("X-Soak-Upstream") != "" {
		if r.header.Get("Tollgate-Refunded") == "" {
			d.tally.oddity("%s: an upstream 503 on a refund_on_5xx route was not refunded", t.kind)
			t.add("refund", 0, costRefund)
			return
		}
		d.tally.inc("refunded by route")
		return
	}
	t.addReply("refund", r, costRefund)
}

// settle calls the settle route, which costs costSettle until settled to
// actual: by the upstream's Tollgate-Actual-Cost, or by POST /v1/settle.
func (d *driver) settle(t *tenant, actual int, viaAPI bool) {
	via := "header"
	if viaAPI {
		via = "api"
	}
	r := d.metered(t, http.MethodGet, "/api/s/x?actual="+strconv.Itoa(actual)+"&via="+via, nil)
	if r.status < 200 || r.status >= 300 {
		t.addReply("settle", r, costSettle)
		return
	}
	if !viaAPI {
		if got := r.header.Get("Tollgate-Settled-Cost"); got != strconv.Itoa(actual) {
			// A fail-open admission settles on the node; anything else
			// must say what it settled to.
			d.tally.oddity("%s: settle by header answered Tollgate-Settled-Cost %q, want %d", t.kind, got, actual)
			t.add("settle", int64(min(actual, costSettle)), costSettle)
			return
		}
		d.tally.inc("settled by header")
		t.add("settle", int64(actual), int64(actual))
		return
	}
	id := r.header.Get("Tollgate-Request-Id")
	body, _ := json.Marshal(map[string]any{"request_id": id, "tenant_id": t.id, "actual_cost": actual})
	s := d.service(r.node, "/v1/settle", body)
	switch {
	case s.status == http.StatusOK:
		d.tally.inc("settled by api")
		t.add("settle", int64(actual), int64(actual))
	case s.lost || s.refused || s.status >= 500:
		d.tally.inc("settle unanswered")
		if s.status >= 500 {
			d.tally.fiveHundred(s.status, t.kind+" /v1/settle")
		}
		t.add("settle", int64(actual), costSettle)
	default:
		d.tally.oddity("%s: POST /v1/settle of a request admitted by the settle route: %d %s", t.kind, s.status, trim(s.body))
		t.add("settle", int64(actual), costSettle)
	}
}

// idempotent sends a request with an Idempotency-Key and, when admitted,
// its repeat, which must be answered from the stored answer.
func (d *driver) idempotent(t *tenant) {
	op := newID()
	path := "/api/p/idem?op=" + op
	h := map[string]string{"Idempotency-Key": op}
	r := d.metered(t, http.MethodPost, path, h)
	t.addReply("plain", r, costPlain)
	if r.status < 200 || r.status >= 300 {
		return
	}
	d.up.expectOnce(op)
	rr := d.metered(t, http.MethodPost, path, h)
	switch {
	case rr.status >= 200 && rr.status < 300 && rr.header.Get("Idempotent-Replayed") == "true":
		d.tally.inc("replayed")
	case rr.status >= 200 && rr.status < 300:
		d.tally.oddity("%s: a repeat of an admitted Idempotency-Key was answered %d without Idempotent-Replayed", t.kind, rr.status)
		t.add("plain", 0, costPlain)
	default:
		// Burst limits, a fault window: the repeat ran nothing.
	}
}

// check asks /v1/check for costCheck units and, when refund, gives them
// back with /v1/refund.
func (d *driver) check(t *tenant, refund bool) {
	body, _ := json.Marshal(map[string]any{"tenant_id": t.id, "meter": "check", "cost": costCheck})
	r := d.service(d.pick(), "/v1/check", body)
	var ans struct {
		Allowed   bool   `json:"allowed"`
		RequestID string `json:"request_id"`
		Status    int    `json:"status"`
		Degraded  bool   `json:"degraded"`
	}
	if r.status == http.StatusOK {
		if err := json.Unmarshal(r.body, &ans); err != nil {
			d.tally.oddity("%s: /v1/check answered 200 with %q: %v", t.kind, trim(r.body), err)
			t.add("check", 0, costCheck)
			return
		}
	}
	switch {
	case r.refused:
		d.tally.inc("connection refused")
		return
	case r.lost:
		d.tally.inc("lost")
		t.add("check", 0, costCheck)
		return
	case r.status >= 500:
		d.tally.inc("api 5xx")
		d.tally.fiveHundred(r.status, t.kind+" /v1/check")
		t.add("check", 0, costCheck)
		return
	case r.status != http.StatusOK:
		d.tally.oddity("%s: /v1/check answered %d %s", t.kind, r.status, trim(r.body))
		return
	case !ans.Allowed:
		d.tally.inc(fmt.Sprintf("refused %d", ans.Status))
		return
	}
	d.tally.inc("admitted")
	if ans.Degraded {
		d.tally.inc("admitted fail-open")
		t.failOpen("check")
	}
	if !refund {
		t.add("check", costCheck, costCheck)
		return
	}
	body, _ = json.Marshal(map[string]any{"tenant_id": t.id, "request_id": ans.RequestID})
	f := d.service(r.node, "/v1/refund", body)
	switch {
	case f.status == http.StatusOK:
		d.tally.inc("refunded by api")
	case f.lost || f.refused || f.status >= 500:
		d.tally.inc("refund unanswered")
		if f.status >= 500 {
			d.tally.fiveHundred(f.status, t.kind+" /v1/refund")
		}
		t.add("check", 0, costCheck)
	default:
		d.tally.oddity("%s: POST /v1/refund of an admitted check: %d %s", t.kind, f.status, trim(f.body))
		t.add("check", 0, costCheck)
	}
}

// service posts body to a service route of node n.
func (d *driver) service(n *node, path string, body []byte) reply {
	r := d.do(http.MethodPost, n.base+path, map[string]string{
		"Authorization": "Bearer " + d.serviceToken, "Content-Type": "application/json"}, body)
	r.node = n
	return r
}

func trim(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}

func newID() string {
	var b [12]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// upstream is the api's upstream, served by the soak on loopback: /p/ answers
// 200, /r/fail 503, /s/ its ?actual= in Tollgate-Actual-Cost (unless
// ?via=api), each after 0 to 100 ms; each answer it writes as a 5xx carries X-Soak-Upstream, so
// that the client tells them from the api's own. It counts how often each
// idempotent op ran.
type upstream struct {
	mu   sync.Mutex
	runs map[string]int // op id → times the upstream ran it
	srv  *http.Server
	base string
}

func startUpstream() (*upstream, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{runs: map[string]int{}, base: "http://" + l.Addr().String()}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(l) }()
	return u, nil
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Work takes a while, so that a node killed mid-run has requests in
	// flight whose answers are lost.
	time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond)
	q := r.URL.Query()
	if op := q.Get("op"); op != "" {
		u.mu.Lock()
		u.runs[op]++
		u.mu.Unlock()
	}
	switch {
	case r.URL.Path == "/r/fail":
		w.Header().Set("X-Soak-Upstream", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "upstream failed, as asked\n")
		return
	case len(r.URL.Path) >= 3 && r.URL.Path[:3] == "/s/" && q.Get("via") != "api":
		w.Header().Set("Tollgate-Actual-Cost", q.Get("actual"))
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, "ok\n")
}

// expectOnce notes an op whose upstream runs the audit counts.
func (u *upstream) expectOnce(op string) {
	u.mu.Lock()
	if _, ok := u.runs[op]; !ok {
		u.runs[op] = 0
	}
	u.mu.Unlock()
}

// twice are the ops the upstream ran more than once, and how many ops it
// counted.
func (u *upstream) twice() (ops, twice int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, n := range u.runs {
		ops++
		if n > 1 {
			twice++
		}
	}
	return ops, twice
}

// failOpen counts an admission a node's fail-open limiter answered.
func (t *tenant) failOpen(meter string) {
	t.mu.Lock()
	if t.degraded == nil {
		t.degraded = map[string]int64{}
	}
	t.degraded[meter]++
	t.mu.Unlock()
}

// addReply records the bounds of an answer to a request of cost c.
func (t *tenant) addReply(meter string, r reply, c int64) {
	lo, hi := bounds(r, c)
	t.add(meter, lo, hi)
}

// meterOf is the meter of a path of the soak's route table.
func meterOf(path string) string {
	switch {
	case strings.HasPrefix(path, "/api/r/"):
		return "refund"
	case strings.HasPrefix(path, "/api/s/"):
		return "settle"
	default:
		return "plain"
	}
}
