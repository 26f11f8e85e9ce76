package tollgate

import (
	"net/http"
	"strconv"
	"sync"
	"time"
)

// denyCache holds recent refusals that carried a Retry-After, keyed by
// API key and meter, so that a refused client is answered locally until
// the wait passes, without asking Tollgate. It holds at most size entries:
// a full cache drops its expired entries, then one that ends soonest.
type denyCache struct {
	mu      sync.Mutex
	size    int
	entries map[denyKey]*denial
}

type denyKey struct{ apiKey, meter string }

// denial is a refusal to repeat until until, for costs of at least cost
// (a smaller cost may still fit).
type denial struct {
	until  time.Time
	cost   int64
	status int
	header map[string]string
	body   []byte
}

func newDenyCache(size int) *denyCache {
	return &denyCache{size: size, entries: make(map[denyKey]*denial)}
}

// get returns the refusal that answers a request of cost now, if any.
func (c *denyCache) get(k denyKey, cost int64, now time.Time) *denial {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.entries[k]
	if d == nil {
		return nil
	}
	if !now.Before(d.until) {
		delete(c.entries, k)
		return nil
	}
	if cost < d.cost {
		return nil
	}
	return d
}

// put remembers a refusal of cost until until.
func (c *denyCache) put(k denyKey, d *denial, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[k]; !ok && len(c.entries) >= c.size {
		var soonest denyKey
		var first time.Time
		for key, e := range c.entries {
			if !now.Before(e.until) {
				delete(c.entries, key)
				continue
			}
			if first.IsZero() || e.until.Before(first) {
				soonest, first = key, e.until
			}
		}
		if len(c.entries) >= c.size {
			delete(c.entries, soonest)
		}
	}
	c.entries[k] = d
}

// len returns the number of entries held.
func (c *denyCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// retryAfterSeconds reads a Retry-After of delay-seconds; 0 when absent
// or not a positive number.
func retryAfterSeconds(h map[string]string) int64 {
	for k, v := range h {
		if http.CanonicalHeaderKey(k) == "Retry-After" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil && n > 0 {
				return n
			}
		}
	}
	return 0
}
