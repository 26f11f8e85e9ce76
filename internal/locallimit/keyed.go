package locallimit

import "time"

// Rule is the limit of every key of a Keyed table: Burst events at once,
// then one every Interval (GCRA), for at most MaxKeys keys.
type Rule struct {
	Burst    int64
	Interval time.Duration
	MaxKeys  int
}

// Keyed is a GCRA table: for each key, the time its events will have
// drained (its theoretical arrival time). It is a plain map, one entry per
// key, so that its owner holds it under the lock that also covers the
// owner's own check-then-act (see httpapi's authFailures): a Keyed is not
// safe for concurrent use. The zero Keyed is an empty table; Take fills it.
//
// Times are the caller's clock: the table reads none of its own.
type Keyed[K comparable] map[K]time.Time

// Wait reports whether key has used up its burst at now under r, and for
// how long: the wait before one more event would be counted.
func (t Keyed[K]) Wait(r Rule, key K, now time.Time) (time.Duration, bool) {
	tat, ok := t[key]
	if !ok {
		return 0, false
	}
	wait := tat.Sub(now) - time.Duration(r.Burst-1)*r.Interval
	return wait, wait > 0
}

// Take counts an event of key at now under r, unless key has used up its
// burst; then it reports so, and for how long, and counts nothing.
//
// Past r.MaxKeys a new key first drops the keys whose events have drained;
// when more than half the bound is still held (a spray of keys), the table
// starts afresh rather than sweep again on every new key. Memory is bounded
// either way, and a key forgotten that way gets its burst again.
func (t *Keyed[K]) Take(r Rule, key K, now time.Time) (time.Duration, bool) {
	if wait, blocked := t.Wait(r, key, now); blocked {
		return wait, true
	}
	if *t == nil {
		*t = Keyed[K]{}
	}
	tat, ok := (*t)[key]
	if !ok && len(*t) >= r.MaxKeys {
		for k, drained := range *t {
			if !drained.After(now) {
				delete(*t, k)
			}
		}
		if len(*t) > r.MaxKeys/2 {
			*t = Keyed[K]{}
		}
	}
	if tat.Before(now) {
		tat = now
	}
	(*t)[key] = tat.Add(r.Interval)
	return 0, false
}
