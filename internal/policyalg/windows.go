package policyalg

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/internal/quota"
)

// The models of lua/policy_windows.lua: fixed_window, sliding_log,
// sliding_window and concurrency. Each holds what its Redis key holds (in
// the same representation, so that KeyState can be compared with the key)
// and decides with the same integer arithmetic; see the Lua file for the
// algorithms' derivations and each type for its guarantee.
//
// Like the script, Check removes state that has expired (log entries that
// left the window, buckets older than the oldest counted one, dead
// leases): that changes no decision, only what the key holds. Times are
// us > 0; Undo takes the admission's own time (fixed_window and
// sliding_window find the window or bucket of the admission from it).

func init() {
	constructors[quota.AlgFixedWindow] = func(p Params) Model { return NewFixedWindow(p) }
	constructors[quota.AlgSlidingLog] = func(p Params) Model { return NewSlidingLog(p) }
	constructors[quota.AlgSlidingWindow] = func(p Params) Model { return NewSlidingWindow(p) }
	constructors[quota.AlgConcurrency] = func(p Params) Model { return NewConcurrency(p) }
}

// KeyModel is a Model that also tells what its Redis key holds, for the
// tests that compare a model with the script's key after every step.
type KeyModel interface {
	Model
	// KeyState renders the key's content (see each type for the form).
	KeyState() string
	// KeyExpiry is the key's expiry (us, script time) and whether the key
	// exists at all.
	KeyExpiry() (us int64, exists bool)
}

// windowFloor is floor division (Go's / truncates toward zero), the
// script's idiv; b > 0.
func windowFloor(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// windowCeil is ceiling division, the script's -idiv(-a, b); b > 0.
func windowCeil(a, b int64) int64 { return -windowFloor(-a, b) }

// FixedWindow counts units per window aligned to the epoch: window x is
// [x*W, (x+1)*W). Params: limit L, window W (us).
//
// Admit iff count(x) + w <= L; reset = the window's end; retry = the
// window's end - now (-1 when w > L); remaining = L - count (less w when
// admitted). Guarantee: at most L units per aligned window, hence at most
// 2L in any interval of length W — a bound that is reached (L at the end of
// a window and L at the start of the next).
//
// KeyState: "x,count" (the key's string), "" when there is no key.
type FixedWindow struct {
	limit, window int64
	x, count      int64 // the key: its window and that window's units
	exists        bool
	expiry        int64
}

// NewFixedWindow returns an empty fixed window of p = {limit, window us}.
func NewFixedWindow(p Params) *FixedWindow { return &FixedWindow{limit: p[0], window: p[1]} }

// current is the window of now and its units (0 when the key holds another).
func (m *FixedWindow) current(now int64) (x, count int64) {
	x = windowFloor(now, m.window)
	if m.exists && m.x == x {
		return x, m.count
	}
	return x, 0
}

// Check decides whether w units fit at now.
func (m *FixedWindow) Check(now, w int64) Result {
	x, count := m.current(now)
	reset := (x + 1) * m.window
	room := max(0, m.limit-count)
	switch {
	case w > m.limit:
		return Result{Retry: -1, Limit: m.limit, Remaining: room, Reset: reset}
	case count+w > m.limit:
		return Result{Retry: reset - now, Limit: m.limit, Remaining: room, Reset: reset}
	}
	return Result{OK: true, Limit: m.limit, Remaining: room - w, Reset: reset}
}

// Commit adds w to the window of now; the key expires at the window's end.
func (m *FixedWindow) Commit(now, w int64, _ string) {
	x, count := m.current(now)
	m.x, m.count, m.exists, m.expiry = x, count+w, true, (x+1)*m.window
}

// Undo takes w back from the window of now (the admission's time) if the
// key still holds it; at 0 the key goes.
func (m *FixedWindow) Undo(now, w int64, _ string) {
	_, count := m.current(now)
	switch {
	case count <= 0:
	case count-w <= 0:
		*m = FixedWindow{limit: m.limit, window: m.window}
	default:
		m.count = count - w
	}
}

// Release does nothing: a window has no leases.
func (m *FixedWindow) Release(int64, string) {}

// KeyState is the key's "x,count", or "" without a key.
func (m *FixedWindow) KeyState() string {
	if !m.exists {
		return ""
	}
	return fmt.Sprintf("%d,%d", m.x, m.count)
}

// KeyExpiry is the end of the window last committed to.
func (m *FixedWindow) KeyExpiry() (int64, bool) { return m.expiry, m.exists }

// SlidingLog is an exact sliding window: a log of admissions, each
// counting while t > now - W and leaving at t + W. Params: limit L, window
// W (us).
//
// Admit iff the units in the window + w <= L; retry = the earliest time at
// which enough entries (oldest first, by time then member) have left for w
// to fit (-1 when w > L); reset = the newest entry's t + W (now when empty);
// remaining = L - units (less w when admitted). Guarantee: at most L units
// in ANY interval of length W. Memory O(L): at most L entries.
//
// KeyState: the sorted set as "member=score" in Redis's order, '#' (minus
// the units of the other members) first, entries "<w>|<id>=<t>"; "" when
// there is no key.
type SlidingLog struct {
	limit, window int64
	entries       []logEntry       // by t, then member
	at            map[string]int64 // member -> t, to find an entry
	sum           int64            // units of entries ('#' is -sum)
	exists        bool
	expiry        int64
}

type logEntry struct {
	t      int64
	member string // "<w>|<id>"
	w      int64
}

// NewSlidingLog returns an empty log of p = {limit, window us}.
func NewSlidingLog(p Params) *SlidingLog {
	return &SlidingLog{limit: p[0], window: p[1], at: map[string]int64{}}
}

// drop removes the entries that have left the window at now.
func (m *SlidingLog) drop(now int64) {
	n := 0
	for n < len(m.entries) && m.entries[n].t <= now-m.window {
		m.sum -= m.entries[n].w
		delete(m.at, m.entries[n].member)
		n++
	}
	if n > 0 {
		m.entries = slices.Delete(m.entries, 0, n)
	}
}

// Check decides whether w units fit at now.
func (m *SlidingLog) Check(now, w int64) Result {
	m.drop(now)
	room := max(0, m.limit-m.sum)
	reset := now
	if len(m.entries) > 0 {
		reset = m.entries[len(m.entries)-1].t + m.window
	}
	switch {
	case w > m.limit:
		return Result{Retry: -1, Limit: m.limit, Remaining: room, Reset: reset}
	case m.sum+w <= m.limit:
		return Result{OK: true, Limit: m.limit, Remaining: room - w, Reset: max(reset, now+m.window)}
	}
	excess, freed := m.sum+w-m.limit, int64(0)
	for _, e := range m.entries {
		if freed += e.w; freed >= excess {
			return Result{Retry: e.t + m.window - now, Limit: m.limit, Remaining: room, Reset: reset}
		}
	}
	panic("policyalg: sliding log: entries do not add up to their sum")
}

// Commit logs w units of id at now; the key expires when its newest entry
// leaves. An id already logged with the same w moves to now.
func (m *SlidingLog) Commit(now, w int64, id string) {
	m.drop(now)
	last := now
	if n := len(m.entries); n > 0 {
		last = max(last, m.entries[n-1].t)
	}
	member := strconv.FormatInt(w, 10) + "|" + id
	if !m.remove(member) {
		m.sum += w
	}
	e := logEntry{t: now, member: member, w: w}
	i, _ := slices.BinarySearchFunc(m.entries, e, cmpEntry)
	m.entries = slices.Insert(m.entries, i, e)
	m.at[member] = now
	m.exists, m.expiry = true, last+m.window
}

func cmpEntry(a, b logEntry) int {
	if a.t != b.t {
		return compareInt(a.t, b.t)
	}
	return strings.Compare(a.member, b.member)
}

func compareInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// remove takes member out of the entries (not out of sum) and reports
// whether it was there.
func (m *SlidingLog) remove(member string) bool {
	t, ok := m.at[member]
	if !ok {
		return false
	}
	i, found := slices.BinarySearchFunc(m.entries, logEntry{t: t, member: member}, cmpEntry)
	if !found {
		panic("policyalg: sliding log: an entry is missing from its index")
	}
	m.entries = slices.Delete(m.entries, i, i+1)
	delete(m.at, member)
	return true
}

// Undo removes id's entry of w units, if it is still logged.
func (m *SlidingLog) Undo(_, w int64, id string) {
	if m.remove(strconv.FormatInt(w, 10) + "|" + id) {
		m.sum -= w
	}
}

// Release does nothing: a log has no leases.
func (m *SlidingLog) Release(int64, string) {}

// KeyState is the sorted set, '#' first.
func (m *SlidingLog) KeyState() string {
	if !m.exists {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "#=%d", -m.sum)
	for _, e := range m.entries {
		fmt.Fprintf(&b, " %s=%d", e.member, e.t)
	}
	return b.String()
}

// KeyExpiry is the newest entry's t + W as of the last commit.
func (m *SlidingLog) KeyExpiry() (int64, bool) { return m.expiry, m.exists }

// SlidingWindow approximates a sliding window with N bucket counters of
// width bw = W/N. Params: limit L, window W (us), buckets N (W%N == 0).
//
// At now, in bucket i at offset off, E = bw * (units of the buckets after
// i-N) + count(i-N) * (bw - off) is bw times the estimate; admit iff E <=
// (L - w) * bw. remaining = L - ceil(E/bw) (less w when admitted); reset =
// (newest bucket + N + 1) * bw, when E is 0 (now when no bucket is kept);
// retry = the earliest us at which E <= (L-w)*bw (-1 when w > L), found by
// a walk over the kept buckets (fitsAt).
//
// Guarantee (time not going back): any N consecutive buckets hold at most L
// units, so any interval spanning at most (N-1)*bw us holds at most L, and
// any interval of length W at most max(L, 2L - ceil(2L/bw)), which is
// reached (lua/policy_windows.lua derives both).
//
// KeyState: the hash as "j=count" by bucket index j, "" when there is no
// key (no bucket kept).
type SlidingWindow struct {
	limit, window, n, bw int64
	buckets              map[int64]int64
	expiry               int64
}

// NewSlidingWindow returns empty counters of p = {limit, window us, buckets}.
func NewSlidingWindow(p Params) *SlidingWindow {
	return &SlidingWindow{limit: p[0], window: p[1], n: p[2], bw: p[1] / p[2], buckets: map[int64]int64{}}
}

// at drops the buckets older than i-N and returns i, the offset in it, the
// units of the buckets after i-N, count(i-N) and the newest kept bucket
// (ok false when none is kept).
func (m *SlidingWindow) at(now int64) (i, off, after, oldest, newest int64, ok bool) {
	i = windowFloor(now, m.bw)
	for j, c := range m.buckets {
		switch {
		case j < i-m.n:
			delete(m.buckets, j)
			continue
		case j == i-m.n:
			oldest = c
		default:
			after += c
		}
		if !ok || j > newest {
			newest, ok = j, true
		}
	}
	return i, now - i*m.bw, after, oldest, newest, ok
}

// Check decides whether w units fit at now.
func (m *SlidingWindow) Check(now, w int64) Result {
	i, off, after, oldest, newest, kept := m.at(now)
	bw := m.bw
	e := bw*after + oldest*(bw-off)
	room := max(0, m.limit-windowCeil(e, bw))
	reset := now
	if kept {
		reset = (newest + m.n + 1) * bw
	}
	if w > m.limit {
		return Result{Retry: -1, Limit: m.limit, Remaining: room, Reset: reset}
	}
	r := (m.limit - w) * bw
	if e <= r {
		last := i
		if kept {
			last = max(last, newest)
		}
		return Result{OK: true, Limit: m.limit, Remaining: room - w, Reset: (last + m.n + 1) * bw}
	}
	return Result{Retry: m.fitsAt(i, off, newest, r) - now, Limit: m.limit, Remaining: room, Reset: reset}
}

// fitsAt returns the first us at which E <= r, as the script finds it: E
// only falls as time passes, staying constant in a bucket b whose b-N is
// empty and falling linearly in one whose b-N holds c units. So the kept
// buckets j, in order, are the only events: in bucket j+N, E(off) = bw*S +
// c*(bw - off), S the units of the buckets after j, is <= r from
// off = bw - floor((r - bw*S)/c) when bw*S <= r (off = bw: the next
// bucket's start, where E = bw*S). The last bucket leaves S = 0 <= r.
// (TestWindowRetryIsExact checks, by Check, that the answer passes and a
// us sooner does not.)
func (m *SlidingWindow) fitsAt(i, off, newest, r int64) int64 {
	bw := m.bw
	js := make([]int64, 0, len(m.buckets))
	var after int64
	for j, c := range m.buckets {
		js = append(js, j)
		after += c
	}
	slices.Sort(js)
	for _, j := range js {
		c := m.buckets[j]
		after -= c
		if d := r - bw*after; d >= 0 {
			b, o := j+m.n, bw-windowFloor(d, c)
			if b == i {
				o = max(o, off)
			}
			return b*bw + max(o, 0)
		}
	}
	return (newest + m.n + 1) * bw // (not reached: the last j leaves after = 0)
}

// Commit adds w to the bucket of now; the key's expiry moves to when E is
// 0 again when the bucket is newer than any kept.
func (m *SlidingWindow) Commit(now, w int64, _ string) {
	i, _, _, _, newest, kept := m.at(now)
	if !kept || i > newest {
		m.expiry = (i + m.n + 1) * m.bw
	}
	m.buckets[i] += w
}

// Undo takes w back from the bucket of now (the admission's time) if it is
// still kept; a bucket at or below 0 goes.
func (m *SlidingWindow) Undo(now, w int64, _ string) {
	j := windowFloor(now, m.bw)
	c, ok := m.buckets[j]
	switch {
	case !ok:
	case c-w <= 0:
		delete(m.buckets, j)
	default:
		m.buckets[j] = c - w
	}
}

// Release does nothing: a window has no leases.
func (m *SlidingWindow) Release(int64, string) {}

// KeyState is the hash, by bucket index.
func (m *SlidingWindow) KeyState() string {
	js := make([]int64, 0, len(m.buckets))
	for j := range m.buckets {
		js = append(js, j)
	}
	slices.Sort(js)
	parts := make([]string, len(js))
	for x, j := range js {
		parts[x] = fmt.Sprintf("%d=%d", j, m.buckets[j])
	}
	return strings.Join(parts, " ")
}

// KeyExpiry is when E is 0 again, as of the commit that opened the newest
// bucket; the key exists while a bucket is kept.
func (m *SlidingWindow) KeyExpiry() (int64, bool) { return m.expiry, len(m.buckets) > 0 }

// Concurrency is a semaphore with leases: each admitted request holds a
// slot until it is released or its lease (now + B) ends. Params: limit L,
// lease B (us). Counts 1 per request whatever w.
//
// Admit iff the live leases < L; retry = when the earliest lease ends (the
// (count-L+1)th earliest when L was lowered under count; -1 when L = 0),
// which suffices even if nobody releases; remaining = L - count (less 1
// when admitted, 0 when refused); reset = when the next slot comes back.
// Guarantee: at most L leases held at any time. Memory O(L).
//
// KeyState: the sorted set as "id=lease end" by end then id, "" when empty
// (Redis deletes an empty set).
type Concurrency struct {
	limit, lease int64
	ends         map[string]int64 // id -> lease end
	order        []leaseRef       // by end, then id (Redis's order)
	expiry       int64
}

type leaseRef struct {
	end int64
	id  string
}

func cmpLease(a, b leaseRef) int {
	if c := compareInt(a.end, b.end); c != 0 {
		return c
	}
	return strings.Compare(a.id, b.id)
}

// NewConcurrency returns an empty semaphore of p = {limit, lease us}.
func NewConcurrency(p Params) *Concurrency {
	return &Concurrency{limit: p[0], lease: p[1], ends: map[string]int64{}}
}

// drop ends the leases that ended by now.
func (m *Concurrency) drop(now int64) {
	n := 0
	for n < len(m.order) && m.order[n].end <= now {
		delete(m.ends, m.order[n].id)
		n++
	}
	if n > 0 {
		m.order = slices.Delete(m.order, 0, n)
	}
}

// Check decides whether one more request fits at now.
func (m *Concurrency) Check(now, _ int64) Result {
	m.drop(now)
	n := int64(len(m.order))
	switch {
	case n < m.limit:
		reset := now + m.lease
		if n > 0 {
			reset = min(reset, m.order[0].end)
		}
		return Result{OK: true, Limit: m.limit, Remaining: m.limit - n - 1, Reset: reset}
	case m.limit <= 0:
		return Result{Retry: -1, Limit: m.limit, Reset: now}
	}
	at := m.order[n-m.limit].end
	return Result{Retry: at - now, Limit: m.limit, Reset: at}
}

// Commit gives id a lease until now + B; the key expires when the latest
// lease ends.
func (m *Concurrency) Commit(now, _ int64, id string) {
	m.drop(now)
	m.Release(now, id)
	l := leaseRef{end: now + m.lease, id: id}
	i, _ := slices.BinarySearchFunc(m.order, l, cmpLease)
	m.order = slices.Insert(m.order, i, l)
	m.ends[id] = l.end
	m.expiry = m.order[len(m.order)-1].end
}

// Undo ends id's lease, as Release does.
func (m *Concurrency) Undo(now, _ int64, id string) { m.Release(now, id) }

// Release ends id's lease.
func (m *Concurrency) Release(_ int64, id string) {
	end, ok := m.ends[id]
	if !ok {
		return
	}
	i, found := slices.BinarySearchFunc(m.order, leaseRef{end: end, id: id}, cmpLease)
	if !found {
		panic("policyalg: concurrency: a lease is missing from its index")
	}
	m.order = slices.Delete(m.order, i, i+1)
	delete(m.ends, id)
}

// KeyState is the sorted set, by lease end then id.
func (m *Concurrency) KeyState() string {
	parts := make([]string, len(m.order))
	for x, l := range m.order {
		parts[x] = fmt.Sprintf("%s=%d", l.id, l.end)
	}
	return strings.Join(parts, " ")
}

// KeyExpiry is the latest lease's end as of the last commit; the key exists
// while a lease is held.
func (m *Concurrency) KeyExpiry() (int64, bool) { return m.expiry, len(m.order) > 0 }
