package locallimit

import (
	"errors"
	"sync"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// The window of Adaptive: adaptiveBuckets buckets of adaptiveBucket us,
// 1 s; the gain cycle is one window long.
const (
	adaptiveBucket  = int64(100 * time.Millisecond / time.Microsecond)
	adaptiveBuckets = 10
	adaptiveWindow  = adaptiveBucket * adaptiveBuckets
	probeBucket     = 5 // the bucket of the cycle that probes
	maxDrainBuckets = 3 // the most buckets of the cycle that drain
	// maxLatency caps a recorded latency (an hour), so that the sums of a
	// bucket stay far from overflowing whatever the caller's clock says.
	maxLatency = int64(time.Hour / time.Microsecond)
)

// ErrNotInFlight is Done's answer when no request is in flight: a Done
// without its Acquire, or a second Done of one request. It records
// nothing.
var ErrNotInFlight = errors.New("locallimit: adaptive: Done without a request in flight")

// Adaptive is the adaptive algorithm (quota.AlgAdaptive): node-local load
// shedding in the manner of Sentinel's BBR system rule and Kratos' BBR
// limiter. It counts the requests in flight on this node and refuses one
//
//   - when MaxConcurrency are in flight, always; and
//   - while the node is overloaded, when more than 1 are in flight and more
//     than the pipe the node can serve, maxPass × minRT: the most
//     completions per second times the least latency over the last second
//     (Little's law: the concurrency at which the node completes the most
//     without queueing; BBR's bandwidth-delay product). That is Sentinel's
//     and Kratos' rule as they write it, "in flight > 1 && in flight >
//     maxPass × minRT", in flight counted before the request.
//
// Acquire admits exactly while in flight < limit, the limit that State
// reports: MaxConcurrency, or while overloaded min(MaxConcurrency,
// max(2, ⌊gain × maxPass × minRT⌋ + 1)).
//
// Measures. The caller's clock is cut in buckets of 100 ms; the window is
// the 10 completed buckets before the current one (1 s). Done records a
// completion and its latency in the bucket of its time. minRT is the least
// mean latency of a bucket of the window (Kratos' rule: a bucket's mean,
// not the fastest request, which a cache hit would make tiny); maxPass is
// the most completions of k consecutive buckets of the window, per second,
// where k is the buckets the window's mean latency lasts (1 for latencies
// up to 100 ms, at most 10): counted over a span shorter than the latency,
// completions come in clumps, and their maximum overstates the rate. With
// no completion in the window there is no estimate, and only
// MaxConcurrency applies.
//
// Trigger. Sentinel arms its BBR check when the system load or the CPU
// usage passes a threshold, Kratos when the CPU does; Adaptive arms it when
// the recent latency (the mean of the completions of the current and the
// previous bucket) is above TargetLatency, a signal every node has without
// reading its host. The check stays armed for a window (1 s) after the
// recent latency was last seen above the target, as Kratos keeps its check
// for a second after its trigger drops: the shedding brings the latency
// down at once, and dropping the check then would let the pipe it just
// drained fill again. Then the limit comes back the way TCP's slow start
// does: twice the estimate, doubling every max(100 ms, 2 × minRT), until
// MaxConcurrency, so that a node still overloaded finds it out from a
// latency a few round trips old rather than from a flood. A node whose
// latency stays below the target enforces nothing but MaxConcurrency: its
// pipe grows freely, and the estimate follows it.
//
// Gain. While armed, the estimate is multiplied by BBR's pacing gains, in
// a cycle one window long: 5/4 in bucket 5 of each second (probing: if
// more in flight completes more, maxPass grows) and 3/4 in its first k
// buckets (at most 3; draining: the queue empties, so that minRT measures
// the node's latency rather than its queue's). Without them the estimate
// only measures itself: a node held at n in flight completes with the
// latency of n in flight, and maxPass × minRT is n again, plus what the max
// of one and the min of the other add, and the "+ 1" of the rule.
// Simulated without them, the limit drifted up without end (the latency
// with it) in every overload that outlasted a few windows, strong or mild,
// with the target above or below the node's unloaded latency; with them it
// settles near the pipe (TestAdaptiveShedsOverload, TestAdaptiveSettles).
// The cost is a drained bucket a second: a few percent of the throughput
// while the check is armed.
//
// Times are the caller's clock, int64 microseconds (the now of Acquire and
// Done): Adaptive reads none of its own. A time earlier than the latest it
// has seen counts as the latest (callers read their clocks before taking
// its lock). An Adaptive is safe for concurrent use; make one with
// NewAdaptive.
type Adaptive struct {
	max    int64 // MaxConcurrency
	target int64 // TargetLatency, us

	mu       sync.Mutex
	inflight int64
	now      int64                       // the latest time seen, us (>= 0)
	buckets  [adaptiveBuckets + 1]bucket // the window's and the current one
	hot      bool                        // armed or recovering
	hotAt    int64                       // the latest time the recent latency was above target
	limit    int64                       // the limit in force at the latest call (State)

	// The estimate as of bucket estID (it changes only when a bucket
	// completes): est requests, found or not, over spans of span buckets,
	// with minRT us.
	estID, span, minRT int64
	est                float64
	estOK              bool

	// The limit before gains, and its minRT, at the latest armed call:
	// where the recovery starts.
	held, heldRT int64
}

// bucket holds the completions of one bucket: id is its start /
// adaptiveBucket; a bucket whose id is not one the reader wants is stale
// and counts as empty.
type bucket struct {
	id    int64
	pass  int64 // completions
	rtSum int64 // the sum of their latencies, us
}

// NewAdaptive returns an Adaptive admitting at most maxConcurrency requests
// at once (1 to quota.MaxConcurrencyLimit) and shedding past its estimate
// while the latency is above targetLatency (1 µs to
// quota.MaxTargetLatencyMS ms). Bad bounds are a CodeInvalid *quota.Error
// on the policy field.
func NewAdaptive(maxConcurrency int64, targetLatency time.Duration) (*Adaptive, error) {
	if maxConcurrency < 1 || maxConcurrency > quota.MaxConcurrencyLimit {
		return nil, quota.FieldError("max_concurrency", "must be an integer between 1 and %d", quota.MaxConcurrencyLimit)
	}
	if targetLatency < time.Microsecond || targetLatency > quota.MaxTargetLatencyMS*time.Millisecond {
		return nil, quota.FieldError("target_latency_ms", "must be between 1 µs and %d ms", quota.MaxTargetLatencyMS)
	}
	return &Adaptive{max: maxConcurrency, target: int64(targetLatency / time.Microsecond),
		limit: maxConcurrency, estID: -1}, nil
}

// Acquire decides on a request at now (us). When it admits, the request is
// in flight until its Done. When it refuses, retry is a hint of when to try
// again: the recent latency (the time the requests in flight take to
// finish), at least a bucket (100 ms, when the estimate is next revised)
// and at most the window (1 s).
func (a *Adaptive) Acquire(now int64) (ok bool, retry time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.advance(now)
	if a.inflight >= a.limitNow() {
		rt, _ := a.recent()
		return false, time.Duration(min(max(rt, adaptiveBucket), adaptiveWindow)) * time.Microsecond
	}
	a.inflight++
	return true, 0
}

// Done ends a request Acquire admitted: now is when it finished and
// started the now its Acquire was given (us). Its latency, now - started
// (0 when negative, at most an hour), counts in the bucket of now. With no
// request in flight it returns ErrNotInFlight and changes nothing.
func (a *Adaptive) Done(now, started int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inflight == 0 {
		return ErrNotInFlight
	}
	a.inflight--
	b := &a.buckets[slot(a.advance(now))]
	if now > started {
		// A difference past int64's range wraps below 0: it is past
		// maxLatency too.
		d := now - started
		if d < 0 || d > maxLatency {
			d = maxLatency
		}
		b.rtSum += d
	}
	b.pass++
	a.heat()
	a.limitNow()
	return nil
}

// Cancel ends a request Acquire admitted that never ran (another limit
// refused it): it leaves the flight without a latency or a completion, so
// that the estimate learns nothing from it. With no request in flight it
// returns ErrNotInFlight.
func (a *Adaptive) Cancel() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inflight == 0 {
		return ErrNotInFlight
	}
	a.inflight--
	return nil
}

// State reports the requests in flight and the limit in force as of the
// latest Acquire or Done (see Adaptive). Acquire admits exactly while
// inflight < limit, so that a RateLimit header can show limit and limit -
// inflight.
func (a *Adaptive) State() (inflight, limit int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inflight, a.limit
}

// advance moves the clock to now (or keeps the latest time seen, when
// later), clears the bucket it enters and updates the trigger; it returns
// the current bucket's id.
func (a *Adaptive) advance(now int64) int64 {
	a.now = max(a.now, now)
	id := a.now / adaptiveBucket
	if b := &a.buckets[slot(id)]; b.id != id {
		*b = bucket{id: id}
	}
	a.heat()
	return id
}

// heat arms the check when the recent latency is above the target.
func (a *Adaptive) heat() {
	if rt, ok := a.recent(); ok && rt > a.target {
		a.hot, a.hotAt = true, a.now
	}
}

// recent returns the mean latency of the completions of the current and
// the previous bucket, and whether there are any.
func (a *Adaptive) recent() (int64, bool) {
	id := a.now / adaptiveBucket
	var pass, sum int64
	for _, i := range []int64{id, id - 1} {
		if i < 0 {
			continue
		}
		if b := &a.buckets[slot(i)]; b.id == i {
			pass += b.pass
			sum += b.rtSum
		}
	}
	if pass == 0 {
		return 0, false
	}
	return sum / pass, true
}

// limitNow computes the limit in force at a.now and keeps it for State.
func (a *Adaptive) limitNow() int64 {
	a.limit = a.max
	if !a.hot {
		return a.limit
	}
	if since := a.now - a.hotAt; since >= adaptiveWindow {
		// recovering: double from the held limit every step
		step := max(adaptiveBucket, 2*a.heldRT)
		if n := (since-adaptiveWindow)/step + 1; a.held > 0 && n < 20 && a.held<<n < a.max {
			a.limit = a.held << n
		} else {
			a.hot = false
		}
		return a.limit
	}
	est, ok := a.estimate()
	if !ok {
		return a.limit
	}
	pipe := func(est float64) int64 { return min(a.max, max(2, int64(est)+1)) }
	a.held, a.heldRT = pipe(est), a.minRT
	switch phase := (a.now / adaptiveBucket) % adaptiveBuckets; {
	case phase < min(a.span, maxDrainBuckets):
		est *= 0.75
	case phase == probeBucket:
		est *= 1.25
	}
	a.limit = pipe(est)
	return a.limit
}

// estimate returns maxPass × minRT over the window (in requests), and
// whether the window saw a completion; it sets a.span and a.minRT.
func (a *Adaptive) estimate() (float64, bool) {
	id := a.now / adaptiveBucket
	if id == a.estID {
		return a.est, a.estOK
	}
	a.estID, a.est, a.estOK = id, 0, false
	var pass, sum [adaptiveBuckets]int64 // the window, oldest first
	var total, totalSum int64
	for i := range adaptiveBuckets {
		bid := id - adaptiveBuckets + int64(i)
		if bid < 0 {
			continue
		}
		if b := &a.buckets[slot(bid)]; b.id == bid {
			pass[i], sum[i] = b.pass, b.rtSum
			total += b.pass
			totalSum += b.rtSum
		}
	}
	if total == 0 {
		return 0, false
	}
	k := min(adaptiveBuckets, max(1, (totalSum/total+adaptiveBucket-1)/adaptiveBucket))
	var maxPass int64 // completions of k consecutive buckets
	for i := range adaptiveBuckets - k + 1 {
		var p int64
		for _, n := range pass[i : i+k] {
			p += n
		}
		maxPass = max(maxPass, p)
	}
	minRT := int64(-1)
	for i, n := range pass {
		if rt := sum[i] / max(1, n); n > 0 && (minRT < 0 || rt < minRT) {
			minRT = rt
		}
	}
	// completions per span × latency / span length: completions per
	// second × latency in seconds
	a.span, a.minRT = k, minRT
	a.est, a.estOK = float64(maxPass)*float64(minRT)/float64(k*adaptiveBucket), true
	return a.est, true
}

// slot is the index of bucket id in the ring; id >= 0.
func slot(id int64) int { return int(id % (adaptiveBuckets + 1)) }
