package api

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/textproto"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/internal/app"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The Envoy services through the real api and a real grpc-go client with
// go-control-plane's stubs, as Envoy calls them.

// envoyAPI is an api of a stack serving gRPC on loopback, with clients of
// its services.
type envoyAPI struct {
	base   string
	rls    rlsv3.RateLimitServiceClient
	authz  authv3.AuthorizationClient
	health healthpb.HealthClient
	stop   func()
}

// startEnvoyAPI starts an api of s with TOLLGATE_GRPC_ADDR on a free
// loopback port and connects to it.
func startEnvoyAPI(tb testing.TB, s *stack, extra ...map[string]string) *envoyAPI {
	tb.Helper()
	env := s.env(map[string]string{"TOLLGATE_GRPC_ADDR": "127.0.0.1:0"})
	for _, m := range extra {
		for k, v := range m {
			env[k] = v
		}
	}
	base, addr, stop := startListeningAPI(tb, env)
	if addr == "" {
		tb.Fatal(`the "listening" line names no grpc_addr with TOLLGATE_GRPC_ADDR set`)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return &envoyAPI{base: base, rls: rlsv3.NewRateLimitServiceClient(conn), authz: authv3.NewAuthorizationClient(conn),
		health: healthpb.NewHealthClient(conn), stop: stop}
}

// desc is a descriptor of entries given as key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// limit asks ShouldRateLimit about ds with the request's hits_addend.
func (e *envoyAPI) limit(tb testing.TB, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tollgate", Descriptors: ds, HitsAddend: hits})
	if err != nil {
		tb.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.GetStatuses()) != len(ds) {
		tb.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(ds))
	}
	return resp
}

// check asks ext_authz about a GET of path with headers and context
// extensions.
func (e *envoyAPI) check(tb testing.TB, path string, headers, ext map[string]string) *authv3.CheckResponse {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "GET", Path: path, Host: "api.example.test", Headers: headers}},
		ContextExtensions: ext}})
	if err != nil {
		tb.Fatalf("Check: %v", err)
	}
	return resp
}

// values is hs by name, in order.
func values(hs []*corev3.HeaderValue) ([]string, map[string]string) {
	var names []string
	m := map[string]string{}
	for _, h := range hs {
		k := textproto.CanonicalMIMEHeaderKey(h.GetKey())
		names = append(names, k)
		m[k] = h.GetValue()
	}
	return names, m
}

// optionValues is values of header options, each of which must replace
// what the request or answer had.
func optionValues(tb testing.TB, hs []*corev3.HeaderValueOption) ([]string, map[string]string) {
	tb.Helper()
	var plain []*corev3.HeaderValue
	for _, h := range hs {
		if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			tb.Errorf("header %s: append action %v, want OVERWRITE_IF_EXISTS_OR_ADD", h.GetHeader().GetKey(), h.GetAppendAction())
		}
		plain = append(plain, h.GetHeader())
	}
	return values(plain)
}

var secondsLeft = regexp.MustCompile(`;t=(\d+)`)

// sameQuotaHeaders fails unless every header of got has want's value, the
// seconds left of a RateLimit item (t=) within 2 of each other (the two
// answers were made at different instants).
func sameQuotaHeaders(tb testing.TB, what string, got map[string]string, want func(string) string) {
	tb.Helper()
	if len(got) == 0 {
		tb.Fatalf("%s: no headers", what)
	}
	for name, g := range got {
		w := want(name)
		if name == "Ratelimit" {
			gt, wt := secondsLeft.FindAllStringSubmatch(g, -1), secondsLeft.FindAllStringSubmatch(w, -1)
			if len(gt) != len(wt) {
				tb.Errorf("%s: %s %q, want %q", what, name, g, w)
				continue
			}
			for i := range gt {
				a, _ := strconv.Atoi(gt[i][1])
				b, _ := strconv.Atoi(wt[i][1])
				if a-b > 2 || b-a > 2 {
					tb.Errorf("%s: %s %q, want %q", what, name, g, w)
				}
			}
			g, w = secondsLeft.ReplaceAllString(g, ""), secondsLeft.ReplaceAllString(w, "")
		}
		if g != w {
			tb.Errorf("%s: %s %q, want %q", what, name, g, w)
		}
	}
}

var hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestEnvoyRateLimitAnswersAsTheMeteredRoute: a tenant's descriptors are
// admitted to its daily quota of 3, then refused, and each answer carries
// what the metered route answers a twin tenant at the same point: its
// quota headers, and on the refusal its headers and problem body to the
// byte (which /v1/check's relay of the same tenant equals too); the
// statuses map the daily limit to 3 a DAY with what is left; an admission
// names its request and tenant to the upstream.
func TestEnvoyRateLimitAnswersAsTheMeteredRoute(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	e := startEnvoyAPI(t, s)
	tier := s.tier(41, quota.Limits{DailyQuota: quota.Ptr(int64(3))})
	s.tier(42, quota.Limits{DailyQuota: quota.Ptr(int64(300))}) // the upgrade a refusal names
	tenant, key := s.tenant(tier.Slug)
	_, twinKey := s.tenant(tier.Slug)
	_, big := s.tenant(s.tier(43, quota.Limits{DailyQuota: quota.Ptr(int64(10))}).Slug)
	d := desc("generic_key", "ignored", "api_key", key, "meter", "demo", "path", "/api/demo/echo?page=2")

	var ids []string
	for i := range 3 {
		resp := e.limit(t, 0, d)
		twin := do(t, "GET", e.base+"/api/demo/echo", twinKey, "")
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || twin.status != 200 {
			t.Fatalf("call %d: %v (metered twin %d), want OK", i+1, resp.GetOverallCode(), twin.status)
		}
		st := resp.GetStatuses()[0]
		l := st.GetCurrentLimit()
		if st.GetCode() != rlsv3.RateLimitResponse_OK || l.GetName() != "daily" || l.GetRequestsPerUnit() != 3 ||
			l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY || st.GetLimitRemaining() != uint32(2-i) {
			t.Fatalf("call %d: status %v, want OK, daily 3 a DAY, %d remaining", i+1, st, 2-i)
		}
		if r := st.GetDurationUntilReset().AsDuration(); r <= 0 || r > 25*time.Hour {
			t.Fatalf("call %d: duration until reset %s, want within the day", i+1, r)
		}
		names, got := values(resp.GetResponseHeadersToAdd())
		sameQuotaHeaders(t, "OK call "+strconv.Itoa(i+1), got, twin.header.Get)
		if !slices.Contains(names, "Ratelimit-Policy") || !slices.Contains(names, "X-Ratelimit-Remaining") || got["Content-Type"] != "" {
			t.Fatalf("call %d: headers %v, want the quota headers and no content type", i+1, names)
		}
		_, up := values(resp.GetRequestHeadersToAdd())
		if !hex32.MatchString(up["Tollgate-Request-Id"]) || up["X-Tollgate-Tenant-Id"] != tenant.ID || slices.Contains(ids, up["Tollgate-Request-Id"]) {
			t.Fatalf("call %d: upstream headers %v, want a new request id and tenant %s", i+1, up, tenant.ID)
		}
		ids = append(ids, up["Tollgate-Request-Id"])
	}

	// At the quota: the refusal is the metered route's (retried when a
	// second ticked between the two, which moves Retry-After).
	var resp *rlsv3.RateLimitResponse
	var twin reply
	for try := 0; ; try++ {
		resp = e.limit(t, 0, d)
		twin = do(t, "GET", e.base+"/api/demo/echo", twinKey, "")
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || twin.status != 429 {
			t.Fatalf("past the quota: %v (twin %d), want OVER_LIMIT and 429", resp.GetOverallCode(), twin.status)
		}
		_, got := values(resp.GetResponseHeadersToAdd())
		if string(resp.GetRawBody()) == string(twin.body) && got["Retry-After"] == twin.header.Get("Retry-After") || try == 4 {
			break
		}
	}
	names, got := values(resp.GetResponseHeadersToAdd())
	if string(resp.GetRawBody()) != string(twin.body) {
		t.Fatalf("raw_body %s, want the metered route's %s", resp.GetRawBody(), twin.body)
	}
	sameQuotaHeaders(t, "OVER_LIMIT", got, twin.header.Get)
	for _, want := range []string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Retry-After", "Content-Type"} {
		if !slices.Contains(names, want) {
			t.Errorf("OVER_LIMIT headers %v lack %s", names, want)
		}
	}
	if got["Content-Type"] != "application/problem+json" || len(resp.GetRequestHeadersToAdd()) != 0 {
		t.Errorf("OVER_LIMIT: Content-Type %q, upstream headers %v, want problem+json and none", got["Content-Type"], resp.GetRequestHeadersToAdd())
	}
	var problem map[string]any
	if err := json.Unmarshal(resp.GetRawBody(), &problem); err != nil || problem["status"] != 429.0 || problem["instance"] != "/api/demo/echo" {
		t.Fatalf("raw_body %s, want a 429 problem naming the path without its query", resp.GetRawBody())
	}
	st := resp.GetStatuses()[0]
	if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() != 0 || st.GetCurrentLimit().GetRequestsPerUnit() != 3 {
		t.Fatalf("refused status %v, want OVER_LIMIT, daily 3, none left", st)
	}

	// /v1/check of the same tenant answers the same relay.
	for try := 0; ; try++ {
		check := do(t, "POST", e.base+"/v1/check", serviceToken, `{"api_key": "`+key+`", "meter": "demo", "path": "/api/demo/echo"}`).json(t)
		resp = e.limit(t, 0, d)
		_, got = values(resp.GetResponseHeadersToAdd())
		problem, _ := json.Marshal(check["problem"])
		var compact map[string]any
		_ = json.Unmarshal(resp.GetRawBody(), &compact)
		mine, _ := json.Marshal(compact)
		hs, _ := check["headers"].(map[string]any)
		same := string(problem) == string(mine) && len(hs) == len(got)
		for k, v := range hs {
			same = same && got[k] == v
		}
		if same {
			break
		}
		if try == 4 {
			t.Fatalf("/v1/check's relay %s %v, the call's %s %v: want the same", problem, hs, mine, got)
		}
	}

	// hits_addend is the cost: the request's, or the descriptor's own.
	if st := e.limit(t, 4, desc("api_key", big)).GetStatuses()[0]; st.GetLimitRemaining() != 6 {
		t.Fatalf("hits_addend 4 of 10: %d left, want 6", st.GetLimitRemaining())
	}
	costly := desc("api_key", "Bearer "+big)
	costly.HitsAddend = wrapperspb.UInt64(5)
	if st := e.limit(t, 4, costly).GetStatuses()[0]; st.GetLimitRemaining() != 1 {
		t.Fatalf("descriptor hits_addend 5 over the request's 4: %d left, want 1", st.GetLimitRemaining())
	}
}

// TestEnvoyRateLimitRefusesBadCalls: an unknown or missing key is
// OVER_LIMIT with the metered route's 401 problem, never OK; bad input is
// OVER_LIMIT with a 400 problem naming what is wrong; none of them counts
// anything.
func TestEnvoyRateLimitRefusesBadCalls(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	e := startEnvoyAPI(t, s)
	tier := s.tier(44, quota.Limits{DailyQuota: quota.Ptr(int64(5))})
	_, key := s.tenant(tier.Slug)
	suspended, suspendedKey := s.tenant(tier.Slug)
	if r := admin(t, "PATCH", e.base+"/admin/v1/tenants/"+suspended.ID, `{"status": "suspended"}`); r.status != 200 {
		t.Fatalf("suspending: %d %s", r.status, r.body)
	}
	unknown := "tg_" + strings.Repeat("a", len(key)-3)
	keyOnly := func(k string) *ratelimitv3.RateLimitDescriptor { return desc("api_key", k, "meter", "demo") }
	negative := keyOnly(key)
	negative.IsNegativeHits = true
	many := make([]*ratelimitv3.RateLimitDescriptor, 9)
	for i := range many {
		many[i] = keyOnly(key)
	}
	metered401 := do(t, "GET", e.base+"/api/demo/echo", "", "")
	for _, tc := range []struct {
		name   string
		hits   uint32
		ds     []*ratelimitv3.RateLimitDescriptor
		status float64
		field  string
		body   []byte // the whole body, when it is the metered route's
	}{
		{"unknown key", 0, []*ratelimitv3.RateLimitDescriptor{keyOnly(unknown)}, 401, "", nil},
		{"suspended tenant", 0, []*ratelimitv3.RateLimitDescriptor{keyOnly(suspendedKey)}, 403, "", nil},
		{"no api_key entry", 0, []*ratelimitv3.RateLimitDescriptor{desc("meter", "demo", "path", "/api/demo/echo")}, 401, "", metered401.body},
		{"empty api_key", 0, []*ratelimitv3.RateLimitDescriptor{keyOnly("  ")}, 401, "", nil},
		{"a refused key after a good one", 0, []*ratelimitv3.RateLimitDescriptor{keyOnly(key), keyOnly(unknown)}, 401, "", nil},
		{"no descriptors", 0, nil, 400, "descriptors", nil},
		{"too many descriptors", 0, many, 400, "descriptors", nil},
		{"oversized value", 0, []*ratelimitv3.RateLimitDescriptor{desc("api_key", key, "meter", strings.Repeat("m", 2000))}, 400, "descriptors", nil},
		{"bad meter", 0, []*ratelimitv3.RateLimitDescriptor{desc("api_key", key, "meter", "A|B")}, 400, "meter", nil},
		{"two meters", 0, []*ratelimitv3.RateLimitDescriptor{desc("api_key", key, "meter", "a", "meter", "b")}, 400, "meter", nil},
		{"cost past the maximum", 0, []*ratelimitv3.RateLimitDescriptor{func() *ratelimitv3.RateLimitDescriptor {
			d := keyOnly(key)
			d.HitsAddend = wrapperspb.UInt64(1 << 41)
			return d
		}()}, 400, "hits_addend", nil},
		{"negative hits", 0, []*ratelimitv3.RateLimitDescriptor{negative}, 400, "is_negative_hits", nil},
		{"control characters in the path", 0, []*ratelimitv3.RateLimitDescriptor{desc("api_key", key, "path", "/a\x00b")}, 400, "path", nil},
	} {
		resp := e.limit(t, tc.hits, tc.ds...)
		var p map[string]any
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || json.Unmarshal(resp.GetRawBody(), &p) != nil ||
			p["status"] != tc.status || tc.field != "" && p["field"] != tc.field {
			t.Errorf("%s: %v %s, want OVER_LIMIT with a %v problem (field %q)", tc.name, resp.GetOverallCode(), resp.GetRawBody(), tc.status, tc.field)
			continue
		}
		_, h := values(resp.GetResponseHeadersToAdd())
		if h["Content-Type"] != "application/problem+json" || len(resp.GetRequestHeadersToAdd()) != 0 {
			t.Errorf("%s: headers %v, upstream %v, want problem+json and nothing for the upstream", tc.name, h, resp.GetRequestHeadersToAdd())
		}
		if tc.status == 401 && !strings.HasPrefix(h["Www-Authenticate"], `Bearer realm="tollgate"`) {
			t.Errorf("%s: WWW-Authenticate %q, want the metered route's challenge", tc.name, h["Www-Authenticate"])
		}
		if tc.body != nil && string(resp.GetRawBody()) != string(tc.body) {
			t.Errorf("%s: body %s, want the metered route's %s", tc.name, resp.GetRawBody(), tc.body)
		}
		for _, st := range resp.GetStatuses() {
			if st.GetCode() == rlsv3.RateLimitResponse_OK && tc.name != "a refused key after a good one" {
				t.Errorf("%s: a status is OK", tc.name)
			}
		}
	}
	// A message past the bound is refused by gRPC itself, and the server
	// serves on.
	huge := desc("api_key", key)
	for range 20 {
		huge.Entries = append(huge.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "x", Value: strings.Repeat("v", 16<<10)})
	}
	if _, err := e.rls.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{huge}}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a 320 KiB request: %v, want RESOURCE_EXHAUSTED", err)
	}
	// Nothing was counted: 5 left, 4 after this dry run's 1.
	r := do(t, "POST", e.base+"/v1/check", serviceToken, `{"api_key": "`+key+`", "meter": "demo", "dry_run": true}`).json(t)
	if left := r["limits"].([]any)[0].(map[string]any)["remaining"]; left != 4.0 {
		t.Fatalf("after the refused calls a dry run leaves %v, want 4: a refused call counted", left)
	}
	// Each call is counted by its outcome (the oversized one never reached
	// the service).
	m := string(do(t, "GET", e.base+"/metrics", "", "").body)
	for _, want := range []string{
		`tollgate_envoy_calls_total{outcome="invalid",service="ratelimit"} 8`,
		`tollgate_envoy_calls_total{outcome="unauthorized",service="ratelimit"} 4`,
		`tollgate_envoy_calls_total{outcome="forbidden",service="ratelimit"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(m, `outcome="ok",service="ratelimit"`) {
		t.Errorf("/metrics counts an admitted call; none was")
	}
}

// TestEnvoyRateLimitIsAllOrNothing: a call of several descriptors refused
// by one of them refunds those it admitted before; one admitted whole
// names every request to the upstream.
func TestEnvoyRateLimitIsAllOrNothing(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	e := startEnvoyAPI(t, s)
	roomy := s.tier(45, quota.Limits{DailyQuota: quota.Ptr(int64(10))})
	tight := s.tier(46, quota.Limits{DailyQuota: quota.Ptr(int64(1))})
	a, keyA := s.tenant(roomy.Slug)
	b, keyB := s.tenant(tight.Slug)
	left := func(key string) float64 {
		t.Helper()
		r := do(t, "POST", e.base+"/v1/check", serviceToken, `{"api_key": "`+key+`", "meter": "demo", "dry_run": true}`).json(t)
		left := r["limits"].([]any)[0].(map[string]any)["remaining"].(float64)
		if r["allowed"] == true {
			left++ // an admitted dry run reports the room as if it counted
		}
		return left
	}

	both := e.limit(t, 2, desc("api_key", keyA, "meter", "demo"), desc("api_key", keyB, "meter", "demo"))
	if both.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		// B's quota is 1: a cost of 2 never fits.
		t.Fatalf("A and B at cost 2: %v, want OVER_LIMIT (B has room for 1)", both.GetOverallCode())
	}
	if c := both.GetStatuses(); c[0].GetCode() != rlsv3.RateLimitResponse_OK || c[1].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("statuses %v, want A OK then B OVER_LIMIT", c)
	}
	if got := left(keyA); got != 10 {
		t.Fatalf("after the refused call A has %v left, want 10: its admitted descriptor was not refunded", got)
	}

	ok := e.limit(t, 1, desc("api_key", keyA, "meter", "demo"), desc("api_key", keyB, "meter", "demo"))
	_, up := values(ok.GetRequestHeadersToAdd())
	ids := strings.Split(up["Tollgate-Request-Id"], ", ")
	if ok.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(ids) != 2 || !hex32.MatchString(ids[0]) || !hex32.MatchString(ids[1]) ||
		up["X-Tollgate-Tenant-Id"] != a.ID+", "+b.ID {
		t.Fatalf("A and B at cost 1: %v, upstream %v, want OK naming both requests and tenants", ok.GetOverallCode(), up)
	}
	if got, gotB := left(keyA), left(keyB); got != 9 || gotB != 0 {
		t.Fatalf("after the admitted call: A %v, B %v left, want 9 and 0", got, gotB)
	}
	// B is spent: A's descriptor, admitted first, is refunded again; and
	// an unknown key after A's refunds it as well.
	e.limit(t, 1, desc("api_key", keyA, "meter", "demo"), desc("api_key", keyB, "meter", "demo"))
	e.limit(t, 3, desc("api_key", keyA, "meter", "demo"), desc("api_key", "tg_nobody"))
	if got := left(keyA); got != 9 {
		t.Fatalf("after two refused calls A has %v left, want 9", got)
	}
}

// TestEnvoyExtAuthz: a check answers Tollgate's own status, headers and
// problem (401 without or with a wrong key, 429 past the quota as the
// metered route, 402 for a prepaid tenant without credit, 400 for a bad
// cost), and an admission gives the client the quota headers and the
// upstream the tenant and request ids, without the key.
func TestEnvoyExtAuthz(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	e := startEnvoyAPI(t, s)
	tier := s.tier(47, quota.Limits{DailyQuota: quota.Ptr(int64(3))})
	tenant, key := s.tenant(tier.Slug)
	_, twinKey := s.tenant(tier.Slug)
	ext := map[string]string{"meter": "demo", "cost": "2"}

	resp := e.check(t, "/api/demo/echo?q=1", map[string]string{"authorization": "Bearer " + key, "x-tollgate-tenant-id": "spoofed",
		"tollgate-request-id": "spoofed", "tollgate-debug": "1", "accept": "*/*"}, ext)
	twin := do(t, "POST", e.base+"/v1/check", serviceToken, `{"api_key": "`+twinKey+`", "meter": "demo", "cost": 2}`).json(t)
	ok := resp.GetOkResponse()
	if resp.GetStatus().GetCode() != int32(codes.OK) || ok == nil {
		t.Fatalf("a check with a good key: %v, want OK", resp)
	}
	_, toClient := optionValues(t, ok.GetResponseHeadersToAdd())
	hs := map[string]string{}
	for k, v := range twin["headers"].(map[string]any) {
		hs[k] = v.(string)
	}
	sameQuotaHeaders(t, "ext_authz OK", toClient, func(k string) string { return hs[k] })
	if len(toClient) != len(hs) || !strings.Contains(toClient["Ratelimit"], `"daily";r=1;`) {
		t.Fatalf("client headers %v, want /v1/check's %v with 1 left of the daily 3 after a cost of 2", toClient, hs)
	}
	_, upstream := optionValues(t, ok.GetHeaders())
	if upstream["X-Tollgate-Tenant-Id"] != tenant.ID || !hex32.MatchString(upstream["Tollgate-Request-Id"]) {
		t.Fatalf("upstream headers %v, want the tenant id and a request id in place of what the client sent", upstream)
	}
	removed := ok.GetHeadersToRemove()
	slices.Sort(removed)
	if !slices.Equal(removed, []string{"authorization", "tollgate-debug"}) {
		t.Fatalf("headers removed %v, want the key and the client's other Tollgate header", removed)
	}

	// The last unit by X-API-Key and the default cost of 1, then 429 as the
	// metered route answers its twin at the quota.
	if r := e.check(t, "/x", map[string]string{"x-api-key": key}, map[string]string{"meter": "demo"}); r.GetOkResponse() == nil ||
		!slices.Contains(r.GetOkResponse().GetHeadersToRemove(), "x-api-key") {
		t.Fatalf("a check by X-API-Key: %v, want OK removing the header", r)
	}
	do(t, "GET", e.base+"/api/demo/echo", twinKey, "")
	var denied *authv3.DeniedHttpResponse
	var metered reply
	for try := 0; ; try++ {
		r := e.check(t, "/api/demo/echo", map[string]string{"authorization": "Bearer " + key}, ext)
		metered = do(t, "GET", e.base+"/api/demo/echo", twinKey, "")
		denied = r.GetDeniedResponse()
		if denied == nil || r.GetStatus().GetCode() != int32(codes.PermissionDenied) || metered.status != 429 {
			t.Fatalf("past the quota: %v (metered %d), want denied 429", r, metered.status)
		}
		if denied.GetBody() == string(metered.body) || try == 4 {
			break
		}
	}
	if denied.GetStatus().GetCode() != 429 || denied.GetBody() != string(metered.body) {
		t.Fatalf("denied %d %s, want the metered route's 429 %s", denied.GetStatus().GetCode(), denied.GetBody(), metered.body)
	}
	_, dh := optionValues(t, denied.GetHeaders())
	sameQuotaHeaders(t, "ext_authz 429", dh, metered.header.Get)
	if dh["Retry-After"] == "" || dh["Content-Type"] != "application/problem+json" {
		t.Fatalf("denied headers %v, want Retry-After and problem+json", dh)
	}

	// 401, 400, 402.
	slug := "pp-" + testenv.RandomHex(3)
	if r := admin(t, "POST", e.base+"/admin/v1/tiers", prepaidTier(slug, 200_000+int(time.Now().UnixNano()%700_000))); r.status != 201 {
		t.Fatalf("prepaid tier: %d %s", r.status, r.body)
	}
	_, prepaidKey := s.tenant(slug)
	for _, tc := range []struct {
		name    string
		headers map[string]string
		ext     map[string]string
		status  int32
		code    codes.Code
		check   func(p map[string]any, h map[string]string) bool
	}{
		{"no key", map[string]string{"accept": "*/*"}, ext, 401, codes.Unauthenticated,
			func(p map[string]any, h map[string]string) bool {
				return h["Www-Authenticate"] == `Bearer realm="tollgate"`
			}},
		{"basic credentials", map[string]string{"authorization": "Basic dXNlcjpwYXNz"}, ext, 401, codes.Unauthenticated,
			func(p map[string]any, h map[string]string) bool { return h["Www-Authenticate"] != "" }},
		{"unknown key", map[string]string{"authorization": "Bearer tg_nobody"}, ext, 401, codes.Unauthenticated,
			func(p map[string]any, h map[string]string) bool {
				return h["Www-Authenticate"] == `Bearer realm="tollgate", error="invalid_token"`
			}},
		{"bad cost", map[string]string{"x-api-key": twinKey}, map[string]string{"cost": "1.5"}, 400, codes.PermissionDenied,
			func(p map[string]any, h map[string]string) bool { return p["field"] == "cost" }},
		{"zero cost", map[string]string{"x-api-key": twinKey}, map[string]string{"cost": "0"}, 400, codes.PermissionDenied,
			func(p map[string]any, h map[string]string) bool { return p["field"] == "cost" }},
		{"oversized context extension", map[string]string{"x-api-key": twinKey}, map[string]string{"meter": strings.Repeat("m", 2000)}, 400, codes.PermissionDenied,
			func(p map[string]any, h map[string]string) bool { return p["field"] == "context_extensions" }},
		{"bad meter", map[string]string{"x-api-key": twinKey}, map[string]string{"meter": "Ü"}, 400, codes.PermissionDenied,
			func(p map[string]any, h map[string]string) bool { return p["field"] == "meter" }},
		// 10 included units a month: a cost of 11 needs credit it has not.
		{"prepaid without credit", map[string]string{"x-api-key": prepaidKey}, map[string]string{"cost": "11", "meter": "demo"}, 402, codes.PermissionDenied,
			func(p map[string]any, h map[string]string) bool {
				return p["type"] == "https://tollgate.dev/problems/credit-exhausted" && p["top_up_url"] == topUpURL && h["Retry-After"] == ""
			}},
	} {
		r := e.check(t, "/api/demo/echo", tc.headers, tc.ext)
		d := r.GetDeniedResponse()
		var p map[string]any
		if d == nil || r.GetStatus().GetCode() != int32(tc.code) || int32(d.GetStatus().GetCode()) != tc.status ||
			json.Unmarshal([]byte(d.GetBody()), &p) != nil || p["status"] != float64(tc.status) || p["instance"] != "/api/demo/echo" {
			t.Errorf("%s: %v, want denied %d (%v) with its problem", tc.name, r, tc.status, tc.code)
			continue
		}
		_, h := optionValues(t, d.GetHeaders())
		if h["Content-Type"] != "application/problem+json" || !tc.check(p, h) {
			t.Errorf("%s: headers %v, problem %v", tc.name, h, p)
		}
	}
	// A path past 2048 characters is a 400 (without an instance), and
	// headers sent raw (Envoy's encode_raw_headers) are read as well.
	long := e.check(t, "/"+strings.Repeat("p", 3000), map[string]string{"x-api-key": twinKey}, ext)
	if d := long.GetDeniedResponse(); d == nil || d.GetStatus().GetCode() != 400 || !strings.Contains(d.GetBody(), `"field":"path"`) {
		t.Errorf("a 3000-character path: %v, want denied 400 naming the path", long)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := e.authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/api/demo/echo",
			HeaderMap: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "x-api-key", RawValue: []byte("tg_nobody")}}}}}}})
	if d := raw.GetDeniedResponse(); err != nil || d == nil || !strings.Contains(d.GetBody(), "API key") ||
		strings.Contains(d.GetBody(), "required") {
		t.Errorf("a raw x-api-key header: %v %v, want the unknown key's 401 (the key was read)", raw, err)
	}
	// The twin's refusals and bad checks counted nothing: it is at its quota
	// only through the metered calls above.
	r := do(t, "POST", e.base+"/v1/check", serviceToken, `{"api_key": "`+twinKey+`", "meter": "demo", "dry_run": true}`).json(t)
	if r["allowed"] != false {
		t.Fatalf("the twin after its refusals: %v, want refused (at its quota, no more)", r)
	}
}

// TestEnvoyServicesDuringAnOutage: with Redis away, a fail-closed tier is
// refused with a 503 problem and Retry-After (an answer, whatever Envoy's
// failure mode says), a fail-open tier admitted degraded.
func TestEnvoyServicesDuringAnOutage(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	proc := testenv.StartRedis(t)
	s.redis = proc.URL
	e := startEnvoyAPI(t, s)
	closed := s.tier(48, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	open := s.tier(49, quota.Limits{BurstRate: quota.Ptr(0.001), Burst: quota.Ptr(int64(3)), DailyQuota: quota.Ptr(int64(100))},
		func(t *quota.Tier) { t.FailOpen = true })
	_, closedKey := s.tenant(closed.Slug)
	_, openKey := s.tenant(open.Slug)
	for _, k := range []string{closedKey, openKey} { // (the keys resolved before the outage)
		if r := e.limit(t, 0, desc("api_key", k)); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("before the outage: %v", r.GetOverallCode())
		}
	}
	proc.Stop()

	r := e.limit(t, 0, desc("api_key", closedKey, "path", "/v2/things"))
	_, h := values(r.GetResponseHeadersToAdd())
	var p map[string]any
	if r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || json.Unmarshal(r.GetRawBody(), &p) != nil || p["status"] != 503.0 ||
		p["instance"] != "/v2/things" || h["Retry-After"] != "1" || h["Content-Type"] != "application/problem+json" {
		t.Fatalf("fail-closed during the outage: %v %s %v, want OVER_LIMIT with a 503 problem and Retry-After 1", r.GetOverallCode(), r.GetRawBody(), h)
	}
	c := e.check(t, "/v2/things", map[string]string{"x-api-key": closedKey}, nil)
	if d := c.GetDeniedResponse(); d == nil || d.GetStatus().GetCode() != 503 || c.GetStatus().GetCode() != int32(codes.Unavailable) {
		t.Fatalf("ext_authz fail-closed during the outage: %v, want denied 503", c)
	}

	r = e.limit(t, 0, desc("api_key", openKey))
	_, h = values(r.GetResponseHeadersToAdd())
	if r.GetOverallCode() != rlsv3.RateLimitResponse_OK || h["Tollgate-Degraded"] != "fail-open" {
		t.Fatalf("fail-open during the outage: %v %v, want OK marked Tollgate-Degraded: fail-open", r.GetOverallCode(), h)
	}
}

// TestEnvoyHealth: the gRPC health service answers SERVING for the server
// and each Envoy service while the api serves, and tells a watcher
// NOT_SERVING when the api shuts down.
func TestEnvoyHealth(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	e := startEnvoyAPI(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService", "envoy.service.auth.v3.Authorization"} {
		r, err := e.health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q: %v %v, want SERVING", svc, r, err)
		}
	}
	if _, err := e.health.Check(ctx, &healthpb.HealthCheckRequest{Service: "no.such.Service"}); status.Code(err) != codes.NotFound {
		t.Fatalf("health of an unknown service: %v, want NotFound", err)
	}
	w, err := e.health.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v, want SERVING first", r, err)
	}
	go e.stop()
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch during shutdown: %v %v, want NOT_SERVING", r, err)
	}
}

// TestRunFailsWhenTheGRPCPortIsTaken: a gRPC address the api cannot
// listen on stops it at start, naming the variable.
func TestRunFailsWhenTheGRPCPortIsTaken(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	s := mustStack(t)
	env := s.env(map[string]string{"TOLLGATE_ADDR": "127.0.0.1:0", "TOLLGATE_GRPC_ADDR": taken.Addr().String()})
	err = app.RunAPI(t.Context(), func(k string) string { return env[k] }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "TOLLGATE_GRPC_ADDR") {
		t.Fatalf("run with the gRPC port taken = %v, want an error naming TOLLGATE_GRPC_ADDR", err)
	}
}

// BenchmarkEnvoyCalls measures one admitted call of each Envoy service
// through the api running in this process, from one grpc-go client over
// loopback, on a tier whose limits the calls never reach: every iteration
// decides, counts and reserves in Redis, as the metered route does
// (BenchmarkMeteredRequest) plus the reservation.
//
//	go test -run '^$' -bench BenchmarkEnvoyCalls -benchtime 3s ./internal/e2e/api
func BenchmarkEnvoyCalls(b *testing.B) {
	s := mustStack(b)
	big := quota.Ptr(quota.MaxQuantity)
	tier := s.tier(999_998, quota.Limits{BurstRate: quota.Ptr(float64(quota.MaxRate)), Burst: quota.Ptr(int64(1 << 30)),
		BucketCapacity: quota.Ptr(int64(1 << 30)), BucketRefillPerSec: quota.Ptr(float64(quota.MaxRate)),
		DailyQuota: big, MonthlyQuota: big})
	_, key := s.tenant(tier.Slug)
	e := startEnvoyAPI(b, s)
	ctx := context.Background()
	b.Run("ratelimit", func(b *testing.B) {
		req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", key, "meter", "demo")}}
		b.ReportAllocs()
		for b.Loop() {
			resp, err := e.rls.ShouldRateLimit(ctx, req)
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				b.Fatalf("ShouldRateLimit: %v %v, want OK", resp.GetOverallCode(), err)
			}
		}
	})
	b.Run("ext_authz", func(b *testing.B) {
		req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Method: "GET", Path: "/api/demo/echo", Headers: map[string]string{"x-api-key": key}}},
			ContextExtensions: map[string]string{"meter": "demo"}}}
		b.ReportAllocs()
		for b.Loop() {
			resp, err := e.authz.Check(ctx, req)
			if err != nil || resp.GetOkResponse() == nil {
				b.Fatalf("Check: %v %v, want OK", resp, err)
			}
		}
	})
}

// TestEnvoyCannotDecideIsAGRPCError: with Postgres away, a key the api has
// not seen cannot be looked up: both services answer UNAVAILABLE (where
// Envoy's failure mode applies), never OK, and count it as an error.
func TestEnvoyCannotDecideIsAGRPCError(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	e := startEnvoyAPI(t, s)
	tier := s.tier(50, quota.Limits{DailyQuota: quota.Ptr(int64(5))})
	_, key := s.tenant(tier.Slug)
	var db string
	if err := s.pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	// From the server's maintenance database: no one connects to the
	// test's database any more, and the open connections are cut.
	u, err := url.Parse(s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/postgres"
	admin, err := pgdb.Open(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(context.Background(), `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS true`) })
	if _, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, db); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = e.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", key)}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("ShouldRateLimit with Postgres away: %v, want UNAVAILABLE", err)
	}
	_, err = e.authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Path: "/", Headers: map[string]string{"x-api-key": key}}}}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Check with Postgres away: %v, want UNAVAILABLE", err)
	}
	m := string(do(t, "GET", e.base+"/metrics", "", "").body)
	for _, want := range []string{`tollgate_envoy_calls_total{outcome="error",service="ratelimit"} 1`, `tollgate_envoy_calls_total{outcome="error",service="ext_authz"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
