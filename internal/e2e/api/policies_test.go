package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// Policies end to end: created through the admin API, applied by the
// metered path of every node.

// mustPolicy creates a policy through the admin API of base.
func mustPolicy(tb *testing.T, base, body string) {
	tb.Helper()
	if r := admin(tb, "POST", base+"/admin/v1/policies", body); r.status != 201 {
		tb.Fatalf("create policy %s: %d %s", body, r.status, r.body)
	}
}

// waitPolicy waits until base applies the policy name to key's requests
// (its item in RateLimit-Policy, or its name among the refusals), at most
// 1 s: the promise of a change reaching every node.
func waitPolicy(tb *testing.T, base, key, name string) reply {
	tb.Helper()
	start := time.Now()
	for {
		r := do(tb, "GET", base+"/api/demo/echo", key, "")
		if strings.Contains(r.header.Get("RateLimit-Policy"), `"`+name+`"`) ||
			strings.Contains(r.header.Get("Tollgate-Shadow-Refused"), name) || r.header.Get("Tollgate-Degraded") == name {
			return r
		}
		if time.Since(start) > time.Second {
			tb.Fatalf("%s does not apply policy %s 1 s after it was created: RateLimit-Policy %q", base, name, r.header.Get("RateLimit-Policy"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPoliciesAreExactOnTwoNodes: for every algorithm kept in Redis, 64
// clients split over two API nodes are admitted exactly what the policy
// allows: its limit within one window (the windows are long enough that
// none ends during the test), never more.
func TestPoliciesAreExactOnTwoNodes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		alg, fields string
		want        int64
	}{
		{"fixed_window", `"limit": 40, "window_seconds": 86400`, 40},
		{"sliding_log", `"limit": 40, "window_seconds": 86400`, 40},
		{"sliding_window", `"limit": 40, "window_seconds": 86400, "buckets": 24`, 40},
		{"token_bucket", `"capacity": 40, "refill_per_sec": 0.0001`, 40},
		{"gcra", `"rate": 0.0001, "burst": 40`, 40},
		{"leaky_bucket", `"rate": 0.0001, "burst": 39`, 40},
		// Guava's warm-up lets the first request through and makes the
		// next wait the cold interval (3 × 10,000 s here)
		{"warm_up", `"rate": 0.0001, "warmup_seconds": 60`, 1},
	}
	for _, tc := range cases {
		t.Run(tc.alg, func(t *testing.T) {
			t.Parallel()
			s := mustStack(t)
			bases := []string{s.start(), s.start()}
			tier := s.tier(30, quota.Limits{DailyQuota: quota.Ptr(int64(100_000))})
			_, key := s.tenant(tier.Slug)
			name := "exact-" + strings.ReplaceAll(tc.alg, "_", "-")
			mustPolicy(t, bases[0], fmt.Sprintf(`{"name": %q, "algorithm": %q, %s, "match": {"meters": ["demo"]}}`, name, tc.alg, tc.fields))
			// both nodes apply it before the load starts (that first
			// request is admitted or refused like the others and counted)
			var admitted, refused atomic.Int64
			count := func(r reply) {
				switch r.status {
				case 200:
					admitted.Add(1)
				case 429:
					refused.Add(1)
					if !strings.Contains(string(r.body), `"`+name+`"`) {
						t.Errorf("refusal without the policy's name: %s", r.body)
					}
				default:
					t.Errorf("status %d: %s", r.status, r.body)
				}
			}
			count(waitPolicy(t, bases[0], key, name))
			count(waitPolicy(t, bases[1], key, name))
			var wg sync.WaitGroup
			for i := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 2 {
						count(do(t, "GET", bases[i%2]+"/api/demo/echo", key, ""))
					}
				}()
			}
			wg.Wait()
			if admitted.Load() != tc.want || admitted.Load()+refused.Load() != 130 {
				t.Fatalf("admitted %d, refused %d of 130: want exactly %d admitted", admitted.Load(), refused.Load(), tc.want)
			}
		})
	}
}

// TestConcurrencyPolicyHoldsASlotUntilTheAnswer: a concurrency policy
// admits at most its limit in flight, across two nodes, and frees a slot
// when an answer ends.
func TestConcurrencyPolicyHoldsASlotUntilTheAnswer(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var inFlight, most atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		<-release
		inFlight.Add(-1)
		_, _ = w.Write([]byte("ok"))
	}))
	defer up.Close()
	s := mustStack(t)
	s.upstreamRoutes(t, up.URL)
	bases := []string{s.start(), s.start()}
	tier := s.tier(31, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	_, key := s.tenant(tier.Slug)
	mustPolicy(t, bases[0], `{"name": "two-at-once", "algorithm": "concurrency", "limit": 2, "lease_seconds": 60}`)
	time.Sleep(1100 * time.Millisecond) // (every node applies a change within 1 s)

	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := do(t, "GET", bases[i%2]+"/api/up/slow", key, "")
			switch r.status {
			case 200:
				ok.Add(1)
			case 429:
				refused.Add(1)
				if r.header.Get("Retry-After") == "" || !strings.Contains(string(r.body), "two-at-once") {
					t.Errorf("refusal %v %s: want Retry-After and the policy's name", r.header, r.body)
				}
			default:
				t.Errorf("status %d %s", r.status, r.body)
			}
		}()
	}
	// four of the six are refused while two wait on the upstream
	deadline := time.Now().Add(10 * time.Second)
	for refused.Load() < 4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	wg.Wait()
	if ok.Load() != 2 || refused.Load() != 4 || most.Load() != 2 {
		t.Fatalf("ok %d refused %d, at most %d in flight: want 2, 4 and 2", ok.Load(), refused.Load(), most.Load())
	}
	// the answers ended: the slots are free again
	for i := range 3 {
		if r := do(t, "GET", bases[i%2]+"/api/up/slow", key, ""); r.status != 200 {
			t.Fatalf("after the answers, request %d: %d %s", i, r.status, r.body)
		}
	}
}

// TestShadowAndDegradePolicies: a shadow policy refuses nothing and says
// what it would have refused; a degrade policy answers its fallback and
// charges nothing; both are counted in /metrics and /v1/usage.
func TestShadowAndDegradePolicies(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	shadowTier := s.tier(32, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	degradeTier := s.tier(33, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	_, shadowKey := s.tenant(shadowTier.Slug)
	_, degradeKey := s.tenant(degradeTier.Slug)
	mustPolicy(t, base, `{"name": "try-out", "algorithm": "fixed_window", "limit": 2, "window_seconds": 86400,
		"on_refuse": "shadow", "match": {"tiers": ["`+shadowTier.Slug+`"]}}`)
	mustPolicy(t, base, `{"name": "cheap", "algorithm": "fixed_window", "limit": 1, "window_seconds": 86400,
		"on_refuse": "degrade", "fallback": {"status": 200, "content_type": "text/plain", "body": "from the cache"},
		"match": {"tiers": ["`+degradeTier.Slug+`"]}}`)
	time.Sleep(1100 * time.Millisecond)

	for i := range 5 {
		r := do(t, "GET", base+"/api/demo/echo", shadowKey, "")
		if r.status != 200 {
			t.Fatalf("shadow request %d: %d %s", i, r.status, r.body)
		}
		if got, want := r.header.Get("Tollgate-Shadow-Refused") == "try-out", i >= 2; got != want {
			t.Fatalf("shadow request %d: Tollgate-Shadow-Refused %q", i, r.header.Get("Tollgate-Shadow-Refused"))
		}
		if strings.Contains(r.header.Get("RateLimit-Policy"), "try-out") {
			t.Fatalf("a shadow policy is not enforced: no header item, got %q", r.header.Get("RateLimit-Policy"))
		}
	}
	for i := range 4 {
		r := do(t, "GET", base+"/api/demo/echo", degradeKey, "")
		if i == 0 {
			if r.status != 200 || r.header.Get("Tollgate-Degraded") != "" {
				t.Fatalf("first request: %d %v", r.status, r.header)
			}
			continue
		}
		if r.status != 200 || string(r.body) != "from the cache" || r.header.Get("Tollgate-Degraded") != "cheap" ||
			r.header.Get("Content-Type") != "text/plain" {
			t.Fatalf("degraded request %d: %d %v %q", i, r.status, r.header, r.body)
		}
		if !strings.Contains(r.header.Get("RateLimit"), `"daily";r=99;`) {
			t.Fatalf("degraded request %d charged the quota: RateLimit %q", i, r.header.Get("RateLimit"))
		}
	}
	m := string(do(t, "GET", base+"/metrics", "", "").body)
	for _, line := range []string{
		`tollgate_policy_decisions_total{algorithm="fixed_window",outcome="shadow_refused",policy="try-out"} 3`,
		`tollgate_policy_decisions_total{algorithm="fixed_window",outcome="admitted",policy="try-out"} 2`,
		`tollgate_policy_decisions_total{algorithm="fixed_window",outcome="degraded",policy="cheap"} 3`,
	} {
		if !strings.Contains(m, line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

// TestQueuedPolicyWaitsInsteadOfRefusing: with on_refuse "queue", requests
// past a gcra policy's burst wait for their turn instead of a 429; the
// same policy with "reject" refuses them.
func TestQueuedPolicyWaitsInsteadOfRefusing(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	queued := s.tier(34, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	rejected := s.tier(35, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	_, qKey := s.tenant(queued.Slug)
	_, rKey := s.tenant(rejected.Slug)
	mustPolicy(t, base, `{"name": "steady-q", "algorithm": "gcra", "rate": 20, "burst": 1, "on_refuse": "queue",
		"max_wait_ms": 5000, "match": {"tiers": ["`+queued.Slug+`"]}}`)
	mustPolicy(t, base, `{"name": "steady-r", "algorithm": "gcra", "rate": 20, "burst": 1,
		"match": {"tiers": ["`+rejected.Slug+`"]}}`)
	time.Sleep(1100 * time.Millisecond)
	statuses := func(key string) map[int]int {
		var mu sync.Mutex
		got := map[int]int{}
		var wg sync.WaitGroup
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := do(t, "GET", base+"/api/demo/echo", key, "")
				mu.Lock()
				got[r.status]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		return got
	}
	if got := statuses(qKey); got[200] != 6 {
		t.Fatalf("queued: statuses %v, want all 6 admitted after waiting", got)
	}
	if got := statuses(rKey); got[429] == 0 {
		t.Fatalf("rejected: statuses %v, want refusals past the burst", got)
	}
}

// TestParamPolicyLimitsEachValue: a param policy keeps one limit per value
// of a header, per tenant, with an exception for a hot value.
func TestParamPolicyLimitsEachValue(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(36, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	_, key := s.tenant(tier.Slug)
	mustPolicy(t, base, `{"name": "per-term", "algorithm": "fixed_window", "limit": 2, "window_seconds": 86400,
		"scope": "param", "param": "header:X-Term", "exceptions": {"hot": 4}}`)
	time.Sleep(1100 * time.Millisecond)
	admittedOf := func(term string) int {
		n := 0
		for range 6 {
			if r := do(t, "GET", base+"/api/demo/echo", key, "", "X-Term", term); r.status == 200 {
				n++
			}
		}
		return n
	}
	if a, b, hot := admittedOf("apples"), admittedOf("pears"), admittedOf("hot"); a != 2 || b != 2 || hot != 4 {
		t.Fatalf("admitted apples %d, pears %d, hot %d: want 2, 2 and 4", a, b, hot)
	}
	// a request without the header is not under the policy
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 || strings.Contains(r.header.Get("RateLimit-Policy"), "per-term") {
		t.Fatalf("without the header: %d, RateLimit-Policy %q", r.status, r.header.Get("RateLimit-Policy"))
	}
}

// TestCheckAppliesThePoliciesOfItsMeter: /v1/check is decided with the
// policies of its meter and tier; one that selects a path does not apply to
// it (a check has none).
func TestCheckAppliesThePoliciesOfItsMeter(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(37, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	tenant, _ := s.tenant(tier.Slug)
	mustPolicy(t, base, `{"name": "checks", "algorithm": "fixed_window", "limit": 2, "window_seconds": 86400, "match": {"meters": ["searches"]}}`)
	mustPolicy(t, base, `{"name": "by-path", "algorithm": "fixed_window", "limit": 1, "window_seconds": 86400, "match": {"path_prefix": "/api/"}}`)
	time.Sleep(1100 * time.Millisecond)
	check := func() map[string]any {
		r := do(t, "POST", base+"/v1/check", serviceToken, `{"tenant_id": "`+tenant.ID+`", "meter": "searches", "cost": 1}`)
		if r.status != 200 {
			t.Fatalf("check: %d %s", r.status, r.body)
		}
		return r.json(t)
	}
	for i := range 3 {
		got := check()
		if got["allowed"] != (i < 2) {
			t.Fatalf("check %d: %v", i, got)
		}
		if i == 2 && fmt.Sprint(got["violated_policies"]) != "[checks]" {
			t.Fatalf("check %d: violated %v, want [checks] only (by-path selects a path)", i, got["violated_policies"])
		}
	}
}

// TestQueuedRequestLeavesWhenItsClientHangsUp: a request waiting in a
// policy queue leaves it when its client closes the connection, long
// before its max wait.
func TestQueuedRequestLeavesWhenItsClientHangsUp(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(38, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	_, key := s.tenant(tier.Slug)
	// one request per 20 s: the second waits (max 60 s) for its turn
	mustPolicy(t, base, `{"name": "slow-q", "algorithm": "gcra", "rate": 0.05, "burst": 1, "on_refuse": "queue", "max_wait_ms": 60000}`)
	waitPolicy(t, base, key, "slow-q")
	waiters := func() string {
		for _, l := range strings.Split(string(do(t, "GET", base+"/metrics", "", "").body), "\n") {
			if strings.HasPrefix(l, "tollgate_policy_queue_waiters ") {
				return strings.TrimPrefix(l, "tollgate_policy_queue_waiters ")
			}
		}
		return "absent"
	}
	client := &http.Client{Timeout: 1500 * time.Millisecond}
	req, err := http.NewRequest("GET", base+"/api/demo/echo", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	done := make(chan error, 1)
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %d while it should still wait", resp.StatusCode)
		}
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for waiters() != "1" {
		if time.Now().After(deadline) {
			t.Fatalf("the second request never waited in the queue: waiters %s", waiters())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// the client gave up and closed its connection
	t.Logf("the waiting client: %v", <-done)
	for waiters() != "0" {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatalf("the request still waits after its client hung up: waiters %s", waiters())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestUsageAndSummaryShowThePolicies: /v1/usage and the admin summary list
// the tier's policies with the same state.
func TestUsageAndSummaryShowThePolicies(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(39, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	tenant, key := s.tenant(tier.Slug)
	mustPolicy(t, base, `{"name": "five-a-day", "algorithm": "fixed_window", "limit": 5, "window_seconds": 86400}`)
	waitPolicy(t, base, key, "five-a-day")
	do(t, "GET", base+"/api/demo/echo", key, "")
	own := do(t, "GET", base+"/v1/usage", key, "").json(t)["policies"]
	summary := admin(t, "GET", base+"/admin/v1/tenants/"+tenant.ID+"/summary", "").json(t)["policies"]
	items, _ := own.([]any)
	if len(items) != 1 {
		t.Fatalf("/v1/usage policies %v, want one", own)
	}
	got := items[0].(map[string]any)
	if got["name"] != "five-a-day" || got["limit"] != 5.0 || got["remaining"] != 3.0 || got["algorithm"] != "fixed_window" {
		t.Fatalf("/v1/usage policy %v, want five-a-day with 3 of 5 left", got)
	}
	if fmt.Sprint(summary) != fmt.Sprint(own) {
		t.Fatalf("summary policies %v, /v1/usage %v: want the same", summary, own)
	}
}

// TestConsoleTenantPageShowsThePolicies: the console's tenant page lists
// the policies of the tenant's tier with the state /v1/usage shows.
func TestConsoleTenantPageShowsThePolicies(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(43, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	tenant, key := s.tenant(tier.Slug)
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	if r := c.get("/console/tenants/" + tenant.ID); !strings.Contains(string(r.body), "No policies apply to this tenant's plan") {
		t.Fatalf("before any policy, the tenant page does not say none applies:\n%s", r.body)
	}
	mustPolicy(t, base, `{"name": "seven-a-day", "algorithm": "fixed_window", "limit": 7, "window_seconds": 86400}`)
	waitPolicy(t, base, key, "seven-a-day") // one request: 6 left
	body := string(c.get("/console/tenants/" + tenant.ID).body)
	row := regexp.MustCompile(`(?s)<tr data-policy="seven-a-day">.*?</tr>`).FindString(body)
	if !strings.Contains(row, `<td class="limit">7</td>`) || !strings.Contains(row, `<td class="remaining">6</td>`) {
		t.Fatalf("the tenant page's policy row %q, want limit 7 and 6 remaining", row)
	}
}

// TestIPPolicyLimitsEachClientAddress: an ip policy counts a client
// address's requests across tenants (its state in a slot of its own,
// reserved before the tenant's decision).
func TestIPPolicyLimitsEachClientAddress(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(44, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	_, key1 := s.tenant(tier.Slug)
	_, key2 := s.tenant(tier.Slug)
	mustPolicy(t, base, `{"name": "per-address", "algorithm": "fixed_window", "limit": 3, "window_seconds": 86400, "scope": "ip"}`)
	waitPolicy(t, base, key1, "per-address") // one request from 127.0.0.1
	statuses := []int{}
	for _, key := range []string{key2, key1, key2} {
		statuses = append(statuses, do(t, "GET", base+"/api/demo/echo", key, "").status)
	}
	if fmt.Sprint(statuses) != "[200 200 429]" {
		t.Fatalf("statuses %v, want [200 200 429]: the address's 4th request is refused whichever tenant sends it", statuses)
	}
	// the refused request consumed no quota of its tenant: one of two
	// requests counted
	if r := do(t, "GET", base+"/api/demo/echo", key2, ""); !strings.Contains(r.header.Get("RateLimit"), `"daily";r=99;`) {
		t.Fatalf("the second tenant's daily quota after a refusal: RateLimit %q, want 99 left", r.header.Get("RateLimit"))
	}
}
