package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

const (
	serviceToken = "service-token-for-tests-0123"
	adminToken   = "admin-token-for-tests-012345"
)

// stack is one test's database (its pool and store), Redis prefix, shared
// by the API instances it starts.
type stack struct {
	tb     testing.TB
	dbURL  string
	redis  string
	prefix string
	pool   *pgxpool.Pool
	store  *catalogdb.Store
	routes string // TOLLGATE_ROUTES, optional
}

func mustStack(tb testing.TB) *stack {
	tb.Helper()
	dbURL := testenv.MigratedDatabase(tb)
	pool, err := pgdb.Open(context.Background(), dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	rdb := testenv.Redis(tb)
	return &stack{tb: tb, dbURL: dbURL, redis: testenv.RedisURL(tb), prefix: testenv.Prefix(tb, rdb), pool: pool, store: catalogdb.NewStore(pool)}
}

// start runs one API instance of the stack and returns its base URL.
func (s *stack) start() string {
	s.tb.Helper()
	return s.startWith(nil)
}

// startWith runs one API instance of the stack with extra variables.
func (s *stack) startWith(extra map[string]string) string {
	s.tb.Helper()
	return startAPI(s.tb, s.env(extra))
}

// env is the environment of the stack's API instances, with extra
// variables.
func (s *stack) env(extra map[string]string) map[string]string {
	env := map[string]string{
		"REDIS_URL": s.redis, "DATABASE_URL": s.dbURL, "TOLLGATE_REDIS_PREFIX": s.prefix,
		"TOLLGATE_SERVICE_TOKEN": serviceToken, "TOLLGATE_ADMIN_TOKEN": adminToken, "TOLLGATE_ROUTES": s.routes, "TOLLGATE_SHUTDOWN_TIMEOUT": "2s",
		// A small body limit lets the oversized-body test send a body the server
		// reads whole before its 413: a larger one is refused mid-upload and the
		// client may see a reset instead of the answer.
		"TOLLGATE_BODY_LIMIT": "2048",
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// tier creates a tier of the stack's own with the given limits, ranked rank.
func (s *stack) tier(rank int, l quota.Limits, mut ...func(*quota.Tier)) quota.Tier {
	s.tb.Helper()
	t := quota.Tier{Slug: fmt.Sprintf("t%d-%s", rank, testenv.RandomHex(3)), Name: fmt.Sprintf("Tier %d", rank), Rank: rank,
		PriceCents: int64(rank) * 100, Limits: l, Overage: quota.OverageBlock, UpgradeURL: "https://example.test/up"}
	for _, m := range mut {
		m(&t)
	}
	t, err := s.store.CreateTier(context.Background(), "test", t)
	if err != nil {
		s.tb.Fatal(err)
	}
	return t
}

// tenant creates a tenant on tier with one key and returns both.
func (s *stack) tenant(tier string) (quota.Tenant, string) {
	s.tb.Helper()
	t, err := s.store.CreateTenant(context.Background(), "test", "tenant-"+testenv.RandomHex(3), tier)
	if err != nil {
		s.tb.Fatal(err)
	}
	k, err := s.store.IssueKey(context.Background(), "test", t.ID, "test")
	if err != nil {
		s.tb.Fatal(err)
	}
	return t, k.Secret
}

// flushAndInvoice runs the worker's flush and invoicer once, on the real
// clock: the usage counted so far is in the ledger and in the drafts.
func (s *stack) flushAndInvoice() {
	s.tb.Helper()
	ctx := context.Background()
	rec := billing.NewReconciler(s.pool, quotaredis.New(testenv.Redis(s.tb), s.prefix), time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := rec.Flush(ctx); err != nil {
		s.tb.Fatal(err)
	}
	if err := billing.NewInvoicer(s.pool, time.Now, 48*time.Hour).Run(ctx); err != nil {
		s.tb.Fatal(err)
	}
}

// publisher returns a catalog used only to publish invalidations, as the
// admin API of another node would.
func (s *stack) publisher() *catalog.Catalog {
	rdb := testenv.Redis(s.tb)
	return catalog.New(s.store, rdb, s.prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(tb testing.TB) map[string]any {
	tb.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		tb.Fatalf("body %q is not a JSON object: %v", r.body, err)
	}
	return m
}

func do(tb testing.TB, method, url, key string, body string, headers ...string) reply {
	tb.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

var rateLimitItem = regexp.MustCompile(`"(\w+)";r=(\d+);t=(\d+)`)

// remaining parses the RateLimit header into name -> r.
func remaining(tb testing.TB, h http.Header) map[string]int64 {
	tb.Helper()
	out := map[string]int64{}
	for _, m := range rateLimitItem.FindAllStringSubmatch(h.Get("RateLimit"), -1) {
		n, _ := strconv.ParseInt(m[2], 10, 64)
		out[m[1]] = n
	}
	return out
}

func TestHeadersFollowTheTierAfterAKnownSequence(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(5, quota.Limits{BurstRate: quota.Ptr(0.01), Burst: quota.Ptr(int64(5)),
		BucketCapacity: quota.Ptr(int64(100)), BucketRefillPerSec: quota.Ptr(0.01),
		DailyQuota: quota.Ptr(int64(50)), MonthlyQuota: quota.Ptr(int64(1000))})
	_, key := s.tenant(tier.Slug)
	var last reply
	for i := range 3 {
		last = do(t, "GET", base+"/api/demo/echo", key, "")
		if last.status != 200 {
			t.Fatalf("request %d: status %d, want 200: %s", i, last.status, last.body)
		}
	}
	// Two of the report route (cost 10) through X-API-Key.
	for range 2 {
		req, _ := http.NewRequest("POST", base+"/api/demo/report", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 {
			t.Fatalf("report: status %d, want 201", resp.StatusCode)
		}
		last = reply{resp.StatusCode, resp.Header, nil}
	}
	wantPolicy := `"burst";q=5;w=500, "bucket";q=100;w=10000, "daily";q=50;w=86400, "monthly";q=1000;w=`
	if got := last.header.Get("RateLimit-Policy"); !strings.HasPrefix(got, wantPolicy) {
		t.Errorf("RateLimit-Policy = %q, want it to start %q", got, wantPolicy)
	}
	// 5 requests, 3×1 + 2×10 = 23 units.
	want := map[string]int64{"burst": 0, "bucket": 77, "daily": 27, "monthly": 977}
	got := remaining(t, last.header)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("RateLimit %s r=%d, want %d (header %q)", k, got[k], v, last.header.Get("RateLimit"))
		}
	}
	if l, r := last.header.Get("X-RateLimit-Limit"), last.header.Get("X-RateLimit-Remaining"); l != "5" || r != "0" {
		t.Errorf("X-RateLimit-Limit/Remaining = %s/%s, want 5/0 (burst is the tightest)", l, r)
	}
	if reset, _ := strconv.ParseInt(last.header.Get("X-RateLimit-Reset"), 10, 64); reset < time.Now().Unix() {
		t.Errorf("X-RateLimit-Reset = %d, want a future Unix time", reset)
	}
}

func TestRefusalBodyAndUpgradeHint(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	small := s.tier(3, quota.Limits{DailyQuota: quota.Ptr(int64(2))})
	// The seeded tiers above (pro, enterprise) have burst limits small has
	// not: they give less, and are never the hint (TestUpgradeHintNeverProposesLess).
	bigger := s.tier(40, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	top := s.tier(900, quota.Limits{DailyQuota: quota.Ptr(int64(1))})
	_, key := s.tenant(small.Slug)
	for range 2 {
		if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
			t.Fatalf("status %d, want 200", r.status)
		}
	}
	r := do(t, "GET", base+"/api/demo/echo", key, "")
	if r.status != 429 || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("status %d type %q, want 429 problem+json: %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	p := r.json(t)
	if p["type"] != "https://iana.org/assignments/http-problem-types#quota-exceeded" {
		t.Errorf("type = %v", p["type"])
	}
	if v, _ := p["violated-policies"].([]any); len(v) != 1 || v[0] != "daily" {
		t.Errorf("violated-policies = %v, want [daily]", p["violated-policies"])
	}
	if p["limit"] != 2.0 || p["remaining"] != 0.0 {
		t.Errorf("limit/remaining = %v/%v, want 2/0", p["limit"], p["remaining"])
	}
	ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
	if p["retry_after"] != float64(ra) || ra < 1 || ra > 86400 {
		t.Errorf("retry_after = %v, Retry-After = %q; want equal and within a day", p["retry_after"], r.header.Get("Retry-After"))
	}
	up, _ := p["upgrade"].(map[string]any)
	if up["tier"] != bigger.Slug || up["price_cents"] != float64(bigger.PriceCents) || up["daily_quota"] != 100.0 || up["url"] != bigger.UpgradeURL {
		t.Errorf("upgrade = %v, want the tier %s (more a day, no less of anything)", up, bigger.Slug)
	}
	if got := remaining(t, r.header)["daily"]; got != 0 {
		t.Errorf("RateLimit on the 429: daily r=%d, want 0", got)
	}
	// The top tier has no upgrade.
	_, topKey := s.tenant(top.Slug)
	do(t, "GET", base+"/api/demo/echo", topKey, "")
	if p := do(t, "GET", base+"/api/demo/echo", topKey, "").json(t); p["upgrade"] != nil {
		t.Errorf("top tier upgrade = %v, want null", p["upgrade"])
	}
}

// TestRetryAfterIsSufficientAndNotExcessive waits exactly Retry-After and
// expects admission, and waits a second less and expects refusal.
func TestRetryAfterIsSufficientAndNotExcessive(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(4, quota.Limits{BurstRate: quota.Ptr(0.5), Burst: quota.Ptr(int64(1))}) // one per 2 s
	_, key := s.tenant(tier.Slug)
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
		t.Fatalf("first: %d", r.status)
	}
	r := do(t, "GET", base+"/api/demo/echo", key, "")
	if r.status != 429 {
		t.Fatalf("second: status %d, want 429", r.status)
	}
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 2 {
		t.Fatalf("Retry-After = %q, want 1 or 2 (one request per 2 s)", r.header.Get("Retry-After"))
	}
	if ra == 2 {
		// Not excessive: the refusal consumed nothing, so one second short
		// of Retry-After is still too early (the limiter admits at ~2 s).
		time.Sleep(time.Second)
		if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 429 {
			t.Fatalf("after Retry-After-1 = 1 s: status %d, want 429 (Retry-After must not be shorter than needed)", r.status)
		}
		time.Sleep(time.Second)
	} else {
		time.Sleep(time.Duration(ra) * time.Second)
	}
	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
		t.Fatalf("after waiting Retry-After=%d s: status %d, want 200 (%s)", ra, r.status, r.body)
	}
}

func TestIdempotentRepeatIsNotCountedAgain(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(6, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	_, key := s.tenant(tier.Slug)
	first := do(t, "POST", base+"/api/demo/report", key, "", "Idempotency-Key", "order-42")
	again := do(t, "POST", base+"/api/demo/report", key, "", "Idempotency-Key", "order-42")
	other := do(t, "POST", base+"/api/demo/report", key, "", "Idempotency-Key", "order-43")
	for name, r := range map[string]reply{"first": first, "repeat": again, "other key": other} {
		if r.status != 201 {
			t.Fatalf("%s: status %d, want 201", name, r.status)
		}
	}
	if got := remaining(t, first.header)["daily"]; got != 90 {
		t.Errorf("first: daily r=%d, want 90", got)
	}
	if got := remaining(t, again.header)["daily"]; got != 90 || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("repeat: daily r=%d replayed=%q, want 90 and true (not counted again)", got, again.header.Get("Idempotent-Replayed"))
	}
	if got := remaining(t, other.header)["daily"]; got != 80 {
		t.Errorf("another key: daily r=%d, want 80", got)
	}
	bad := do(t, "POST", base+"/api/demo/report", key, "", "Idempotency-Key", strings.Repeat("k", 300))
	if bad.status != 400 {
		t.Errorf("oversized Idempotency-Key: status %d, want 400", bad.status)
	}
}

func TestUpstreamProxyRefundsOn5xxAndHidesTheKey(t *testing.T) {
	t.Parallel()
	var sawKey atomic.Bool
	var tenantSeen atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" || r.Header.Get("X-API-Key") != "" {
			sawKey.Store(true)
		}
		tenantSeen.Store(r.Header.Get("X-Tollgate-Tenant-Id"))
		if strings.HasSuffix(r.URL.Path, "/fail") {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, `{"path": %q, "query": %q}`, r.URL.Path, r.URL.RawQuery)
	}))
	t.Cleanup(up.Close)
	s := mustStack(t)
	s.routes = filepath.Join(t.TempDir(), "routes.json")
	table := fmt.Sprintf(`{"routes": [
		{"method": "*", "path": "/api/up/", "meter": "up", "cost": 5, "upstream": %q, "timeout": "5s", "refund_on_5xx": true},
		{"method": "*", "path": "/api/norefund/", "meter": "nr", "cost": 5, "upstream": %q},
		{"method": "GET", "path": "/api/dead/", "meter": "dead", "cost": 5, "upstream": "http://127.0.0.1:1/", "refund_on_5xx": true}
	]}`, up.URL+"/v1/", up.URL+"/v1/")
	if err := os.WriteFile(s.routes, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	base := s.start()
	tier := s.tier(7, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	tenant, key := s.tenant(tier.Slug)

	ok := do(t, "GET", base+"/api/up/items?x=1", key, "")
	if ok.status != 200 || !strings.Contains(string(ok.body), `"/v1/items"`) || !strings.Contains(string(ok.body), `x=1`) {
		t.Fatalf("proxied: %d %s, want 200 from /v1/items?x=1", ok.status, ok.body)
	}
	if got := remaining(t, ok.header)["daily"]; got != 95 {
		t.Fatalf("after a proxied call: daily r=%d, want 95", got)
	}
	if sawKey.Load() {
		t.Fatal("the upstream received the tenant's API key")
	}
	if got := tenantSeen.Load(); got != tenant.ID {
		t.Fatalf("X-Tollgate-Tenant-Id = %v, want %s", got, tenant.ID)
	}
	fail := do(t, "GET", base+"/api/up/fail", key, "")
	if fail.status != 500 || fail.header.Get("Tollgate-Refunded") != "5" {
		t.Fatalf("upstream 500: status %d refunded %q, want 500 and 5", fail.status, fail.header.Get("Tollgate-Refunded"))
	}
	dead := do(t, "GET", base+"/api/dead/x", key, "")
	if dead.status != 502 || dead.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("dead upstream: status %d type %q, want 502 problem+json", dead.status, dead.header.Get("Content-Type"))
	}
	noRefund := do(t, "GET", base+"/api/norefund/fail", key, "")
	if noRefund.status != 500 || noRefund.header.Get("Tollgate-Refunded") != "" {
		t.Fatalf("route without refund: status %d refunded %q, want 500 and none", noRefund.status, noRefund.header.Get("Tollgate-Refunded"))
	}
	u := do(t, "GET", base+"/v1/usage", key, "").json(t)
	// 5 (ok) + 5 (fail, refunded) + 5 (dead, refunded) + 5 (no refund) = 10 kept.
	for _, l := range u["limits"].([]any) {
		if l := l.(map[string]any); l["name"] == "daily" && l["remaining"] != 90.0 {
			t.Fatalf("daily remaining after refunds = %v, want 90", l["remaining"])
		}
	}
}

func TestTenantsSeeOnlyTheirOwnUsage(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(8, quota.Limits{DailyQuota: quota.Ptr(int64(1000)), MonthlyQuota: quota.Ptr(int64(5000))})
	a, keyA := s.tenant(tier.Slug)
	b, keyB := s.tenant(tier.Slug)
	for range 3 {
		do(t, "GET", base+"/api/demo/echo", keyA, "")
	}
	do(t, "POST", base+"/api/demo/report", keyB, "")
	for _, tc := range []struct {
		key, id string
		units   float64
	}{{keyA, a.ID, 3}, {keyB, b.ID, 10}} {
		r := do(t, "GET", base+"/v1/usage", tc.key, "")
		if r.status != 200 {
			t.Fatalf("usage: %d %s", r.status, r.body)
		}
		u := r.json(t)
		if u["tenant_id"] != tc.id || u["tier"] != tier.Slug {
			t.Fatalf("usage tenant_id %v tier %v, want %s %s", u["tenant_id"], u["tier"], tc.id, tier.Slug)
		}
		var units float64
		for _, d := range u["daily"].([]any) {
			units += d.(map[string]any)["units"].(float64)
		}
		if units != tc.units {
			t.Errorf("tenant %s sees %v units, want its own %v", tc.id, units, tc.units)
		}
		names := []string{}
		for _, l := range u["limits"].([]any) {
			names = append(names, l.(map[string]any)["name"].(string))
		}
		if strings.Join(names, ",") != "daily,monthly" {
			t.Errorf("limits %v, want daily,monthly", names)
		}
		inv := do(t, "GET", base+"/v1/invoices", tc.key, "")
		if inv.status != 200 {
			t.Fatalf("invoices: %d %s", inv.status, inv.body)
		}
	}
	// No way to name another tenant on the tenant side.
	if r := do(t, "GET", base+"/v1/usage?tenant_id="+b.ID, keyA, ""); r.json(t)["tenant_id"] != a.ID {
		t.Fatal("a tenant_id parameter let tenant A read tenant B's usage")
	}
}

func TestAuthenticationFailures(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	_, key := s.tenant("free")
	suspended, skey := s.tenant("free")
	if _, err := s.pool.Exec(context.Background(), `UPDATE tenants SET status = 'suspended' WHERE id = $1`, suspended.ID); err != nil {
		t.Fatal(err)
	}
	revokedT, rkey := s.tenant("free")
	expiredT, ekey := s.tenant("free")
	if _, err := s.pool.Exec(context.Background(), `UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1`, revokedT.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(context.Background(), `UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE tenant_id = $1`, expiredT.ID); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		key    string
		status int
	}{
		{"valid", key, 200},
		{"missing", "", 401},
		{"malformed", "not-a-key", 401},
		{"unknown", "tg_aaaaaaaa_" + strings.Repeat("A", 40), 401},
		{"revoked", rkey, 401},
		{"expired", ekey, 401},
		{"suspended", skey, 403},
	} {
		r := do(t, "GET", base+"/api/demo/echo", tc.key, "")
		if r.status != tc.status {
			t.Errorf("%s key: status %d, want %d (%s)", tc.name, r.status, tc.status, r.body)
		}
		if tc.status != 200 && r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s key: Content-Type %q, want problem+json", tc.name, r.header.Get("Content-Type"))
		}
	}
	// Repeated failures from one address are limited (20 at once).
	limited := false
	for range 30 {
		if r := do(t, "GET", base+"/api/demo/echo", "tg_bbbbbbbb_"+strings.Repeat("B", 40), ""); r.status == 429 {
			limited = r.header.Get("Retry-After") != ""
			break
		}
	}
	if !limited {
		t.Fatal("30 failed keys from one address were never answered 429 with Retry-After")
	}
}

// TestRedisOutageFailOpenAndFailClosed stops the API's Redis mid-test: the
// fail-open tier keeps being served by the in-process limiter at its own
// limits, the fail-closed tier gets 503, and both recover by themselves.
func TestRedisOutageFailOpenAndFailClosed(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	proc := testenv.StartRedis(t)
	s.redis = proc.URL
	base := s.start()
	open := s.tier(11, quota.Limits{BurstRate: quota.Ptr(0.001), Burst: quota.Ptr(int64(3)), DailyQuota: quota.Ptr(int64(100))},
		func(t *quota.Tier) { t.FailOpen = true })
	closed := s.tier(12, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	_, openKey := s.tenant(open.Slug)
	_, closedKey := s.tenant(closed.Slug)
	for _, k := range []string{openKey, closedKey} {
		if r := do(t, "GET", base+"/api/demo/echo", k, ""); r.status != 200 || r.header.Get("Tollgate-Degraded") != "" {
			t.Fatalf("before the outage: %d degraded=%q, want 200 and not degraded", r.status, r.header.Get("Tollgate-Degraded"))
		}
	}

	proc.Stop()
	statuses := map[int]int{}
	for range 5 {
		r := do(t, "GET", base+"/api/demo/echo", openKey, "")
		statuses[r.status]++
		if r.status == 200 && r.header.Get("Tollgate-Degraded") != "fail-open" {
			t.Fatalf("fail-open answer lacks Tollgate-Degraded: fail-open")
		}
	}
	// The local limiter starts empty: the burst of 3 passes, then it refuses.
	if statuses[200] != 3 || statuses[429] != 2 {
		t.Fatalf("fail-open during the outage: %v, want 3×200 then 2×429 (the tier's burst, never unlimited)", statuses)
	}
	r := do(t, "GET", base+"/api/demo/echo", closedKey, "")
	if r.status != 503 || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("fail-closed during the outage: %d %q, want 503 problem+json", r.status, r.header.Get("Content-Type"))
	}

	proc.Start()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := do(t, "GET", base+"/api/demo/echo", closedKey, "")
		if r.status == 200 && r.header.Get("Tollgate-Degraded") == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery 10 s after Redis came back: last status %d", r.status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestTwoInstancesNeverAdmitMoreThanTheQuota hammers one tenant through two
// API instances sharing Redis.
func TestTwoInstancesNeverAdmitMoreThanTheQuota(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	bases := []string{s.start(), s.start()}
	tier := s.tier(13, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	_, key := s.tenant(tier.Slug)
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := bases[i%2]
			for range 20 {
				switch r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status {
				case 200:
					admitted.Add(1)
				case 429:
					refused.Add(1)
				default:
					t.Errorf("status %d", r.status)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 100 || refused.Load() != 220 {
		t.Fatalf("admitted %d refused %d of 320, want exactly 100 admitted", admitted.Load(), refused.Load())
	}
}

// TestAdminChangeReachesTheOtherInstanceWithinASecond changes a tenant's tier
// behind instance B's cache and publishes the change from elsewhere.
func TestAdminChangeReachesTheOtherInstanceWithinASecond(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	baseB := s.start()
	small := s.tier(14, quota.Limits{DailyQuota: quota.Ptr(int64(10))})
	big := s.tier(15, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	tenant, key := s.tenant(small.Slug)
	if r := do(t, "GET", baseB+"/api/demo/echo", key, ""); !strings.Contains(r.header.Get("RateLimit-Policy"), `"daily";q=10;`) {
		t.Fatalf("before: policy %q, want daily q=10", r.header.Get("RateLimit-Policy"))
	}
	if _, err := s.pool.Exec(context.Background(), `UPDATE tenants SET tier = $2, updated_at = now() WHERE id = $1`, tenant.ID, big.Slug); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.publisher().Invalidate(context.Background(), catalog.KindTenant, tenant.ID); err != nil {
		t.Fatal(err)
	}
	for {
		r := do(t, "GET", baseB+"/api/demo/echo", key, "")
		if strings.Contains(r.header.Get("RateLimit-Policy"), `"daily";q=1000;`) {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("instance B still applies %q 1 s after the change", r.header.Get("RateLimit-Policy"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCheckEndpoint(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(16, quota.Limits{DailyQuota: quota.Ptr(int64(10))})
	bigger := s.tier(17, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	tenant, key := s.tenant(tier.Slug)
	check := func(body string, token string) reply {
		return do(t, "POST", base+"/v1/check", token, body)
	}
	if r := check(`{"tenant_id": "`+tenant.ID+`", "meter": "m", "cost": 1}`, ""); r.status != 401 {
		t.Fatalf("without the service token: %d, want 401", r.status)
	}
	if r := check(`{"tenant_id": "`+tenant.ID+`", "meter": "m", "cost": 1}`, key); r.status != 401 {
		t.Fatalf("with a tenant key as service token: %d, want 401", r.status)
	}
	dry := check(`{"tenant_id": "`+tenant.ID+`", "meter": "m", "cost": 8, "dry_run": true}`, serviceToken).json(t)
	if dry["allowed"] != true {
		t.Fatalf("dry run of 8 of 10: %v, want allowed", dry)
	}
	counted := check(`{"api_key": "`+key+`", "meter": "m", "cost": 8}`, serviceToken).json(t)
	if counted["allowed"] != true || counted["limits"].([]any)[0].(map[string]any)["remaining"] != 2.0 {
		t.Fatalf("check of 8: %v, want allowed with 2 remaining (the dry run consumed nothing)", counted)
	}
	if counted["tenant_id"] != tenant.ID {
		t.Fatalf("check by api_key: tenant_id %v, want %s (for settle, refund and release)", counted["tenant_id"], tenant.ID)
	}
	over := check(`{"tenant_id": "`+tenant.ID+`", "meter": "m", "cost": 3}`, serviceToken).json(t)
	if up, _ := over["upgrade"].(map[string]any); over["allowed"] != false || over["retry_after"] == nil || up["tier"] != bigger.Slug {
		t.Fatalf("check over the quota: %v, want refused with retry_after and upgrade %s", over, bigger.Slug)
	}
	for _, tc := range []struct{ name, body, field string }{
		{"unknown field", `{"tenant_id": "` + tenant.ID + `", "meter": "m", "extra": 1}`, "extra"},
		{"negative cost", `{"tenant_id": "` + tenant.ID + `", "meter": "m", "cost": -1}`, "cost"},
		{"huge cost", `{"tenant_id": "` + tenant.ID + `", "meter": "m", "cost": 1e30}`, "cost"},
		{"string cost", `{"tenant_id": "` + tenant.ID + `", "meter": "m", "cost": "1"}`, "cost"},
		{"bad meter", `{"tenant_id": "` + tenant.ID + `", "meter": "A|B"}`, "meter"},
		{"no tenant", `{"meter": "m"}`, "api_key"},
		{"bad tenant id", `{"tenant_id": "x", "meter": "m"}`, "tenant_id"},
		{"malformed", `{"tenant_id": `, ""},
		{"two objects", `{"meter": "m"} {}`, ""},
		{"array", `[1]`, ""},
	} {
		r := check(tc.body, serviceToken)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: status %d type %q, want 400 problem+json (%s)", tc.name, r.status, r.header.Get("Content-Type"), r.body)
			continue
		}
		if p := r.json(t); tc.field != "" && p["field"] != tc.field {
			t.Errorf("%s: field %v, want %q", tc.name, p["field"], tc.field)
		}
	}
	if r := check(`{"tenant_id": "00000000-0000-0000-0000-000000000000", "meter": "m"}`, serviceToken); r.status != 404 {
		t.Errorf("unknown tenant: %d, want 404", r.status)
	}
	// A dry run reports the room as if admitted: 2 left, minus this 1.
	after := check(`{"tenant_id": "`+tenant.ID+`", "meter": "m", "cost": 1, "dry_run": true}`, serviceToken).json(t)
	if after["limits"].([]any)[0].(map[string]any)["remaining"] != 1.0 {
		t.Fatalf("bad requests changed the state: %v", after)
	}
}

func TestMetricsCountRequests(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(17, quota.Limits{DailyQuota: quota.Ptr(int64(1))})
	_, key := s.tenant(tier.Slug)
	do(t, "GET", base+"/api/demo/echo", key, "")
	do(t, "GET", base+"/api/demo/echo", key, "")
	m := string(do(t, "GET", base+"/metrics", "", "").body)
	for _, want := range []string{
		`tollgate_requests_total{outcome="allowed",route="demo",tier="` + tier.Slug + `"} 1`,
		`tollgate_requests_total{outcome="refused",route="demo",tier="` + tier.Slug + `"} 1`,
		`tollgate_admission_seconds_count`,
		`tollgate_key_cache_lookups_total{result="hit"}`,
		`tollgate_redis_errors_total 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
