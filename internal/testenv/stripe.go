package testenv

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"
)

// StripeCall is one call a StripeProxy saw: the request, and what was
// answered.
type StripeCall struct {
	Method, Path   string
	IdempotencyKey string
	Form           url.Values // the form-encoded body
	Status         int        // the status answered
	ID             string     // the "id" of the JSON answer, if any
}

// StripeProxy is a recording reverse proxy on loopback between a Stripe
// client and a Stripe API (stripe-mock), which cannot be asked what it was
// sent: tests read the calls it forwarded, and can fail one.
type StripeProxy struct {
	// URL is the proxy's base URL, to give the client.
	URL string

	target string
	client *http.Client

	mu    sync.Mutex
	calls []StripeCall
	seen  int // calls received, failed or forwarded
	fail  func(n int, c StripeCall) int
	after func(n int, c StripeCall) (drop bool)
}

// NewStripeProxy starts a StripeProxy in front of the Stripe API at target
// until the test ends.
func NewStripeProxy(tb testing.TB, target string) *StripeProxy {
	tb.Helper()
	p := &StripeProxy{target: target, client: &http.Client{Timeout: 30 * time.Second}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	p.URL = "http://" + ln.Addr().String()
	return p
}

// FailWith sets a function asked before each call is forwarded, n counting
// the calls from 1: a status other than 0 answers the call with it and a
// Stripe API error instead of forwarding it. Nil forwards every call.
func (p *StripeProxy) FailWith(f func(n int, c StripeCall) int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail = f
}

// AfterForward sets a function called once a forwarded call's answer is
// recorded and before it is passed on; when it returns true, the answer is
// dropped and the connection cut, as for a client stopped (or killed)
// after Stripe acted on its call and before it heard back.
func (p *StripeProxy) AfterForward(f func(n int, c StripeCall) (drop bool)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.after = f
}

// Calls returns the calls seen so far, in order, and forgets them.
func (p *StripeProxy) Calls() []StripeCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.calls
	p.calls = nil
	return out
}

// ServeHTTP records r and forwards it to the target, or fails it.
func (p *StripeProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	form, _ := url.ParseQuery(string(body))
	c := StripeCall{Method: r.Method, Path: r.URL.Path, IdempotencyKey: r.Header.Get("Idempotency-Key"), Form: form}
	p.mu.Lock()
	p.seen++
	n := p.seen
	fail, after := p.fail, p.after
	p.mu.Unlock()

	if fail != nil {
		if status := fail(n, c); status != 0 {
			c.Status = status
			p.record(c)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Request-Id", "req_proxy_failed")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"error":{"type":"api_error","message":"the test's proxy failed this call"}}`))
			return
		}
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := p.client.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	var obj struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(answer, &obj)
	c.Status, c.ID = resp.StatusCode, obj.ID
	p.record(c)
	if after != nil && after(n, c) {
		panic(http.ErrAbortHandler)
	}
	for k, vs := range resp.Header {
		if k == "Content-Length" {
			continue
		}
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

func (p *StripeProxy) record(c StripeCall) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, c)
}
