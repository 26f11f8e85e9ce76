package api

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// The room a tenant's stored idempotent answers take in Redis is bounded:
// at most TOLLGATE_IDEMPOTENCY_MAX_ANSWERS records and
// TOLLGATE_IDEMPOTENCY_MAX_BYTES bytes of answers (a request in flight
// holds the largest answer it may store). A new key past the bound is
// refused before it runs, consuming nothing; repeats of stored keys are
// still answered, and /v1/usage shows the room.

const problemIdemLimit = "https://tollgate.dev/problems/idempotency-limit"

// mustBeIdemLimited checks the refusal of a new key past the bound: 429,
// its problem type, a Retry-After of at least a second and at most the
// records' 24 hours (and the claim's margin).
func mustBeIdemLimited(tb testing.TB, what string, r reply) {
	tb.Helper()
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if r.status != http.StatusTooManyRequests || err != nil || ra < 1 || ra > 86400+600 ||
		r.header.Get("Content-Type") != "application/problem+json" || r.json(tb)["type"] != problemIdemLimit {
		tb.Fatalf("%s: %d, Retry-After %q, %.200s; want 429 %s with a Retry-After within a day",
			what, r.status, r.header.Get("Retry-After"), r.body, problemIdemLimit)
	}
}

// idemRoom reads /v1/usage's idempotency member: answers and bytes, used
// and limit.
func idemRoom(tb testing.TB, base, key string) (answers, answersLimit, bytes, bytesLimit float64) {
	tb.Helper()
	r := do(tb, "GET", base+"/v1/usage", key, "")
	room, ok := r.json(tb)["idempotency"].(map[string]any)
	if r.status != 200 || !ok {
		tb.Fatalf("/v1/usage: %d %s, want an idempotency member", r.status, r.body)
	}
	a, _ := room["answers"].(map[string]any)
	b, _ := room["bytes"].(map[string]any)
	if a == nil || b == nil {
		tb.Fatalf("/v1/usage idempotency %v, want answers and bytes", room)
	}
	num := func(m map[string]any, k string) float64 {
		v, ok := m[k].(float64)
		if !ok {
			tb.Fatalf("/v1/usage idempotency %v: %s is not a number", room, k)
		}
		return v
	}
	return num(a, "used"), num(a, "limit"), num(b, "used"), num(b, "limit")
}

// dailyRemaining is the tenant's daily quota left, by /v1/usage.
func dailyRemaining(tb testing.TB, base, key string) float64 {
	tb.Helper()
	r := do(tb, "GET", base+"/v1/usage", key, "")
	for _, l := range r.json(tb)["limits"].([]any) {
		if m := l.(map[string]any); m["name"] == "daily" {
			return m["remaining"].(float64)
		}
	}
	tb.Fatalf("/v1/usage %s: no daily limit", r.body)
	return 0
}

// TestIdempotentAnswersAreBoundedPerTenant: with room for 3 answers, a
// fourth key is 429 before it reaches the upstream, and counts no unit;
// the stored keys still replay, requests without a key still pass, and
// another tenant has room of its own.
func TestIdempotentAnswersAreBoundedPerTenant(t *testing.T) {
	t.Parallel()
	up := newCountingUpstream(t)
	s := mustStack(t)
	s.upstreamRoutes(t, up.srv.URL)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	_, key := s.tenant(tier.Slug)
	_, other := s.tenant(tier.Slug)
	base := s.startWith(map[string]string{"TOLLGATE_IDEMPOTENCY_MAX_ANSWERS": "3"})

	post := func(key, idem string) reply {
		return raw(t, base, "POST /api/up/orders HTTP/1.1", "Authorization: Bearer "+key, "Idempotency-Key: "+idem, "", `{"n":1}`)
	}
	var first reply
	for i := range 3 {
		r := post(key, fmt.Sprintf("order-%d", i))
		if r.status != http.StatusCreated {
			t.Fatalf("key %d: %d %s, want 201", i, r.status, r.body)
		}
		if i == 0 {
			first = r
		}
	}
	mustBeIdemLimited(t, "a fourth key", post(key, "order-3"))
	if got := up.hits.Load(); got != 3 {
		t.Fatalf("upstream hits %d after a refused fourth key, want 3", got)
	}
	if got := dailyRemaining(t, base, key); got != 97 {
		t.Fatalf("daily remaining %v after the refusal, want 97: a refused key consumes nothing", got)
	}
	if r := post(key, "order-0"); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || string(r.body) != string(first.body) {
		t.Fatalf("repeat of a stored key: %d %v %s, want the stored answer", r.status, r.header, r.body)
	}
	if r := raw(t, base, "POST /api/up/orders HTTP/1.1", "Authorization: Bearer "+key, "", `{"n":1}`); r.status != http.StatusCreated {
		t.Fatalf("without a key: %d %s, want 201", r.status, r.body)
	}
	if r := post(other, "order-3"); r.status != http.StatusCreated {
		t.Fatalf("another tenant's key: %d %s, want 201", r.status, r.body)
	}
	used, limit, bytes, bytesLimit := idemRoom(t, base, key)
	if used != 3 || limit != 3 || bytes < 3*float64(len(first.body)) || bytesLimit < 1<<20 {
		t.Fatalf("/v1/usage idempotency: answers %v of %v, bytes %v of %v; want 3 of 3, at least the 3 bodies", used, limit, bytes, bytesLimit)
	}
}

// TestIdempotentAnswerBytesAreBounded: with room for 3,000,000 bytes, two
// stored answers of 1,000,000 bytes leave no room for a third request in
// flight (which holds the largest answer it may store): it is 429 before
// it runs, and /v1/usage counts the bytes.
func TestIdempotentAnswerBytesAreBounded(t *testing.T) {
	t.Parallel()
	s, key := downloadStack(t)
	base := s.startWith(map[string]string{"TOLLGATE_IDEMPOTENCY_MAX_BYTES": "3000000"})
	get := func(idem string) reply {
		return raw(t, base, "GET /api/dl/len/1000000 HTTP/1.1", "Authorization: Bearer "+key, "Idempotency-Key: "+idem)
	}
	for i := range 2 {
		if r := get(fmt.Sprintf("big-%d", i)); r.status != 200 || len(r.body) != 1000000 {
			t.Fatalf("answer %d: %d, %d bytes; want 200 and 1000000", i, r.status, len(r.body))
		}
	}
	mustBeIdemLimited(t, "a third megabyte", get("big-2"))
	if r := get("big-0"); r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" || len(r.body) != 1000000 {
		t.Fatalf("repeat of a stored key: %d %v, %d bytes; want the stored answer", r.status, r.header, len(r.body))
	}
	used, _, bytes, limit := idemRoom(t, base, key)
	if used != 2 || bytes < 2000000 || bytes > 2100000 || limit != 3000000 {
		t.Fatalf("/v1/usage idempotency: %v answers, %v bytes of %v; want 2 answers, about 2000000 bytes of 3000000", used, bytes, limit)
	}
}

// TestIdempotentBoundHoldsUnderConcurrency: 40 clients each send a new key
// at once, with room for 10: exactly 10 reach the upstream, 30 are 429.
func TestIdempotentBoundHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	up := newCountingUpstream(t)
	s := mustStack(t)
	s.upstreamRoutes(t, up.srv.URL)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	_, key := s.tenant(tier.Slug)
	base := s.startWith(map[string]string{"TOLLGATE_IDEMPOTENCY_MAX_ANSWERS": "10"})
	var once sync.Once
	release := func() { once.Do(func() { close(up.release) }) }
	t.Cleanup(release)

	const clients = 40
	results := make(chan reply, clients)
	var mu sync.Mutex
	n429 := 0
	for i := range clients {
		go func() {
			var r reply
			req, _ := http.NewRequest("POST", base+"/api/up/slow", nil)
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Idempotency-Key", fmt.Sprintf("c-%d", i))
			if resp, err := http.DefaultClient.Do(req); err != nil {
				t.Errorf("client %d: %v", i, err)
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				r = reply{resp.StatusCode, resp.Header, b}
			}
			mu.Lock()
			if r.status == http.StatusTooManyRequests {
				n429++
			}
			mu.Unlock()
			results <- r
		}()
	}
	// every request is in flight upstream or refused before the slow ones
	// are let go
	eventually(t, "every request reaches the upstream or is refused", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return int(up.hits.Load())+n429 == clients
	})
	release()
	statuses := map[int]int{}
	for range clients {
		r := <-results
		statuses[r.status]++
		if r.status == http.StatusTooManyRequests && !strings.Contains(string(r.body), problemIdemLimit) {
			t.Errorf("429 %s, want the idempotency-limit problem", r.body)
		}
	}
	if statuses[http.StatusCreated] != 10 || statuses[http.StatusTooManyRequests] != 30 || up.hits.Load() != 10 {
		t.Fatalf("statuses %v, upstream hits %d; want 10 × 201, 30 × 429 and 10 hits", statuses, up.hits.Load())
	}
	if used, _, _, _ := idemRoom(t, base, key); used != 10 {
		t.Fatalf("/v1/usage: %v answers, want 10", used)
	}
}
