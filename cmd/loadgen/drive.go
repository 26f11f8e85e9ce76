package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/httpapi/benchpeer"
)

// A driver runs one row's closed loop: conns connections, each sending
// its next request as soon as the previous one is answered, for d: the
// saturating rate. Latency is each request's round trip. An error means
// the driver could not run; failed requests are in the Result.
type driver interface {
	closedLoop(ctx context.Context, t *target, d time.Duration, conns int) (Result, error)
	String() string
}

// ownDriver is loadgen's own closed loop (closedLoop), also bounded by
// max requests a row.
type ownDriver struct{ max int64 }

func (o ownDriver) closedLoop(_ context.Context, t *target, d time.Duration, conns int) (Result, error) {
	return closedLoop(t, d, o.max, conns), nil
}

func (ownDriver) String() string { return "loadgen's own (fasthttp, a goroutine per connection)" }

// target is one row's request, sent through a fasthttp HostClient of its
// own: one connection per driving goroutine, kept alive, no net/http.
type target struct {
	row    string
	client *fasthttp.HostClient
	method string
	base   string   // scheme and host
	uri    string   // base + path
	auth   string   // Authorization header, if any
	keys   []string // else values of benchpeer.KeyHeader, sent round robin
	body   []byte   // JSON body, if any
	want   int      // the status that counts as success
	refuse int      // a status counted as a refusal, not an error (0: none)
}

func newTarget(row, base, method, path string, want, conns int) (*target, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	base = strings.TrimSuffix(base, "/")
	return &target{row: row, method: method, base: base, uri: base + path, want: want, client: &fasthttp.HostClient{
		Addr: u.Host, Name: "tollgate-loadgen", MaxConns: conns, MaxConnWaitTimeout: 10 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, MaxIdleConnDuration: time.Minute,
	}}, nil
}

// newRequest returns the target's request and a response to reuse for
// every send, released by release.
func (t *target) newRequest() (req *fasthttp.Request, resp *fasthttp.Response, release func()) {
	req, resp = fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	req.Header.SetMethod(t.method)
	req.SetRequestURI(t.uri)
	if t.auth != "" {
		req.Header.Set("Authorization", t.auth)
	}
	if t.body != nil {
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(t.body)
	}
	return req, resp, func() { fasthttp.ReleaseRequest(req); fasthttp.ReleaseResponse(resp) }
}

// errRefused is send's answer to the status t.refuse: a refusal, counted
// apart from the errors.
var errRefused = errors.New("refused")

// send sends req once and says what went wrong, if anything.
func (t *target) send(req *fasthttp.Request, resp *fasthttp.Response) error {
	if err := t.client.Do(req, resp); err != nil {
		return err
	}
	if t.refuse != 0 && resp.StatusCode() == t.refuse {
		return errRefused
	}
	if resp.StatusCode() != t.want {
		return fmt.Errorf("status %d, want %d: %.200s", resp.StatusCode(), t.want, resp.Body())
	}
	return nil
}

// Result is one row's measurement.
type Result struct {
	Row      string
	Requests int64 // answered or failed
	OK       int64 // answered with the wanted status
	Refused  int64 // answered with the target's refuse status
	RPS      float64
	P50, P99 time.Duration
	Errors   int64
	FirstErr string
}

// tally collects the latencies and errors of one row's goroutines.
type tally struct {
	lat      [][]time.Duration // per goroutine
	errors   atomic.Int64
	refused  atomic.Int64
	firstErr sync.Once
	first    string
}

func newTally(conns int) *tally { return &tally{lat: make([][]time.Duration, conns)} }

func (t *tally) fail(err error) {
	if errors.Is(err, errRefused) {
		t.refused.Add(1)
		return
	}
	t.errors.Add(1)
	t.firstErr.Do(func() { t.first = err.Error() })
}

func (t *tally) result(row string, elapsed time.Duration) Result {
	var all []time.Duration
	for _, l := range t.lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	r := Result{Row: row, Requests: int64(len(all)), Errors: t.errors.Load(), Refused: t.refused.Load(), FirstErr: t.first}
	r.OK = r.Requests - r.Errors - r.Refused
	if len(all) > 0 && elapsed > 0 {
		r.RPS = float64(len(all)) / elapsed.Seconds()
		r.P50, r.P99 = percentile(all, 50), percentile(all, 99)
	}
	return r
}

// percentile is the nearest-rank percentile p of sorted, not empty.
func percentile(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100 // ceil(n·p/100), 1-based
	return sorted[max(i, 1)-1]
}

// closedLoop drives t from conns goroutines, each sending its next request
// as soon as the previous one is answered, for d or limit requests: the
// saturating rate. Latency is each request's round trip. With t.keys, each
// goroutine sends them in turn, from its own place among them.
func closedLoop(t *target, d time.Duration, limit int64, conns int) Result {
	var sent atomic.Int64
	tl := newTally(conns)
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for w := range conns {
		wg.Go(func() {
			req, resp, release := t.newRequest()
			defer release()
			lat := make([]time.Duration, 0, 1<<14)
			key := w * len(t.keys) / conns // each connection from its own place, in turn
			for sent.Add(1) <= limit {
				t0 := time.Now()
				if !t0.Before(stop) {
					break
				}
				if len(t.keys) > 0 {
					req.Header.Set(benchpeer.KeyHeader, t.keys[key])
					key = (key + 1) % len(t.keys)
				}
				err := t.send(req, resp)
				lat = append(lat, time.Since(t0))
				if err != nil {
					tl.fail(err)
				}
			}
			tl.lat[w] = lat
		})
	}
	wg.Wait()
	return tl.result(t.row, time.Since(start))
}

// openLoop sends t's requests on a fixed schedule, rate a second for d (at
// most limit), from up to conns goroutines: request i is due at start +
// i/rate whatever happened to the others, so a slow answer cannot slow the
// load down and hide itself (coordinated omission).
//
// Latency runs from the request's due time when it left late because every
// goroutine was busy with earlier requests: that wait is the server's doing.
// A goroutine that was idle and asleep until the due time measures from
// when it woke, so that the client's own timer slack is not charged to the
// server: the Go runtime wakes sleepers with millisecond granularity when
// it is idle, and later still on a busy machine (0.6 ms median, 4 ms p99
// measured on the 2 shared cores of the bench, against a 0.1 ms bare answer).
func openLoop(t *target, rate float64, d time.Duration, limit int64, conns int) Result {
	n := min(int64(d.Seconds()*rate), limit)
	var next atomic.Int64
	tl := newTally(conns)
	var wg sync.WaitGroup
	start := time.Now().Add(10 * time.Millisecond)
	for w := range conns {
		wg.Go(func() {
			req, resp, release := t.newRequest()
			defer release()
			lat := make([]time.Duration, 0, n/int64(conns)+16)
			for {
				i := next.Add(1) - 1
				if i >= n {
					break
				}
				due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
				from := due
				if wait := time.Until(due); wait > 0 {
					time.Sleep(wait)
					from = time.Now()
				}
				err := t.send(req, resp)
				lat = append(lat, time.Since(from))
				if err != nil {
					tl.fail(err)
				}
			}
			tl.lat[w] = lat
		})
	}
	wg.Wait()
	return tl.result(t.row, time.Since(start))
}
