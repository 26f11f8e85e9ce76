package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// HTTP-level tests of the dashboard's and console's sessions, CSRF
// protection and form handling: what a browser test cannot do (forge
// requests, read the session store, replay cookies).

// webClient is a browser-like client: a cookie jar, no redirect following,
// and a form POST that says where it comes from as browsers do.
type webClient struct {
	tb   testing.TB
	base string
	c    *http.Client
}

func newWebClient(tb testing.TB, base string) *webClient {
	tb.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		tb.Fatal(err)
	}
	return &webClient{tb: tb, base: base, c: &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (w *webClient) do(req *http.Request, headers ...string) reply {
	w.tb.Helper()
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := w.c.Do(req)
	if err != nil {
		w.tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

func (w *webClient) get(path string, headers ...string) reply {
	w.tb.Helper()
	req, err := http.NewRequest("GET", w.base+path, nil)
	if err != nil {
		w.tb.Fatal(err)
	}
	return w.do(req, headers...)
}

// post sends a urlencoded form with Origin set to the server, as a browser
// submitting one of the pages' forms does; headers override.
func (w *webClient) post(path, body string, headers ...string) reply {
	w.tb.Helper()
	req, err := http.NewRequest("POST", w.base+path, strings.NewReader(body))
	if err != nil {
		w.tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", w.base)
	return w.do(req, headers...)
}

var csrfInput = regexp.MustCompile(`name="_csrf" value="([^"]+)"`)

// csrf returns the CSRF token of the forms on the page at path.
func (w *webClient) csrf(path string) string {
	w.tb.Helper()
	r := w.get(path)
	m := csrfInput.FindSubmatch(r.body)
	if r.status != 200 || m == nil {
		w.tb.Fatalf("GET %s: %d, no CSRF token in the page", path, r.status)
	}
	return string(m[1])
}

// signIn signs in to area with secret through the sign-in form and returns
// the answer to the form's POST.
func (w *webClient) signIn(area, secret string) reply {
	w.tb.Helper()
	field := "api_key"
	if area == "console" {
		field = "token"
	}
	tok := w.csrf("/" + area + "/login")
	return w.post("/"+area+"/login", url.Values{"_csrf": {tok}, field: {secret}}.Encode())
}

func (w *webClient) mustSignIn(area, secret string) {
	w.tb.Helper()
	if r := w.signIn(area, secret); r.status != 303 || r.header.Get("Location") != "/"+area {
		w.tb.Fatalf("sign-in to %s: %d to %q, want 303 to /%s: %s", area, r.status, r.header.Get("Location"), area, r.body)
	}
}

func auditCount(tb testing.TB, s *stack) int {
	tb.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log`).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

func isHTML(r reply) bool { return strings.HasPrefix(r.header.Get("Content-Type"), "text/html") }

// pagePosts lists every state-changing page route, from the served OpenAPI
// document, so that a new form cannot escape these tests.
func pagePosts(tb testing.TB, base string) []string {
	tb.Helper()
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(do(tb, "GET", base+"/openapi.json", "", "").body, &doc); err != nil {
		tb.Fatal(err)
	}
	var out []string
	for p, item := range doc.Paths {
		if _, ok := item["post"]; ok && (strings.HasPrefix(p, "/dashboard") || strings.HasPrefix(p, "/console")) {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	if len(out) < 10 {
		tb.Fatalf("only %d page POST routes in the OpenAPI document: %v", len(out), out)
	}
	return out
}

// TestPagePostsRefuseForgedRequests: every state-changing page route refuses
// a request without the session's CSRF token, with a wrong one, from another
// origin or site, and a body that is not a form, and changes nothing.
func TestPagePostsRefuseForgedRequests(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(100, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	tenant, key := s.tenant(tier.Slug)
	keys, _, err := s.store.ListKeys(context.Background(), tenant.ID, postgresPage())
	if err != nil || len(keys) != 1 {
		t.Fatal(keys, err)
	}
	base := s.start()
	adminC := newWebClient(t, base)
	adminC.mustSignIn("console", adminToken)
	tenantC := newWebClient(t, base)
	tenantC.mustSignIn("dashboard", key)
	adminTok := adminC.csrf("/console/tenants")
	tenantTok := tenantC.csrf("/dashboard")

	// A valid body for each route, so that only the forgery is wrong.
	ids := strings.NewReplacer("{id}", tenant.ID, "{slug}", tier.Slug, "{name}", "forged-policy")
	bodies := map[string]url.Values{
		"/console/tiers":                    {"slug": {"forged"}, "name": {"F"}, "rank": {"999"}, "price_cents": {"0"}, "overage": {"block"}},
		"/console/tiers/{slug}":             {"name": {"Forged"}, "rank": {"100"}, "price_cents": {"1"}, "overage": {"block"}},
		"/console/tenants":                  {"name": {"Forged"}, "tier": {"free"}},
		"/console/tenants/{id}/keys":        {"name": {"forged"}},
		"/console/tenants/{id}/grants":      {"period": {"day"}, "units": {"5"}},
		"/console/tenants/{id}/tier":        {"tier": {"pro"}},
		"/console/tenants/{id}/plan/cancel": {},
		"/console/tenants/{id}/calendar":    {"billing_anchor_day": {"15"}, "time_zone": {"Europe/Paris"}},
		"/console/tenants/{id}/credits":     {"amount": {"10"}, "reason": {"forged"}},
		"/console/tenants/{id}/spend-cap":   {"spend_cap": {"none"}},
		"/console/tenants/{id}/status":      {"status": {"suspended"}},
		"/console/keys/{id}/revoke":         {},
		"/console/logout":                   {},
		"/dashboard/logout":                 {},
		"/console/login":                    {"token": {adminToken}},
		"/dashboard/login":                  {"api_key": {key}},
	}
	// The policies' forms; console_policies_test.go tries them on a policy that exists.
	bodies["/console/policies"] = url.Values{"name": {"forged"}, "algorithm": {"gcra"}, "rate": {"1"}, "burst": {"1"}}
	bodies["/console/policies/{name}"] = url.Values{"algorithm": {"gcra"}, "rate": {"1"}, "burst": {"1"}}
	bodies["/console/policies/{name}/delete"] = url.Values{}
	before := auditCount(t, s)
	for _, route := range pagePosts(t, base) {
		form, ok := bodies[route]
		if !ok {
			t.Errorf("POST %s: no test body; add one", route)
			continue
		}
		path := ids.Replace(route)
		if strings.HasPrefix(route, "/console/keys/") {
			path = strings.Replace(route, "{id}", keys[0].ID, 1)
		}
		c, tok := adminC, adminTok
		if strings.HasPrefix(route, "/dashboard") {
			c, tok = tenantC, tenantTok
		}
		withTok := func(v string) string {
			f := url.Values{}
			for k, vs := range form {
				f[k] = vs
			}
			if v != "" {
				f.Set("_csrf", v)
			}
			return f.Encode()
		}
		for _, tc := range []struct {
			name    string
			body    string
			headers []string
			want    int
		}{
			{"no token", withTok(""), nil, 403},
			{"wrong token", withTok(strings.Repeat("A", 43)), nil, 403},
			{"other origin", withTok(tok), []string{"Origin", "https://evil.example"}, 403},
			{"cross-site", withTok(tok), []string{"Sec-Fetch-Site", "cross-site"}, 403},
			{"JSON body", `{"_csrf":"` + tok + `"}`, []string{"Content-Type", "application/json"}, 415},
		} {
			r := c.post(path, tc.body, tc.headers...)
			if r.status != tc.want || !isHTML(r) {
				t.Errorf("POST %s, %s: %d %s, want %d HTML", route, tc.name, r.status, r.header.Get("Content-Type"), tc.want)
			}
			if r.header.Get("Set-Cookie") != "" && strings.Contains(r.header.Get("Set-Cookie"), "tg_dashboard=") ||
				strings.Contains(r.header.Get("Set-Cookie"), "tg_console=") {
				t.Errorf("POST %s, %s set a session cookie: %s", route, tc.name, r.header.Get("Set-Cookie"))
			}
		}
	}
	if after := auditCount(t, s); after != before {
		t.Errorf("forged requests changed %d things (audit log)", after-before)
	}
	got, err := s.store.Tenant(context.Background(), tenant.ID)
	if err != nil || got.Status != quota.StatusActive || got.Tier != tier.Slug {
		t.Errorf("tenant after forged requests: %+v %v", got, err)
	}
	// The sessions survived all of it.
	if r := adminC.get("/console/tenants"); r.status != 200 {
		t.Errorf("admin session after forged requests: %d", r.status)
	}
	if r := tenantC.get("/dashboard"); r.status != 200 {
		t.Errorf("tenant session after forged requests: %d", r.status)
	}
}

// TestSessionCookieAndStore: the cookie is HttpOnly, SameSite=Lax, scoped to
// its area and Secure behind HTTPS; Redis keeps the session under a hash of
// the cookie with the configured lifetime, and never the key.
func TestSessionCookieAndStore(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	_, key := s.tenant("free")
	base := s.start()
	c := newWebClient(t, base)
	r := c.signIn("dashboard", key)
	if r.status != 303 {
		t.Fatalf("sign-in: %d", r.status)
	}
	var session *http.Cookie
	for _, ck := range (&http.Response{Header: r.header}).Cookies() {
		if ck.Name == "tg_dashboard" {
			session = ck
		}
	}
	if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteLaxMode || session.Path != "/dashboard" ||
		session.Secure || session.MaxAge != int((8*time.Hour).Seconds()) || strings.Contains(session.Value, key) {
		t.Fatalf("session cookie %+v, want HttpOnly, SameSite=Lax, Path=/dashboard, 8h, not Secure over http", session)
	}
	rdb := testenv.Redis(t)
	sum := sha256.Sum256([]byte(session.Value))
	k := s.prefix + ":v1:session:" + hex.EncodeToString(sum[:])
	val, err := rdb.Get(context.Background(), k).Result()
	if err != nil {
		t.Fatalf("session %s not in Redis: %v", k, err)
	}
	if strings.Contains(val, key) || strings.Contains(val, key[len(key)-20:]) {
		t.Errorf("the session store holds the key: %s", val)
	}
	ttl := rdb.TTL(context.Background(), k).Val()
	if ttl > 8*time.Hour || ttl < 8*time.Hour-time.Minute {
		t.Errorf("session TTL %s, want 8h", ttl)
	}
	if n := rdb.Exists(context.Background(), s.prefix+":v1:session:"+session.Value).Val(); n != 0 {
		t.Error("a session is stored under the cookie's value itself")
	}

	// Behind a trusted TLS-terminating proxy the cookie is Secure (from
	// any other peer X-Forwarded-Proto does not count:
	// TestForwardedHostAndProtoOnlyFromTrustedProxies).
	tls := newWebClient(t, s.startWith(map[string]string{"TOLLGATE_TRUSTED_PROXIES": "127.0.0.1, ::1"}))
	tok := tls.csrf("/dashboard/login")
	r = tls.post("/dashboard/login", url.Values{"_csrf": {tok}, "api_key": {key}}.Encode(), "X-Forwarded-Proto", "https")
	if r.status != 303 || !strings.Contains(r.header.Get("Set-Cookie"), "secure") {
		t.Errorf("sign-in over https: %d, Set-Cookie %q, want a Secure cookie", r.status, r.header.Get("Set-Cookie"))
	}
}

// TestSessionsEnd: signing out, revoking the key, suspending the tenant and
// changing the admin token each end the sessions they concern.
func TestSessionsEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustStack(t)
	tenant, key := s.tenant("free")
	base := s.start()

	// Sign-out: the old cookie, replayed, no longer opens the dashboard.
	c := newWebClient(t, base)
	c.mustSignIn("dashboard", key)
	stolen := c.c.Jar.Cookies(mustURL(t, base+"/dashboard"))
	tok := c.csrf("/dashboard")
	if r := c.post("/dashboard/logout", "_csrf="+tok); r.status != 303 || r.header.Get("Location") != "/dashboard/login?m=signedout" {
		t.Fatalf("sign-out: %d to %q", r.status, r.header.Get("Location"))
	}
	replay := newWebClient(t, base)
	replay.c.Jar.SetCookies(mustURL(t, base+"/dashboard"), stolen)
	if r := replay.get("/dashboard"); r.status != 303 || !strings.HasPrefix(r.header.Get("Location"), "/dashboard/login") {
		t.Errorf("signed-out cookie replayed: %d to %q, want the sign-in page", r.status, r.header.Get("Location"))
	}

	// Revoking the key the session was opened with ends it.
	c = newWebClient(t, base)
	c.mustSignIn("dashboard", key)
	keys, _, _ := s.store.ListKeys(ctx, tenant.ID, postgresPage())
	if r := do(t, "DELETE", base+"/admin/v1/keys/"+keys[0].ID, adminToken, ""); r.status != 204 {
		t.Fatalf("revoke: %d", r.status)
	}
	if r := c.get("/dashboard"); r.status != 303 || !strings.HasPrefix(r.header.Get("Location"), "/dashboard/login?m=key") {
		t.Errorf("after revocation: %d to %q, want the sign-in page saying why", r.status, r.header.Get("Location"))
	}

	// Suspending the tenant refuses its pages.
	k2, err := s.store.IssueKey(ctx, "test", tenant.ID, "second")
	if err != nil {
		t.Fatal(err)
	}
	c = newWebClient(t, base)
	c.mustSignIn("dashboard", k2.Secret)
	if r := do(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, adminToken, `{"status":"suspended"}`); r.status != 200 {
		t.Fatalf("suspend: %d", r.status)
	}
	if r := c.get("/dashboard"); r.status != 403 || !isHTML(r) || !strings.Contains(string(r.body), "suspended") {
		t.Errorf("suspended tenant's dashboard: %d, want a 403 page saying so", r.status)
	}
	if r := newWebClient(t, base).signIn("dashboard", k2.Secret); r.status != 403 {
		t.Errorf("suspended tenant's sign-in: %d, want 403", r.status)
	}

	// A new admin token ends the sessions opened with the old one, on every node.
	a := newWebClient(t, base)
	a.mustSignIn("console", adminToken)
	other := startAPI(t, map[string]string{
		"REDIS_URL": s.redis, "DATABASE_URL": s.dbURL, "TOLLGATE_REDIS_PREFIX": s.prefix,
		"TOLLGATE_ADMIN_TOKEN": "a-completely-new-admin-token", "TOLLGATE_SHUTDOWN_TIMEOUT": "2s",
	})
	moved := newWebClient(t, other)
	moved.c.Jar.SetCookies(mustURL(t, other+"/console"), a.c.Jar.Cookies(mustURL(t, base+"/console")))
	if r := moved.get("/console/tenants"); r.status != 303 || !strings.HasPrefix(r.header.Get("Location"), "/console/login?m=token") {
		t.Errorf("old admin session on a node with a new token: %d to %q", r.status, r.header.Get("Location"))
	}
	if r := a.get("/console/tenants"); r.status != 303 {
		t.Errorf("the session ended by the new token still opens the old node: %d", r.status)
	}
}

func mustURL(tb testing.TB, raw string) *url.URL {
	tb.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}

// TestSignInForms: the sign-in forms need their own token and origin, never
// redirect off the site, and limit failed attempts per address.
func TestSignInForms(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	_, key := s.tenant("free")
	base := s.start()

	// Sign-in forms open in two tabs both work.
	tabs := newWebClient(t, base)
	first := tabs.csrf("/dashboard/login")
	if second := tabs.csrf("/dashboard/login"); second != first {
		t.Errorf("a second sign-in page changed the form token")
	}
	if r := tabs.post("/dashboard/login", url.Values{"_csrf": {first}, "api_key": {key}}.Encode()); r.status != 303 {
		t.Errorf("the first tab's sign-in after the second opened: %d, want 303", r.status)
	}

	c := newWebClient(t, base)
	tok := c.csrf("/dashboard/login")
	for _, tc := range []struct {
		name    string
		c       *webClient
		body    string
		headers []string
	}{
		{"no cookie", newWebClient(t, base), url.Values{"_csrf": {tok}, "api_key": {key}}.Encode(), nil},
		{"token differs from cookie", c, url.Values{"_csrf": {strings.Repeat("B", 43)}, "api_key": {key}}.Encode(), nil},
		{"other origin", c, url.Values{"_csrf": {tok}, "api_key": {key}}.Encode(), []string{"Origin", "https://evil.example"}},
	} {
		if r := tc.c.post("/dashboard/login", tc.body, tc.headers...); r.status != 403 || strings.Contains(r.header.Get("Set-Cookie"), "tg_dashboard=") {
			t.Errorf("%s: %d (Set-Cookie %q), want 403 and no session", tc.name, r.status, r.header.Get("Set-Cookie"))
		}
	}

	for next, want := range map[string]string{
		"/dashboard/invoices/x":    "/dashboard/invoices/x",
		"//evil.example/dashboard": "/dashboard",
		"https://evil.example/":    "/dashboard",
		"/console/tenants":         "/dashboard",
		`/\evil.example`:           "/dashboard",
		"/dashboard/../console":    "/dashboard",
	} {
		c := newWebClient(t, base)
		tok := c.csrf("/dashboard/login")
		r := c.post("/dashboard/login", url.Values{"_csrf": {tok}, "api_key": {key}, "next": {next}}.Encode())
		if r.status != 303 || r.header.Get("Location") != want {
			t.Errorf("next=%q: %d to %q, want %q", next, r.status, r.header.Get("Location"), want)
		}
	}

	// Failed sign-ins are limited per address like failed API keys.
	limited := newWebClient(t, base)
	var last reply
	for i := range 25 {
		tok := limited.csrf("/console/login")
		last = limited.post("/console/login", url.Values{"_csrf": {tok}, "token": {"wrong-token-" + string(rune('a'+i))}}.Encode())
		if last.status == 429 {
			break
		}
		if last.status != 401 {
			t.Fatalf("wrong admin token %d: %d, want 401", i, last.status)
		}
	}
	if last.status != 429 || last.header.Get("Retry-After") == "" {
		t.Errorf("after many wrong tokens: %d (Retry-After %q), want 429 with Retry-After", last.status, last.header.Get("Retry-After"))
	}
	tok = limited.csrf("/console/login")
	if r := limited.post("/console/login", url.Values{"_csrf": {tok}, "token": {adminToken}}.Encode()); r.status != 429 {
		t.Errorf("the right token while limited: %d, want 429 (the limit comes first)", r.status)
	}
}

// TestPageFormsRefuseBadInput: malformed forms are 4xx pages, never 500,
// and change nothing.
func TestPageFormsRefuseBadInput(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(100, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	tenant, key := s.tenant(tier.Slug)
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	tok := c.csrf("/console/tenants")
	tierForm := "name=T&rank=100&price_cents=0&overage=block"
	before := auditCount(t, s)
	for _, tc := range []struct {
		path, body string
		want       int
	}{
		{"/console/tiers/" + tier.Slug, tierForm + "&color=red", 400},
		{"/console/tiers/" + tier.Slug, tierForm + "&name=Twice", 400},
		{"/console/tiers/" + tier.Slug, "name=T%00X&rank=100&price_cents=0&overage=block", 400},
		{"/console/tiers/" + tier.Slug, "name=%FF%FE&rank=100&price_cents=0&overage=block", 400},
		// Larger than this stack's 2 KiB body limit.
		{"/console/tiers/" + tier.Slug, "name=" + strings.Repeat("x", 5000) + "&rank=100&price_cents=0&overage=block", 413},
		{"/console/tiers/" + tier.Slug, "name=T&rank=99999999999999999999&price_cents=0&overage=block", 400},
		{"/console/tiers/" + tier.Slug, "name=T&rank=100&price_cents=-1&overage=block", 400},
		{"/console/tiers/" + tier.Slug, "name=T&rank=100&price_cents=0&overage=sometimes", 400},
		{"/console/tiers/" + tier.Slug, "name=T&rank=100&price_cents=0&overage=block&burst_rate=NaN&burst=5", 400},
		{"/console/tiers/" + tier.Slug, "name=T&rank=100&price_cents=0&overage=block&burst_rate=1e400&burst=5", 400},
		{"/console/tiers/" + tier.Slug, "name=T&rank=100&price_cents=0&overage=block&daily_quota=1.5", 400},
		{"/console/tiers/" + tier.Slug, "name=T&rank=100&price_cents=0&overage=block&daily_quota=1,2", 400},
		{"/console/tiers/" + tier.Slug, "name=T&rank=100&price_cents=0&overage=block&fail_open=maybe", 400},
		{"/console/tiers/" + tier.Slug, "name=T&rank=100&price_cents=0&overage=block&upgrade_url=javascript:alert(1)", 400},
		{"/console/tiers/no-such-tier", tierForm, 404},
		{"/console/tiers", tierForm + "&slug=Not%20A%20Slug", 400},
		{"/console/tiers", tierForm + "&slug=" + tier.Slug, 409},
		{"/console/tenants", "name=&tier=free", 400},
		{"/console/tenants", "name=X&tier=no-such-tier", 400},
		{"/console/tenants/" + tenant.ID + "/grants", "period=week&units=5", 400},
		{"/console/tenants/" + tenant.ID + "/grants", "period=day&units=-5", 400},
		{"/console/tenants/" + tenant.ID + "/grants", "period=day&units=9999999999999999999999", 400},
		{"/console/tenants/" + tenant.ID + "/grants", "period=day&units=ten", 400},
		{"/console/tenants/" + tenant.ID + "/tier", "tier=no-such-tier", 400},
		{"/console/tenants/" + tenant.ID + "/status", "status=paused", 400},
		{"/console/tenants/" + tenant.ID + "/keys", "name=" + strings.Repeat("k", 300), 400},
		{"/console/tenants/not-a-uuid/tier", "tier=pro", 404},
		{"/console/tenants/00000000-0000-0000-0000-000000000000/keys", "name=x", 404},
		{"/console/keys/not-a-key/revoke", "", 404},
	} {
		body := "_csrf=" + tok
		if tc.body != "" {
			body += "&" + tc.body
		}
		r := c.post(tc.path, body)
		if r.status != tc.want || !isHTML(r) {
			t.Errorf("POST %s %.60q: %d %s, want %d HTML", tc.path, tc.body, r.status, r.header.Get("Content-Type"), tc.want)
		}
	}
	for _, path := range []string{
		"/console/tenants?cursor=garbage", "/console/tenants?q=" + strings.Repeat("q", 300), "/console/invoices?period=2026-13",
		"/console/invoices?after=nope", "/console/alerts?status=lost", "/console/alerts?cursor=%00", "/console/tiers?cursor=zzz",
		"/console/tenants/not-a-uuid",
	} {
		if r := c.get(path); r.status < 400 || r.status > 499 || !isHTML(r) {
			t.Errorf("GET %s: %d, want a 4xx page", path, r.status)
		}
	}
	if r := c.post("/console/tenants/"+tenant.ID+"/tier", "_csrf="+tok+"&tier=annulled"); !strings.Contains(string(r.body), `no tier &#34;annulled&#34;`) {
		t.Errorf("the error does not name the tier as typed: %s", r.body)
	}
	tc := newWebClient(t, base)
	tc.mustSignIn("dashboard", key)
	for _, path := range []string{"/dashboard/invoices/not-a-uuid", "/dashboard/invoices/00000000-0000-0000-0000-000000000000", "/dashboard?x=%01"} {
		if r := tc.get(path); r.status < 400 || r.status > 499 || !isHTML(r) {
			t.Errorf("GET %s: %d, want a 4xx page", path, r.status)
		}
	}
	if after := auditCount(t, s); after != before {
		t.Errorf("bad input changed %d things (audit log)", after-before)
	}
	if got := s.adminTier(tier.Slug); got.Name != tier.Name || *got.DailyQuota != 1000 {
		t.Errorf("tier after bad input: %+v", got)
	}
	// Thousands separators are fine.
	if r := c.post("/console/tenants/"+tenant.ID+"/grants", "_csrf="+tok+"&period=day&units=1,500"); r.status != 303 {
		t.Errorf("a grant of 1,500 units: %d, want 303", r.status)
	}
	if got := do(t, "GET", base+"/admin/v1/tenants/"+tenant.ID+"/grants", adminToken, ""); !strings.Contains(string(got.body), `"units":1500`) {
		t.Errorf("grants after 1,500: %s", got.body)
	}
}

// TestConsoleTierNamedNew: any slug can be edited; the new-tier form lives
// outside /console/tiers/.
func TestConsoleTierNamedNew(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	if _, err := s.store.CreateTier(context.Background(), "test", quota.Tier{Slug: "new", Name: "Newish", Rank: 500, Overage: quota.OverageBlock}); err != nil {
		t.Fatal(err)
	}
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	if r := c.get("/console/tiers/new"); r.status != 200 || !strings.Contains(string(r.body), `action="/console/tiers/new"`) {
		t.Errorf("GET /console/tiers/new: %d, want the editor of the tier new", r.status)
	}
	if r := c.get("/console/new-tier"); r.status != 200 || !strings.Contains(string(r.body), `name="slug"`) {
		t.Errorf("GET /console/new-tier: %d, want the creation form", r.status)
	}
}

// TestDashboardSaysWhenOverageIsBilled: past the monthly quota of a tier that
// bills overage, the quota's card says the units go on and are billed.
func TestDashboardSaysWhenOverageIsBilled(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(100, quota.Limits{MonthlyQuota: quota.Ptr(int64(5))}, func(t *quota.Tier) {
		t.Overage, t.OveragePriceCentsPer1K = quota.OverageBill, 100
	})
	_, key := s.tenant(tier.Slug)
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("dashboard", key)
	if r := c.get("/dashboard"); strings.Contains(string(r.body), "overage-notice") {
		t.Error("the overage notice shows before the quota is reached")
	}
	for range 7 {
		mustStatus(t, do(t, "GET", base+"/api/demo/echo", key, ""), 200)
	}
	r := c.get("/dashboard")
	if !strings.Contains(string(r.body), `id="overage-notice"`) || !strings.Contains(string(r.body), `<strong id="month-units">7</strong>`) {
		t.Errorf("past the quota: no overage notice or month total 7 in the page:\n%s", r.body)
	}
}

// TestPagesHeadersAndAssets: pages forbid caching, framing and foreign
// resources; the embedded assets are served with validators.
func TestPagesHeadersAndAssets(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	c := newWebClient(t, base)
	for _, path := range []string{"/dashboard/login", "/console/login", "/dashboard/no-such-page"} {
		r := c.get(path)
		if !isHTML(r) {
			t.Errorf("GET %s: Content-Type %q, want HTML", path, r.header.Get("Content-Type"))
		}
		for h, want := range map[string]string{
			"Cache-Control": "no-store", "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
			"Content-Security-Policy": "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
		} {
			if got := r.header.Get(h); got != want {
				t.Errorf("GET %s: %s = %q, want %q", path, h, got, want)
			}
		}
		if strings.Contains(string(r.body), "http://") || strings.Contains(string(r.body), "https://") {
			t.Errorf("GET %s: the page refers to another origin", path)
		}
	}
	if r := c.get("/dashboard/no-such-page"); r.status != 404 {
		t.Errorf("unknown page: %d, want 404", r.status)
	}
	if r := c.get("/"); r.status != 302 || r.header.Get("Location") != "/dashboard" {
		t.Errorf("GET /: %d to %q, want 302 to /dashboard", r.status, r.header.Get("Location"))
	}
	for _, a := range []struct{ path, ctype string }{{"/assets/app.css", "text/css"}, {"/assets/app.js", "javascript"}, {"/robots.txt", "text/plain"}} {
		r := c.get(a.path)
		etag := r.header.Get("ETag")
		if r.status != 200 || !strings.Contains(r.header.Get("Content-Type"), a.ctype) || etag == "" || len(r.body) == 0 {
			t.Errorf("GET %s: %d %q ETag %q", a.path, r.status, r.header.Get("Content-Type"), etag)
			continue
		}
		if r := c.get(a.path, "If-None-Match", etag); r.status != 304 {
			t.Errorf("GET %s with its ETag: %d, want 304", a.path, r.status)
		}
	}
	if r := c.get("/assets/nope.css"); r.status != 404 {
		t.Errorf("unknown asset: %d", r.status)
	}
}

func postgresPage() quota.Page { return quota.Page{Limit: 50} }

// TestPagesDuringARedisOutage: with Redis down the pages answer 503 pages
// (an outage to wait out, not an internal error) and recover with it.
func TestPagesDuringARedisOutage(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	proc := testenv.StartRedis(t)
	s.redis = proc.URL
	_, key := s.tenant("free")
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("dashboard", key)
	admin := newWebClient(t, base)
	admin.mustSignIn("console", adminToken)

	proc.Stop()
	for _, tc := range []struct {
		c    *webClient
		path string
	}{{c, "/dashboard"}, {admin, "/console/tenants"}} {
		r := tc.c.get(tc.path)
		if r.status != 503 || !isHTML(r) || !strings.Contains(string(r.body), "unavailable") {
			t.Errorf("GET %s with Redis down: %d %s, want a 503 page", tc.path, r.status, r.header.Get("Content-Type"))
		}
	}
	tok := newWebClient(t, base)
	if r := tok.signIn("dashboard", key); r.status != 503 {
		t.Errorf("sign-in with Redis down: %d, want 503", r.status)
	}

	proc.Start()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := newWebClient(t, base).signIn("dashboard", key)
		if r.status == 303 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery 10 s after Redis came back: sign-in %d", r.status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
