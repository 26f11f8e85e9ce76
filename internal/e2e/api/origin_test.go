package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/tollgate/tollgate/internal/quota"
)

// Upstream content shares an origin with the dashboard and the console:
// whatever an upstream answers must not act as that origin in a browser
// (run script with the pages' cookies, read the pages, set their cookies).

// originRoutes is a route table for the tests here: /api/up/ in front of
// an upstream.
const originRoutes = `{"method": "*", "path": "/api/up/", "meter": "up", "cost": 1, "upstream": "%[1]s/v1/"}`

// attackPage is an upstream's HTML answer whose script, if it ran as this
// origin, would read the console's CSRF token and create a tenant with it.
const attackPage = `<!doctype html><html><head><title>upstream</title></head><body><p>upstream page</p>
<script>
window.ran = true;
(async () => {
	try {
		const page = await (await fetch("/console/tenants", {credentials: "include"})).text();
		const m = page.match(/name="_csrf" value="([^"]+)"/);
		if (m) {
			await fetch("/console/tenants", {method: "POST", credentials: "include",
				headers: {"Content-Type": "application/x-www-form-urlencoded"},
				body: "_csrf=" + encodeURIComponent(m[1]) + "&name=pwned-by-script&tier=free"});
		}
	} finally {
		window.done = true;
	}
})();
</script></body></html>`

// mustBeConfined checks that an answer's content cannot act as the api's
// origin in a browser: a CSP sandbox (no allow-same-origin, no scripts)
// and no type sniffing.
func mustBeConfined(tb testing.TB, what string, r reply) {
	tb.Helper()
	if !slices.Contains(r.header.Values("Content-Security-Policy"), "sandbox") {
		tb.Errorf("%s: Content-Security-Policy %q, want one policy that is exactly sandbox", what, r.header.Values("Content-Security-Policy"))
	}
	if got := r.header.Values("X-Content-Type-Options"); len(got) != 1 || got[0] != "nosniff" {
		tb.Errorf("%s: X-Content-Type-Options %q, want nosniff once", what, got)
	}
}

// TestProxiedAnswersAreSandboxed: every answer an upstream makes, read
// whole or streamed, live or replayed for an Idempotency-Key, reaches the
// client under Content-Security-Policy: sandbox and nosniff, beside the
// upstream's own policy, which still applies.
func TestProxiedAnswersAreSandboxed(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 1<<20+1) // past what the proxy reads whole: streamed
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/page":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Content-Security-Policy", "default-src 'self'")
			fmt.Fprint(w, attackPage)
		case "/v1/untyped":
			w.Header()["Content-Type"] = nil // no type: a browser would sniff one
			fmt.Fprint(w, attackPage)
		case "/v1/big":
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, big)
		case "/v1/chunked":
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, attackPage)
			w.(http.Flusher).Flush()
			fmt.Fprint(w, big)
		}
	}))
	t.Cleanup(up.Close)
	base, _, key := proxyStack(t, originRoutes, up.URL, 1000)

	page := rawGet(t, base, "/api/up/page", key)
	if page.status != 200 || !strings.Contains(string(page.body), "upstream page") {
		t.Fatalf("GET /api/up/page: %d %.80s, want the upstream's page", page.status, page.body)
	}
	mustBeConfined(t, "the upstream's page", page)
	if !slices.Contains(page.header.Values("Content-Security-Policy"), "default-src 'self'") {
		t.Errorf("Content-Security-Policy %q: the upstream's own policy is gone", page.header.Values("Content-Security-Policy"))
	}
	mustBeConfined(t, "an untyped answer", rawGet(t, base, "/api/up/untyped", key))
	for _, p := range []string{"/api/up/big", "/api/up/chunked"} {
		r := rawGet(t, base, p, key)
		if r.status != 200 || len(r.body) <= 1<<20 {
			t.Fatalf("GET %s: %d, %d bytes, want 200 and the whole answer", p, r.status, len(r.body))
		}
		mustBeConfined(t, p, r)
	}

	// A replay answers the stored page: confined alike.
	for i, want := range []string{"", "true"} {
		r := raw(t, base, "GET /api/up/page HTTP/1.1", "Authorization: Bearer "+key, "Idempotency-Key: origin-page-1")
		if r.status != 200 || r.header.Get("Idempotent-Replayed") != want || !strings.Contains(string(r.body), "upstream page") {
			t.Fatalf("call %d with an Idempotency-Key: %d, Idempotent-Replayed %q, want 200 and %q", i+1, r.status, r.header.Get("Idempotent-Replayed"), want)
		}
		mustBeConfined(t, fmt.Sprintf("call %d with an Idempotency-Key", i+1), r)
	}
}

// TestUpstreamCannotSetThePagesCookies: an upstream's answer may set its
// own cookies, never one named as the pages' are (tg_*, in any case): it
// would sign a browser out of the console, or into a session the upstream
// chose. Nor may it clear the origin's data.
func TestUpstreamCannotSetThePagesCookies(t *testing.T) {
	t.Parallel()
	up := newSeeingUpstream(t, func(w http.ResponseWriter) {
		h := w.Header()
		for _, c := range []string{
			"tg_console=fixed; Path=/console; HttpOnly",
			"tg_dashboard=fixed; Path=/dashboard",
			"tg_login=fixed; Path=/console/login",
			"TG_Console=fixed; Path=/console",
			"upstream_session=abc; Path=/api/up",
		} {
			h.Add("Set-Cookie", c)
		}
		h.Set("Clear-Site-Data", `"cookies", "storage"`)
	})
	base, _, key := proxyStack(t, originRoutes, up.srv.URL, 1000)
	r := rawGet(t, base, "/api/up/x", key)
	if r.status != 200 {
		t.Fatalf("GET /api/up/x: %d, want 200 (%s)", r.status, r.body)
	}
	var names []string
	for _, c := range (&http.Response{Header: r.header}).Cookies() {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, []string{"upstream_session"}) {
		t.Errorf("the answer sets cookies %q (%q), want the upstream's own, upstream_session, alone", names, r.header.Values("Set-Cookie"))
	}
	if v := r.header.Values("Clear-Site-Data"); len(v) != 0 {
		t.Errorf("Clear-Site-Data %q from the upstream reached the client", v)
	}
}

// TestConsoleCookiesAreStrict: the console's cookies (its session and its
// sign-in form's token) are HttpOnly, scoped to the console and
// SameSite=Strict: no request another site starts, a link followed
// included, carries them.
func TestConsoleCookiesAreStrict(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	c := newWebClient(t, s.start())
	form := c.get("/console/login")
	r := c.signIn("console", adminToken)
	if r.status != 303 {
		t.Fatalf("console sign-in: %d, want 303 (%s)", r.status, r.body)
	}
	got := map[string]*http.Cookie{}
	for _, h := range []http.Header{form.header, r.header} {
		for _, ck := range (&http.Response{Header: h}).Cookies() {
			got[ck.Name] = ck
		}
	}
	for name, path := range map[string]string{"tg_console": "/console", "tg_login": "/console/login"} {
		ck := got[name]
		if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != path {
			t.Errorf("cookie %s: %+v, want HttpOnly, SameSite=Strict, Path=%s", name, ck, path)
		}
	}
}

// TestBrowserUpstreamPageCannotReachTheConsole: an admin signed in to the
// console opens an upstream's HTML page through the api (a browser that
// sends a key with every request: an extension, a proxy that adds it).
// The page's own script does not run; a script run in it anyway (here by
// DevTools) is in an opaque origin: it reads no cookie, and the console's
// and the dashboard's pages, fetched from it, come without the session and
// cannot be read, so their CSRF tokens are out of its reach and no form of
// the console can be posted.
func TestBrowserUpstreamPageCannotReachTheConsole(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, attackPage)
	}))
	t.Cleanup(page.Close)
	s.writeRoutes(t, originRoutes, page.URL)
	base := s.start()
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	_, key := s.tenant(tier.Slug)

	b := browser(t, desktopW, desktopH)
	consoleSignIn(t, b, base)
	if st := signIn(t, b, base, "dashboard", key); st != 200 || location(t, b) != "/dashboard" {
		t.Fatalf("dashboard sign-in: %s (%d), want /dashboard (200)", location(t, b), st)
	}
	extraHeaders := func(h network.Headers) {
		if _, err := chromedp.Call(b, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: h}); err != nil {
			t.Fatal(err)
		}
	}
	extraHeaders(network.Headers{"X-API-Key": key})
	mustNavigate(t, b, base, "/api/up/page", 200)
	extraHeaders(network.Headers{}) // the requests below are the page's alone
	if got := text(t, b, "p"); got != "upstream page" {
		t.Fatalf("the upstream's page shows %q, want its text", got)
	}
	if ran := evalJS[bool](t, b, `window.ran === true`); ran {
		// Give its attack the time to end before the checks below.
		if _, err := chromedp.Run(b, chromedp.Evaluate[bool](
			`new Promise(r => { const w = () => window.done ? r(true) : setTimeout(w, 20); w(); })`, chromedp.EvalAwaitPromise)); err != nil {
			t.Fatal(err)
		}
		t.Errorf("the upstream page's script ran")
	}

	// A script in the page, whichever way it came to run.
	type attempt struct {
		Origin string `json:"origin"`
		Cookie string `json:"cookie"`
		Read   string `json:"read"`
		Dash   string `json:"dash"`
		Post   string `json:"post"`
	}
	got, err := chromedp.Run(b, chromedp.Evaluate[attempt](`(async () => {
		const out = {origin: String(self.origin), cookie: "", read: "", dash: "", post: ""};
		try { out.cookie = document.cookie; } catch (e) { out.cookie = "(" + e.name + ")"; }
		let token = "";
		try {
			const res = await fetch("/console/tenants", {credentials: "include"});
			const m = (await res.text()).match(/name="_csrf" value="([^"]+)"/);
			token = m ? m[1] : "";
			out.read = token ? "token" : "no token (" + res.status + " " + res.url + ")";
		} catch (e) { out.read = "(" + e.name + ")"; }
		try {
			const res = await fetch("/dashboard", {credentials: "include"});
			out.dash = /name="_csrf" value="[^"]+"/.test(await res.text()) ? "token" : "no token (" + res.status + " " + res.url + ")";
		} catch (e) { out.dash = "(" + e.name + ")"; }
		try {
			const res = await fetch("/console/tenants", {method: "POST", credentials: "include", mode: "no-cors",
				headers: {"Content-Type": "application/x-www-form-urlencoded"},
				body: "_csrf=" + encodeURIComponent(token) + "&name=pwned-by-devtools&tier=free"});
			out.post = res.type + " " + res.status;
		} catch (e) { out.post = "(" + e.name + ")"; }
		return out;
	})()`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluate in the upstream's page: %v", err)
	}
	t.Logf("a script in the upstream's page: %+v", got)
	if got.Origin != "null" {
		t.Errorf("the upstream's page runs as origin %q, want an opaque one (null)", got.Origin)
	}
	if got.Cookie != "" && !strings.HasPrefix(got.Cookie, "(") {
		t.Errorf("the upstream's page reads cookies %q", got.Cookie)
	}
	if got.Read == "token" || got.Dash == "token" {
		t.Errorf("the upstream's page read a CSRF token: the console's (%s), the dashboard's (%s)", got.Read, got.Dash)
	}
	tenants := admin(t, "GET", base+"/admin/v1/tenants?limit=200", "")
	if tenants.status != 200 || strings.Contains(string(tenants.body), "pwned-by") {
		t.Errorf("tenants after the upstream's page: %d %s, want none created by it", tenants.status, tenants.body)
	}

	// The pages themselves still work in this browser, signed in.
	for _, p := range []string{"/console/tenants", "/dashboard"} {
		mustNavigate(t, b, base, p, 200)
		if location(t, b) != p {
			t.Errorf("%s leads to %s after the upstream's page, want the page itself (still signed in)", p, location(t, b))
		}
	}
}

// TestFallbackAnswersAreSandboxed: a degrade policy's fallback answers in
// the upstream's place, in whatever type it names: confined alike.
func TestFallbackAnswersAreSandboxed(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(34, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	_, key := s.tenant(tier.Slug)
	mustPolicy(t, base, `{"name": "html-fallback", "algorithm": "fixed_window", "limit": 1, "window_seconds": 86400,
		"on_refuse": "degrade", "fallback": {"status": 200, "content_type": "text/html", "body": "<p>busy</p><script>window.ran = true</script>"},
		"match": {"tiers": ["`+tier.Slug+`"]}}`)
	r := waitPolicy(t, base, key, "html-fallback")
	if r.header.Get("Tollgate-Degraded") == "" {
		r = do(t, "GET", base+"/api/demo/echo", key, "") // past the limit of 1
	}
	if r.status != 200 || !strings.HasPrefix(string(r.body), "<p>busy</p>") {
		t.Fatalf("degraded request: %d %q, want 200 and the fallback", r.status, r.body)
	}
	mustBeConfined(t, "a fallback answer", r)
}
