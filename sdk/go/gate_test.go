package tollgate_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tollgate "github.com/tollgate/tollgate/sdk/go"
)

// clock is a settable clock for the deny cache.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func get(tb testing.TB, url, key string) answer {
	tb.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}
}

// checkAnswer is the JSON of a /v1/check answer.
type checkAnswer struct {
	Allowed bool              `json:"allowed"`
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Problem json.RawMessage   `json:"problem"`
}

func lastCheck(tb testing.TB, c *counter) checkAnswer {
	tb.Helper()
	var a checkAnswer
	if err := json.Unmarshal(c.lastCheck(), &a); err != nil {
		tb.Fatalf("the last /v1/check answer: %v", err)
	}
	return a
}

// sameAsCheck fails unless got is the check's answer relayed unchanged:
// its status, each of its headers, and its problem byte for byte.
func sameAsCheck(tb testing.TB, what string, got answer, want checkAnswer) {
	tb.Helper()
	if got.status != want.Status {
		tb.Errorf("%s: status %d, want the check's %d", what, got.status, want.Status)
	}
	for k, v := range want.Headers {
		if got.header.Get(k) != v {
			tb.Errorf("%s: header %s %q, want the check's %q", what, k, got.header.Get(k), v)
		}
	}
	if !want.Allowed && string(got.body) != string(want.Problem) {
		tb.Errorf("%s: body\n%s\nwant the check's problem byte for byte\n%s", what, got.body, want.Problem)
	}
}

func TestMiddlewareRelaysAndCachesRefusals(t *testing.T) {
	s := sharedStack(t)
	tn := s.newTenant(t, 2)
	cnt := newCounter()
	clk := &clock{now: time.Now()}
	g := tollgate.NewGate(s.serviceClient(cnt), tollgate.GateOptions{Meter: "calls", Now: clk.Now})
	var served atomic.Int64
	h := g.Middleware(tollgate.HTTPOptions{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		a, ok := tollgate.AdmissionFrom(r.Context())
		if !ok || a.RequestID == "" || a.TenantID != tn.id {
			t.Errorf("admission in the handler's context: %+v, want one with a request id of tenant %s", a, tn.id)
		}
		_, _ = io.WriteString(w, "served")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	for i := 1; i <= 2; i++ {
		got := get(t, srv.URL+"/things", tn.key)
		if got.status != 200 || string(got.body) != "served" {
			t.Fatalf("request %d of 2 allowed: %d %q, want 200 served", i, got.status, got.body)
		}
		if got.header.Get("RateLimit-Policy") == "" {
			t.Fatalf("request %d: no RateLimit-Policy relayed (%v)", i, got.header)
		}
		sameAsCheck(t, "admitted", got, lastCheck(t, cnt))
	}
	refused := get(t, srv.URL+"/things", tn.key)
	want := lastCheck(t, cnt)
	if refused.status != 429 || want.Allowed {
		t.Fatalf("third request: %d, want 429", refused.status)
	}
	sameAsCheck(t, "refused", refused, want)
	if refused.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(refused.body), `"instance":"/things"`) {
		t.Errorf("refusal: %s %s, want a problem+json naming /things", refused.header.Get("Content-Type"), refused.body)
	}
	wait, err := strconv.Atoi(refused.header.Get("Retry-After"))
	if err != nil || wait < 1 {
		t.Fatalf("Retry-After %q, want seconds", refused.header.Get("Retry-After"))
	}
	if served.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2 (not for the refusal)", served.Load())
	}

	// Until Retry-After passes, refusals are answered here, without a call.
	checks := cnt.count("/v1/check")
	clk.Add(time.Duration(wait-1) * time.Second)
	local := get(t, srv.URL+"/things", tn.key)
	if cnt.count("/v1/check") != checks {
		t.Fatalf("a refused key within its Retry-After reached Tollgate (%d checks, want %d)", cnt.count("/v1/check"), checks)
	}
	if local.status != 429 || string(local.body) != string(refused.body) || local.header.Get("Retry-After") != "1" {
		t.Fatalf("local refusal: %d Retry-After %q %s, want 429, 1 s left, the same problem", local.status, local.header.Get("Retry-After"), local.body)
	}
	if st := g.Stats(); st.LocalRefusals != 1 || st.Checks != int64(checks) {
		t.Errorf("stats %+v, want 1 local refusal and %d checks", st, checks)
	}
	clk.Add(time.Second)
	get(t, srv.URL+"/things", tn.key)
	if cnt.count("/v1/check") != checks+1 {
		t.Fatalf("after Retry-After: %d checks, want %d (asked again)", cnt.count("/v1/check"), checks+1)
	}

	// No key: refused here. An unknown key: Tollgate's 401 relayed.
	if a := get(t, srv.URL+"/things", ""); a.status != 401 || a.header.Get("Content-Type") != "application/problem+json" || cnt.count("/v1/check") != checks+1 {
		t.Errorf("no key: %d %s after %d checks, want a local 401 problem", a.status, a.body, cnt.count("/v1/check"))
	}
	if a := get(t, srv.URL+"/things", "tg_unknown"); a.status != 401 || !strings.Contains(string(a.body), `"status":401`) {
		t.Errorf("unknown key: %d %s, want Tollgate's 401 problem", a.status, a.body)
	}
	if served.Load() != 2 {
		t.Errorf("handler ran %d times, want 2", served.Load())
	}
}

func TestMiddlewareMeterCostAndXAPIKey(t *testing.T) {
	s := sharedStack(t)
	tn := s.newTenant(t, 10)
	g := tollgate.NewGate(s.serviceClient(newCounter()), tollgate.GateOptions{})
	h := g.Middleware(tollgate.HTTPOptions{
		Meter: func(r *http.Request) string { return "m." + strings.TrimPrefix(r.URL.Path, "/") },
		Cost:  func(r *http.Request) int64 { n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64); return n },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/search?n=7", nil)
	req.Header.Set("X-API-Key", tn.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("X-API-Key request: %d, want 200", resp.StatusCode)
	}
	u, err := tollgate.NewTenantClient(s.base, tn.key).Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if daily(t, u.Limits) != 3 || len(u.Meters) != 1 || u.Meters[0].Meter != "m.search" || u.Meters[0].Units != 7 {
		t.Fatalf("usage: daily remaining %d meters %+v, want 3 left and 7 units of m.search", daily(t, u.Limits), u.Meters)
	}
}

func TestMiddlewareRefundsServerErrors(t *testing.T) {
	s := sharedStack(t)
	tn := s.newTenant(t, 10)
	c := s.serviceClient(newCounter())
	var ids []string
	var mu sync.Mutex
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, _ := tollgate.AdmissionFrom(r.Context())
		mu.Lock()
		ids = append(ids, a.RequestID)
		mu.Unlock()
		if r.URL.Path == "/fail" {
			http.Error(w, "broken", http.StatusInternalServerError)
		}
	})
	var reported atomic.Int64
	refunding := httptest.NewServer(tollgate.NewGate(c, tollgate.GateOptions{Meter: "calls", RefundOnServerError: true,
		OnError: func(error) { reported.Add(1) }}).Middleware(tollgate.HTTPOptions{})(handler))
	defer refunding.Close()
	keeping := httptest.NewServer(tollgate.NewGate(c, tollgate.GateOptions{Meter: "calls"}).Middleware(tollgate.HTTPOptions{})(handler))
	defer keeping.Close()

	remaining := func() int64 {
		return daily(t, mustCheck(t, c, tn.key, "calls", 1, true).Limits) + 1
	}
	if a := get(t, refunding.URL+"/fail", tn.key); a.status != 500 {
		t.Fatalf("/fail: %d, want the handler's 500", a.status)
	}
	if got := remaining(); got != 10 {
		t.Fatalf("after a refunded 500: %d remaining, want 10", got)
	}
	mu.Lock()
	first := ids[0]
	mu.Unlock()
	if _, err := c.Refund(context.Background(), tn.id, first); !tollgate.IsConflict(err) {
		t.Fatalf("refund of the request the middleware refunded: %v, want 409 refunded before", err)
	}
	get(t, refunding.URL+"/ok", tn.key)
	if got := remaining(); got != 9 {
		t.Fatalf("after a 200: %d remaining, want 9 (not refunded)", got)
	}
	get(t, keeping.URL+"/fail", tn.key)
	if got := remaining(); got != 8 {
		t.Fatalf("after a 500 without RefundOnServerError: %d remaining, want 8", got)
	}
	if reported.Load() != 0 {
		t.Errorf("%d errors reported, want none", reported.Load())
	}
}

func TestMiddlewareFailModes(t *testing.T) {
	s := sharedStack(t)
	tn := s.newTenant(t, 100)
	base, stop, err := s.startAPI(binaries(t))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	c := tollgate.NewServiceClient(base, serviceToken, tollgate.WithTimeout(2*time.Second))
	var outages atomic.Int64
	onErr := func(err error) {
		if tollgate.IsOutage(err) {
			outages.Add(1)
		}
	}
	var served atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		if a, _ := tollgate.AdmissionFrom(r.Context()); a.Outage != nil {
			w.Header().Set("X-Outage", "yes")
		}
	})
	open := httptest.NewServer(tollgate.NewGate(c, tollgate.GateOptions{FailOpen: true, OnError: onErr}).Middleware(tollgate.HTTPOptions{})(handler))
	defer open.Close()
	closed := httptest.NewServer(tollgate.NewGate(c, tollgate.GateOptions{OnError: onErr}).Middleware(tollgate.HTTPOptions{})(handler))
	defer closed.Close()

	for _, srv := range []*httptest.Server{open, closed} {
		if a := get(t, srv.URL, tn.key); a.status != 200 || a.header.Get("Tollgate-Degraded") != "" {
			t.Fatalf("with Tollgate up: %d degraded %q, want 200 undegraded", a.status, a.header.Get("Tollgate-Degraded"))
		}
	}
	stop()
	a := get(t, open.URL, tn.key)
	if a.status != 200 || a.header.Get("Tollgate-Degraded") != "fail-open" || a.header.Get("X-Outage") != "yes" {
		t.Fatalf("fail-open with Tollgate stopped: %d degraded %q outage %q, want 200 served, marked", a.status, a.header.Get("Tollgate-Degraded"), a.header.Get("X-Outage"))
	}
	a = get(t, closed.URL, tn.key)
	var p tollgate.Problem
	if a.status != 503 || a.header.Get("Content-Type") != "application/problem+json" || json.Unmarshal(a.body, &p) != nil || p.Status != 503 || a.header.Get("Retry-After") == "" {
		t.Fatalf("fail-closed with Tollgate stopped: %d %s %s, want a 503 problem with Retry-After", a.status, a.header.Get("Content-Type"), a.body)
	}
	if served.Load() != 3 || outages.Load() != 2 {
		t.Fatalf("served %d, outages %d: want 3 served (2 up, 1 fail-open) and 2 outages reported", served.Load(), outages.Load())
	}

	// A 5xx is an outage too: a proxy in front of Tollgate without a backend.
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no backend", http.StatusBadGateway)
	}))
	defer proxy.Close()
	var last atomic.Value
	g := tollgate.NewGate(tollgate.NewServiceClient(proxy.URL, serviceToken), tollgate.GateOptions{OnError: func(err error) { last.Store(err) }})
	adm := g.Admit(context.Background(), tn.key, "calls", 1, "/x")
	var oe *tollgate.OutageError
	if adm.Allowed || adm.Status != 503 || !errors.As(adm.Outage, &oe) || oe.Status != 502 || last.Load() == nil {
		t.Fatalf("behind a 502: %+v (%v), want refused 503 with an outage of status 502", adm, adm.Outage)
	}
}
