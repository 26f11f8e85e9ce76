package policyalg

import (
	"math"

	"github.com/tollgate/tollgate/internal/quota"
)

// The rate algorithms: token_bucket, gcra, leaky_bucket and warm_up, the
// models of lua/policy_rates.lua (whose header states each algorithm, its
// reporting and its guarantee in full). Each model's state is what the
// algorithm's Redis key holds; a key that expired or was deleted is the
// state a model reaches by time alone (a full bucket, a drained queue, a
// cold warm_up), so the models never forget anything and still answer as
// the script does.

func init() {
	constructors[quota.AlgTokenBucket] = func(p Params) Model { return NewTokenBucket(p) }
	constructors[quota.AlgGCRA] = func(p Params) Model { return NewGCRA(p) }
	constructors[quota.AlgLeakyBucket] = func(p Params) Model { return NewLeakyBucket(p) }
	constructors[quota.AlgWarmUp] = func(p Params) Model { return NewWarmUp(p) }
}

// rateMaxDebt is the longest time (us) a rate state may hold: quota's
// MaxWindowMicros, 2^50 us. A request whose weight would take longer is
// refused as never (retry -1), so that every time stays exact in the
// script's doubles.
const rateMaxDebt = quota.MaxWindowMicros

// rateFloor is division rounding toward minus infinity, as the scripts'
// idiv; b > 0.
func rateFloor(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// rateRoom is floor((n - x)/u), at least 0.
func rateRoom(n, x, u int64) int64 {
	return max(0, rateFloor(n-x, u))
}

// vsched is the virtual-scheduling arithmetic of the token bucket and GCRA
// (lua/admit.lua's): c units of capacity, u us per unit, the time at which
// all of the capacity is back, and when that time was written.
type vsched struct {
	c, u int64
	at   int64 // FULL (token bucket) or TAT (GCRA), us; 0 = none
	wr   int64 // when at was written (an admission's now), us
}

// check decides w at now; next is the state after an admission.
func (v *vsched) check(now, w int64) (r Result, next int64) {
	cu := v.c * v.u
	// The clamp: a time written under other limits is read as the most
	// indebted state the current ones allowed when it was written (see
	// lua/policy_rates.lua: a refusal writes nothing, so the bound is
	// taken at the write, not at now).
	f := max(min(v.at, v.wr+cu), now)
	r.Limit = v.c
	if w > v.c {
		r.Retry, r.Remaining, r.Reset = -1, rateRoom(cu, f-now, v.u), f
		return r, 0
	}
	next = f + w*v.u
	if next-now > cu {
		r.Retry, r.Remaining, r.Reset = next-cu-now, rateRoom(cu, f-now, v.u), f
		return r, 0
	}
	r.OK, r.Remaining, r.Reset = true, rateRoom(cu, next-now, v.u), next
	return r, next
}

// commit writes the admission of w at now (when check admits it).
func (v *vsched) commit(now, w int64) {
	if r, next := v.check(now, w); r.OK {
		v.at, v.wr = next, now
	}
}

// undo moves the time back by w units (none when there is no state, or w
// exceeds the capacity: such a request was never admitted).
func (v *vsched) undo(w int64) {
	if w <= v.c && v.at != 0 {
		v.at -= w * v.u
	}
}

// TokenBucket is token_bucket: Capacity units, refilled one per U us,
// continuously; a request takes its weight in tokens. Its state is FULL,
// the time the bucket is full again (tokens(now) = Capacity - max(0,
// FULL-now)/U). In any window of t us at most Capacity + t/U units pass.
// Params: capacity, U.
type TokenBucket struct{ v vsched }

// NewTokenBucket returns a full bucket of p.
func NewTokenBucket(p Params) *TokenBucket { return &TokenBucket{vsched{c: p[0], u: p[1]}} }

// Check decides a request of w units at now: admitted iff w tokens are
// there. Limit is the capacity, Remaining the whole tokens left, Reset when
// the bucket is full again, Retry when w tokens will be there (-1 when w
// exceeds the capacity).
func (m *TokenBucket) Check(now, w int64) Result { r, _ := m.v.check(now, w); return r }

// Commit takes w tokens at now, when Check admits them.
func (m *TokenBucket) Commit(now, w int64, _ string) { m.v.commit(now, w) }

// Undo gives w tokens back: FULL -= w*U.
func (m *TokenBucket) Undo(_, w int64, _ string) { m.v.undo(w) }

// Release does nothing.
func (m *TokenBucket) Release(int64, string) {}

// Full is the state: the time (us) the bucket is full again, and when it
// was written.
func (m *TokenBucket) Full() (full, written int64) { return m.v.at, m.v.wr }

// Reparam changes the limits, keeping the state (the policy was edited;
// its key stays). Check clamps FULL to the new limits as of its write.
func (m *TokenBucket) Reparam(p Params) { m.v.c, m.v.u = p[0], p[1] }

// GCRA is gcra: the generic cell rate algorithm of the tier limits
// (lua/admit.lua) with a weight: one request (unit) per T us, Burst of them
// at once. Its state is TAT, the theoretical arrival time. In any window of
// t us at most Burst + t/T requests (units) pass. Params: burst, T.
type GCRA struct{ v vsched }

// NewGCRA returns a GCRA of p with no history.
func NewGCRA(p Params) *GCRA { return &GCRA{vsched{c: p[0], u: p[1]}} }

// Check decides w at now: tat = max(min(TAT, W + B*T), now) (W the time
// TAT was written: the clamp after a change of limits), admitted iff tat +
// w*T - now <= B*T. Limit is the burst, Remaining the requests that would
// still pass at once, Reset the new TAT (the old one when refused), Retry
// the wait (-1 when w exceeds the burst).
func (m *GCRA) Check(now, w int64) Result { r, _ := m.v.check(now, w); return r }

// Commit moves TAT by w*T, when Check admits w.
func (m *GCRA) Commit(now, w int64, _ string) { m.v.commit(now, w) }

// Undo moves TAT back by w*T.
func (m *GCRA) Undo(_, w int64, _ string) { m.v.undo(w) }

// Release does nothing.
func (m *GCRA) Release(int64, string) {}

// TAT is the state: the theoretical arrival time (us), and when it was
// written.
func (m *GCRA) TAT() (tat, written int64) { return m.v.at, m.v.wr }

// Reparam changes the limits, keeping the state (see TokenBucket.Reparam).
func (m *GCRA) Reparam(p Params) { m.v.c, m.v.u = p[0], p[1] }

// LeakyBucket is leaky_bucket: nginx's limit_req, one request per T us,
// with Burst requests queued beyond the one in progress. Its state is TAT,
// when the queue has drained; nginx's excess for a request at now is
// max(0, TAT-now)/T. A request is admitted iff the queue ahead of it is at
// most Burst*T (and, with MaxWait > 0, at most MaxWait); it then takes w
// slots. With MaxWait > 0 (on_refuse queue: shaping) it waits Delay, the
// queue ahead, and leaves at its slot; with MaxWait = 0 (nginx nodelay) it
// passes at once and its slots are taken all the same. Accepted requests
// leave (at now + Delay) at most Burst + w + t/T units in any window of t
// us (w the last one's weight). Params: burst, T, max wait us.
type LeakyBucket struct {
	Burst, T, MaxWait int64
	TAT               int64 // us; 0 = none
}

// NewLeakyBucket returns an empty queue of p.
func NewLeakyBucket(p Params) *LeakyBucket {
	return &LeakyBucket{Burst: p[0], T: p[1], MaxWait: p[2]}
}

// slots is the requests of weight 1 admitted behind a queue of q us, m the
// longest queue admitted.
func (m *LeakyBucket) slots(longest, q int64) int64 {
	return max(0, rateFloor(longest-q, m.T)+1)
}

// Check decides w at now. Limit is Burst+1, Remaining the requests that
// would still be admitted at now (as the queue is after this one), Reset
// when the queue has drained, Retry the wait after which it is admitted
// (-1 when w*T exceeds 2^50 us), Delay the queue ahead (shaping only).
func (m *LeakyBucket) Check(now, w int64) Result {
	t0 := max(m.TAT, now)
	q := t0 - now
	longest := m.Burst * m.T
	if m.MaxWait > 0 {
		longest = min(longest, m.MaxWait)
	}
	r := Result{Limit: m.Burst + 1}
	switch {
	case w > rateMaxDebt/m.T:
		r.Retry, r.Remaining, r.Reset = -1, m.slots(longest, q), t0
	case q > longest:
		r.Retry, r.Remaining, r.Reset = q-longest, m.slots(longest, q), t0
	default:
		next := t0 + w*m.T
		r.OK, r.Remaining, r.Reset = true, m.slots(longest, next-now), next
		if m.MaxWait > 0 {
			r.Delay = q
		}
	}
	return r
}

// Commit takes w slots after the queue, when Check admits w.
func (m *LeakyBucket) Commit(now, w int64, _ string) {
	if r := m.Check(now, w); r.OK {
		m.TAT = r.Reset
	}
}

// Undo gives w slots back: TAT -= w*T.
func (m *LeakyBucket) Undo(_, w int64, _ string) {
	if w <= rateMaxDebt/m.T && m.TAT != 0 {
		m.TAT -= w * m.T
	}
}

// Release does nothing.
func (m *LeakyBucket) Release(int64, string) {}

// Reparam changes the limits, keeping the state: the queue drains at the
// rate it was written with (no clamp; see lua/policy_rates.lua).
func (m *LeakyBucket) Reparam(p Params) { m.Burst, m.T, m.MaxWait = p[0], p[1], p[2] }

// WarmUp is warm_up: Guava's SmoothWarmingUp RateLimiter, with tryAcquire's
// decision (no wait of its own: a request is admitted iff NextFree <= now,
// and its permits' price moves NextFree for the next one). S us per permit
// at the stable rate, W us of warm-up, cold factor F; the derived doubles
// are Guava's, computed with the same operations in the same order as the
// script's (an explicit float64 conversion keeps Go from fusing a multiply
// and an add that the script rounds apart). A fresh limiter is cold (all
// MaxPermits stored). Admissions are at least w*S apart (the stable rate,
// but for Guava's truncation to whole us), up to w*F*S while cold.
// Params: S, W, F.
type WarmUp struct {
	S, W, F int64
	// Guava's derived values: stableIntervalMicros, thresholdPermits,
	// maxPermits, slope, coolDownIntervalMicros.
	Stable, Threshold, MaxPermits, Slope, CoolDown float64

	Stored   float64 // storedPermits
	NextFree int64   // nextFreeTicketMicros
	// ColdAt is when all permits are stored again under the limits of the
	// last write (NextFree + ceil((MaxPermits-Stored)*CoolDown) + 1): from
	// then on the limiter is cold, fresh, whatever the current limits.
	ColdAt int64
	Has    bool // whether there is state (the key exists)
}

// NewWarmUp returns a cold limiter of p.
func NewWarmUp(p Params) *WarmUp {
	m := &WarmUp{}
	m.Reparam(p)
	return m
}

// Reparam changes the limits, keeping the state: Stored is read as at most
// the new MaxPermits, NextFree stands.
func (m *WarmUp) Reparam(p Params) {
	m.S, m.W, m.F = p[0], p[1], p[2]
	s, w, f := float64(p[0]), float64(p[1]), float64(p[2])
	cold := s * f
	m.Stable = s
	m.Threshold = 0.5 * w / s
	m.MaxPermits = m.Threshold + 2.0*w/(s+cold)
	m.Slope = (cold - s) / (m.MaxPermits - m.Threshold)
	m.CoolDown = w / m.MaxPermits
}

// state is the stored permits (at most MaxPermits) and nextFree: cold at
// now when there is none or its ColdAt has come.
func (m *WarmUp) state(now int64) (float64, int64) {
	if !m.Has || now >= m.ColdAt {
		return m.MaxPermits, now
	}
	return min(m.Stored, m.MaxPermits), m.NextFree
}

// permitsToTime is Guava's: the price of a permit with permits stored above
// the threshold.
func (m *WarmUp) permitsToTime(permits float64) float64 {
	return m.Stable + float64(permits*m.Slope)
}

// storedPermitsToWaitTime is Guava's: the price of take of stored permits.
func (m *WarmUp) storedPermitsToWaitTime(stored, take float64) int64 {
	above := stored - m.Threshold
	var micros int64
	if above > 0 {
		t := min(above, take)
		length := m.permitsToTime(above) + m.permitsToTime(above-t)
		micros = int64(t * length / 2.0)
		take -= t
	}
	return micros + int64(m.Stable*take)
}

// reserve is Guava's resync and reserveEarliestAvailable for w permits at
// now: the state after them.
func (m *WarmUp) reserve(now, w int64) (float64, int64) {
	s, nf := m.state(now)
	if now > nf {
		s = min(m.MaxPermits, s+float64(now-nf)/m.CoolDown)
		nf = now
	}
	spend := min(float64(w), s)
	fresh := float64(w) - spend
	nf += m.storedPermitsToWaitTime(s, spend) + int64(fresh*m.Stable)
	return s - spend, nf
}

// never reports whether w permits could never be priced within 2^50 us.
func (m *WarmUp) never(w int64) bool { return w > rateMaxDebt/(m.F*m.S) }

// Check decides w permits at now: admitted iff NextFree <= now. Limit is
// the stable rate per second (at least 1), Remaining 1 when a request would
// be admitted at now after this one (0 after any admission: a permit costs
// at least a us), Reset NextFree (after this admission; at least now),
// Retry NextFree - now (-1 when w*F*S exceeds 2^50 us).
func (m *WarmUp) Check(now, w int64) Result {
	r := Result{Limit: max(1, 1_000_000/m.S)}
	_, nf := m.state(now)
	switch {
	case m.never(w):
		nf = max(nf, now)
		r.Retry, r.Reset = -1, nf
		if nf <= now {
			r.Remaining = 1
		}
	case nf > now:
		r.Retry, r.Reset = nf-now, nf
	default:
		_, nf = m.reserve(now, w)
		r.OK, r.Reset = true, nf
		if nf <= now {
			r.Remaining = 1
		}
	}
	return r
}

// Commit reserves w permits at now, when Check admits them.
func (m *WarmUp) Commit(now, w int64, _ string) {
	if r := m.Check(now, w); r.OK {
		m.Stored, m.NextFree = m.reserve(now, w)
		m.ColdAt, m.Has = m.coldAt(), true
	}
}

// coldAt is when the state is cold again: all permits stored.
func (m *WarmUp) coldAt() int64 {
	return m.NextFree + int64(math.Ceil((m.MaxPermits-m.Stored)*m.CoolDown)) + 1
}

// Undo gives w permits back: Stored += w (at most MaxPermits), NextFree -=
// w*S. The limiter ends no warmer and no earlier than before the request
// it undoes (but for Guava's truncations, < 3 us).
func (m *WarmUp) Undo(now, w int64, _ string) {
	if !m.Has || m.never(w) {
		return
	}
	s, nf := m.state(now)
	m.Stored, m.NextFree = min(m.MaxPermits, s+float64(w)), nf-w*m.S
	m.ColdAt = m.coldAt()
}

// Release does nothing.
func (m *WarmUp) Release(int64, string) {}

// Need is when (us) the limiter is cold again, all of its permits stored
// (0 when it has no state): its key expires then (+ slack; see
// lua/policy_rates.lua).
func (m *WarmUp) Need() int64 {
	if !m.Has {
		return 0
	}
	return m.ColdAt
}
