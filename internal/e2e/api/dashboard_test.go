package api

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// Browser tests of the tenant dashboard.

// apiUsage is GET /v1/usage as a client reads it.
type apiUsage struct {
	TenantID string `json:"tenant_id"`
	Tier     string `json:"tier"`
	Limits   []struct {
		Name      string `json:"name"`
		Limit     int64  `json:"limit"`
		Remaining int64  `json:"remaining"`
		Reset     string `json:"reset"`
	} `json:"limits"`
	Daily []struct {
		Date     string `json:"date"`
		Units    int64  `json:"units"`
		Requests int64  `json:"requests"`
		Rejected int64  `json:"rejected"`
	} `json:"daily"`
	Meters []struct {
		Meter    string `json:"meter"`
		Units    int64  `json:"units"`
		Requests int64  `json:"requests"`
		Rejected int64  `json:"rejected"`
	} `json:"meters"`
	Upgrade *struct {
		Tier         string `json:"tier"`
		PriceCents   int64  `json:"price_cents"`
		DailyQuota   *int64 `json:"daily_quota"`
		MonthlyQuota *int64 `json:"monthly_quota"`
		URL          string `json:"url"`
	} `json:"upgrade"`
}

func getUsage(tb testing.TB, base, key string) apiUsage {
	tb.Helper()
	r := do(tb, "GET", base+"/v1/usage", key, "")
	if r.status != 200 {
		tb.Fatalf("GET /v1/usage: %d %s", r.status, r.body)
	}
	var u apiUsage
	if err := json.Unmarshal(r.body, &u); err != nil {
		tb.Fatal(err)
	}
	return u
}

// pageUsage is what the dashboard shows, read from the page's text.
type pageUsage struct {
	Tier   string              `json:"tier"`
	Limits map[string]*pageLim `json:"limits"`
	Daily  []pageRow           `json:"daily"`
	Meters []pageRow           `json:"meters"`
	Bars   []pageRow           `json:"bars"`
	Marks  []pageRow           `json:"marks"`
	Month  map[string]string   `json:"month"`
	Invs   []map[string]string `json:"invoices"`
	Up     map[string]string   `json:"upgrade"`
	Extra  map[string]string   `json:"extra"`
}

type pageLim struct {
	Limit     string `json:"limit"`
	Remaining string `json:"remaining"`
	Reset     string `json:"reset"`
}

type pageRow struct {
	Key      string `json:"key"`
	Units    string `json:"units"`
	Requests string `json:"requests"`
	Rejected string `json:"rejected"`
}

// readUsagePage reads the usage sections shared by the dashboard and the
// console's tenant page.
const readUsagePage = `(() => {
	const txt = (el, sel) => { const e = el && el.querySelector(sel); return e ? e.textContent.trim() : null; };
	const attr = (el, sel, a) => { const e = el && el.querySelector(sel); return e ? e.getAttribute(a) : null; };
	const lim = id => { const el = document.getElementById(id); if (!el || !el.querySelector(".limit")) return null;
		return {limit: txt(el, ".limit"), remaining: txt(el, ".remaining"), reset: attr(el, "time.reset", "datetime")}; };
	const rows = (sel, key) => [...document.querySelectorAll(sel)].map(r => ({key: r.getAttribute(key),
		units: txt(r, ".units"), requests: txt(r, ".requests"), rejected: txt(r, ".rejected")}));
	const up = document.getElementById("upgrade");
	return {
		tier: document.getElementById("tier-name").dataset.tier,
		limits: {burst: lim("limit-burst"), bucket: lim("limit-bucket"), daily: lim("limit-daily"), monthly: lim("limit-monthly")},
		daily: rows("#daily-table tbody tr[data-key]", "data-key"),
		meters: rows("#meters-table tbody tr[data-key]", "data-key"),
		bars: [...document.querySelectorAll("svg.chart rect.bar[data-date]")].map(b => ({key: b.dataset.date, units: b.dataset.units})),
		marks: [...document.querySelectorAll("svg.chart .refusal")].map(g => ({key: g.dataset.date, rejected: txt(g, "text")})),
		month: {units: txt(document, "#month-units"), requests: txt(document, "#month-requests"), rejected: txt(document, "#month-rejected")},
		invoices: [...document.querySelectorAll("#invoices-table tr[data-invoice]")].map(r => ({id: r.dataset.invoice, status: txt(r, ".status"), total: txt(r, ".total")})),
		upgrade: up ? {tier: up.dataset.tier, price: txt(up, ".price"), daily: txt(up, ".daily"), monthly: txt(up, ".monthly"), href: attr(up, "a", "href")} : null,
		extra: {chartTitle: txt(document, "svg.chart title"), xAxis: txt(document, "svg.chart .x-axis .axis-title"), yAxis: txt(document, "svg.chart .y-axis .axis-title")},
	};
})()`

// compareUsage fails the test for every number the page shows that differs
// from the JSON API's.
func compareUsage(tb testing.TB, got pageUsage, want apiUsage) {
	tb.Helper()
	if got.Tier != want.Tier {
		tb.Errorf("tier: page %q, API %q", got.Tier, want.Tier)
	}
	seen := map[string]bool{}
	for _, l := range want.Limits {
		seen[l.Name] = true
		p := got.Limits[l.Name]
		if p == nil {
			tb.Errorf("limit %s: on the API, not on the page", l.Name)
			continue
		}
		if p.Limit != commas(l.Limit) || p.Remaining != commas(l.Remaining) || p.Reset != l.Reset {
			tb.Errorf("limit %s: page %+v, API limit %d remaining %d reset %s", l.Name, *p, l.Limit, l.Remaining, l.Reset)
		}
	}
	for name, p := range got.Limits {
		if p != nil && !seen[name] {
			tb.Errorf("limit %s: on the page, not on the API", name)
		}
	}
	if len(got.Daily) != len(want.Daily) {
		tb.Errorf("daily rows: page %d, API %d", len(got.Daily), len(want.Daily))
	}
	var units, requests, rejected int64
	bars := map[string]string{}
	for _, b := range got.Bars {
		bars[b.Key] = b.Units
	}
	marks := map[string]string{}
	for _, m := range got.Marks {
		marks[m.Key] = m.Rejected
	}
	for i, d := range want.Daily {
		units, requests, rejected = units+d.Units, requests+d.Requests, rejected+d.Rejected
		if i < len(got.Daily) {
			g := got.Daily[i]
			if g != (pageRow{d.Date, commas(d.Units), commas(d.Requests), commas(d.Rejected)}) {
				tb.Errorf("day %s: page %+v, API %+v", d.Date, g, d)
			}
		}
		if d.Units > 0 && bars[d.Date] != strconv.FormatInt(d.Units, 10) {
			tb.Errorf("chart bar of %s: %q units, API %d", d.Date, bars[d.Date], d.Units)
		}
		if d.Rejected > 0 && marks[d.Date] != commas(d.Rejected) {
			tb.Errorf("chart refusal mark of %s: %q, API %d refused", d.Date, marks[d.Date], d.Rejected)
		}
		if d.Rejected == 0 && marks[d.Date] != "" {
			tb.Errorf("chart marks refusals on %s, API has none", d.Date)
		}
	}
	if got.Month["units"] != commas(units) || got.Month["requests"] != commas(requests) || got.Month["rejected"] != commas(rejected) {
		tb.Errorf("month totals: page %v, API days sum to %d units, %d requests, %d refused", got.Month, units, requests, rejected)
	}
	if len(got.Meters) != len(want.Meters) {
		tb.Errorf("meters: page %d rows, API %d", len(got.Meters), len(want.Meters))
	}
	for i := range min(len(got.Meters), len(want.Meters)) {
		m := want.Meters[i]
		if got.Meters[i] != (pageRow{m.Meter, commas(m.Units), commas(m.Requests), commas(m.Rejected)}) {
			tb.Errorf("meter %s: page %+v, API %+v", m.Meter, got.Meters[i], m)
		}
	}
}

// stableTier is a tier whose burst limits refill so slowly (one unit per
// 11.6 days) that their remaining amounts cannot change during a test, so
// the page and the API, read moments apart, must agree exactly.
func (s *stack) stableTier(rank int, daily, monthly int64) quota.Tier {
	s.tb.Helper()
	return s.tier(rank, quota.Limits{BurstRate: quota.Ptr(1e-6), Burst: quota.Ptr(int64(100)),
		BucketCapacity: quota.Ptr(int64(500)), BucketRefillPerSec: quota.Ptr(1e-6),
		DailyQuota: quota.Ptr(daily), MonthlyQuota: quota.Ptr(monthly)})
}

// TestBrowserTenantSeesTheNumbersOfTheAPI: a tenant signs in with a key and
// sees its tier, quotas, burst limits, daily chart, meters, invoices and
// upgrade hint, each number equal to GET /v1/usage and /v1/invoices.
func TestBrowserTenantSeesTheNumbersOfTheAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustStack(t)
	tier := s.stableTier(100, 30, 1000)
	up := s.tier(101, quota.Limits{DailyQuota: quota.Ptr(int64(5000)), MonthlyQuota: quota.Ptr(int64(90000))})
	tenant, key := s.tenant(tier.Slug)
	base := s.start()

	// Usage: 7 × echo (1 unit), 2 × report (10), a third report refused by
	// the daily quota (27 + 10 > 30), one more echo.
	for range 7 {
		mustStatus(t, do(t, "GET", base+"/api/demo/echo", key, ""), 200)
	}
	for range 2 {
		mustStatus(t, do(t, "POST", base+"/api/demo/report", key, ""), 201)
	}
	mustStatus(t, do(t, "POST", base+"/api/demo/report", key, ""), 429)
	mustStatus(t, do(t, "GET", base+"/api/demo/echo", key, ""), 200)
	// Flushed usage of an earlier day this month, with refusals, as the
	// worker would have written it.
	now := time.Now().UTC()
	month := quota.MonthStart(now)
	if now.Day() > 1 {
		if _, err := s.pool.Exec(ctx, `INSERT INTO usage (tenant_id, hour, meter, units, requests, rejected)
			VALUES ($1, $2, 'demo', 40, 40, 3)`, tenant.ID, month.Add(10*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	inv, err := billing.NewInvoicer(s.pool, time.Now, 48*time.Hour).Generate(ctx, tenant.ID, month)
	if err != nil {
		t.Fatal(err)
	}

	b := browser(t, desktopW, desktopH)
	if st := visit(t, b, base, "/dashboard"); st != 200 || !strings.HasPrefix(location(t, b), "/dashboard/login") {
		t.Fatalf("signed out, /dashboard led to %s (%d), want the sign-in page", location(t, b), st)
	}
	if st := signIn(t, b, base, "dashboard", key); st != 200 || location(t, b) != "/dashboard" {
		t.Fatalf("after sign-in: %s (%d), want /dashboard (200)", location(t, b), st)
	}
	got := evalJS[pageUsage](t, b, readUsagePage)
	want := getUsage(t, base, key)
	compareUsage(t, got, want)
	if len(want.Daily) == 0 || len(want.Meters) != 2 || want.Meters[1].Rejected != 1 {
		t.Errorf("API usage %+v: want the requests above (the test's own premise)", want)
	}

	// The upgrade hint: the next tier up, its price and quotas.
	if want.Upgrade == nil || want.Upgrade.Tier != up.Slug {
		t.Fatalf("API upgrade %+v, want tier %s", want.Upgrade, up.Slug)
	}
	if got.Up["tier"] != up.Slug || got.Up["price"] != dollars(up.PriceCents)+" per month" ||
		got.Up["daily"] != "5,000 units" || got.Up["monthly"] != "90,000 units" || got.Up["href"] != want.Upgrade.URL {
		t.Errorf("upgrade on the page %v, want tier %s, %s per month, 5,000 and 90,000 units, link %s", got.Up, up.Slug, dollars(up.PriceCents), want.Upgrade.URL)
	}
	// Invoices equal to GET /v1/invoices.
	var invs struct {
		Items []billing.Invoice `json:"items"`
	}
	if err := json.Unmarshal(do(t, "GET", base+"/v1/invoices", key, "").body, &invs); err != nil {
		t.Fatal(err)
	}
	if len(invs.Items) != 1 || len(got.Invs) != 1 || got.Invs[0]["id"] != inv.ID ||
		got.Invs[0]["total"] != dollars(invs.Items[0].TotalCents) || got.Invs[0]["status"] != invs.Items[0].Status {
		t.Errorf("invoices: page %v, API %+v", got.Invs, invs.Items)
	}
	// The chart has its axes named, with units.
	if got.Extra["yAxis"] != "units per day" || !strings.HasPrefix(got.Extra["xAxis"], "day of ") || !strings.Contains(got.Extra["xAxis"], "(UTC)") {
		t.Errorf("chart axes %v, want titles with units", got.Extra)
	}

	// The key is not kept by the browser: the session cookie is HttpOnly,
	// SameSite and random, and no storage or markup holds the key.
	ck := cookies(t, b, base)["tg_dashboard"]
	if ck == nil || !ck.HTTPOnly || string(ck.SameSite) != "Lax" || ck.Path != "/dashboard" || strings.Contains(ck.Value, key) || len(ck.Value) < 40 {
		t.Errorf("session cookie %+v, want HttpOnly, SameSite=Lax, Path=/dashboard, a random value", ck)
	}
	leak := evalJS[bool](t, b, `document.documentElement.outerHTML.includes(`+jsString(key)+`) ||
		JSON.stringify(localStorage).includes(`+jsString(key)+`) || JSON.stringify(sessionStorage).includes(`+jsString(key)+`) ||
		document.cookie.includes(`+jsString(key)+`)`)
	if leak {
		t.Error("the API key is in the page, the browser's storage or a script-readable cookie")
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "")

	// The invoice page shows the invoice's lines and total.
	mustNavigate(t, b, base, "/dashboard/invoices/"+inv.ID, 200)
	if got := text(t, b, "table.lines tfoot .total"); got != dollars(inv.TotalCents) {
		t.Errorf("invoice total on its page %q, want %s", got, dollars(inv.TotalCents))
	}

	// Signing out ends the session: the dashboard asks to sign in again.
	mustNavigate(t, b, base, "/dashboard", 200)
	if st := submit(t, b, "form.signout button"); st != 200 || !strings.HasPrefix(location(t, b), "/dashboard/login") {
		t.Fatalf("after sign-out: %s (%d), want the sign-in page", location(t, b), st)
	}
	if got := text(t, b, "main .notice"); got != "You are signed out." {
		t.Errorf("sign-out notice %q", got)
	}
	if visit(t, b, base, "/dashboard"); !strings.HasPrefix(location(t, b), "/dashboard/login") {
		t.Errorf("after sign-out, /dashboard shows %s, want the sign-in page", location(t, b))
	}
}

func mustStatus(tb testing.TB, r reply, want int) {
	tb.Helper()
	if r.status != want {
		tb.Fatalf("status %d, want %d: %s", r.status, want, r.body)
	}
}

func mustNavigate(tb testing.TB, ctx context.Context, base, path string, want int64) {
	tb.Helper()
	if st := visit(tb, ctx, base, path); st != want {
		tb.Fatalf("GET %s: status %d, want %d (at %s)", path, st, want, location(tb, ctx))
	}
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestBrowserWrongKeyIsRefused: a wrong key gets the sign-in page again with
// the reason, and no session.
func TestBrowserWrongKeyIsRefused(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	_, key := s.tenant("free")
	base := s.start()
	b := browser(t, desktopW, desktopH)
	for _, wrong := range []string{"not-a-key", key[:len(key)-2] + "zz"} {
		if st := signIn(t, b, base, "dashboard", wrong); st != 401 {
			t.Errorf("sign-in with %q: status %d, want 401", wrong, st)
		}
		if loc := location(t, b); !strings.HasPrefix(loc, "/dashboard/login") {
			t.Errorf("after a wrong key the browser shows %s, want the sign-in page", loc)
		}
		if got := text(t, b, "#login-error"); !strings.Contains(got, "not valid") {
			t.Errorf("error shown %q, want it to say the key is not valid", got)
		}
		if evalJS[string](t, b, `document.getElementById("api_key").getAttribute("aria-invalid")`) != "true" {
			t.Error("the key field is not marked invalid")
		}
		if _, ok := cookies(t, b, base)["tg_dashboard"]; ok {
			t.Error("a wrong key got a session cookie")
		}
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "")
	if visit(t, b, base, "/dashboard"); !strings.HasPrefix(location(t, b), "/dashboard/login") {
		t.Errorf("after wrong keys, /dashboard shows %s, want the sign-in page", location(t, b))
	}
}

// TestBrowserTenantCannotOpenOtherTenantsOrAdminPages: signed in as one
// tenant, another tenant's invoice is not found and the console asks for
// the admin token; nothing of the other tenant shows.
func TestBrowserTenantCannotOpenOtherTenantsOrAdminPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustStack(t)
	alice, aliceKey := s.tenant("free")
	bob, _ := s.tenant("pro")
	month := quota.MonthStart(time.Now())
	inv := billing.NewInvoicer(s.pool, time.Now, 48*time.Hour)
	aliceInv, err := inv.Generate(ctx, alice.ID, month)
	if err != nil {
		t.Fatal(err)
	}
	bobInv, err := inv.Generate(ctx, bob.ID, month)
	if err != nil {
		t.Fatal(err)
	}
	base := s.start()
	b := browser(t, desktopW, desktopH)
	if st := signIn(t, b, base, "dashboard", aliceKey); st != 200 {
		t.Fatalf("sign-in: %d", st)
	}
	noBob := func(where string) {
		t.Helper()
		html := evalJS[string](t, b, `document.documentElement.outerHTML`)
		if strings.Contains(html, bob.ID) && !strings.Contains(where, bob.ID) || strings.Contains(html, bob.Name) || strings.Contains(html, bobInv.ID) && !strings.Contains(where, bobInv.ID) {
			t.Errorf("%s shows the other tenant's data", where)
		}
	}
	mustNavigate(t, b, base, "/dashboard/invoices/"+aliceInv.ID, 200)
	if st := visit(t, b, base, "/dashboard/invoices/"+bobInv.ID); st != 404 {
		t.Errorf("another tenant's invoice: status %d, want 404", st)
	}
	if got := text(t, b, "#error-detail"); !strings.Contains(got, "no such invoice") {
		t.Errorf("error page says %q", got)
	}
	if strings.Contains(evalJS[string](t, b, `document.body.innerText`), dollars(bobInv.TotalCents)+" ") {
		t.Error("the other tenant's invoice total shows")
	}
	noBob("/dashboard/invoices/" + bobInv.ID)
	for _, path := range []string{"/console/tenants/" + bob.ID, "/console/tenants", "/console/tiers", "/console/invoices", "/console/alerts", "/console"} {
		visit(t, b, base, path)
		if loc := location(t, b); !strings.HasPrefix(loc, "/console/login") {
			t.Errorf("a tenant opened %s and got %s, want the admin sign-in page", path, loc)
		}
		noBob(path)
	}
	// The tenant's own session works with neither the admin API nor the
	// console's forms.
	if r := do(t, "GET", base+"/admin/v1/tenants/"+bob.ID, aliceKey, ""); r.status != 401 {
		t.Errorf("admin API with a tenant key: %d, want 401", r.status)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "")
}

// TestBrowserUnlimitedQuotasStillShowTheUsage: a plan without daily and
// monthly quotas shows today's and the month's units instead of meters,
// equal to the API's days; the top tier offers no upgrade.
func TestBrowserUnlimitedQuotasStillShowTheUsage(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	top := s.tier(1000, quota.Limits{BurstRate: quota.Ptr(1e-6), Burst: quota.Ptr(int64(100))}) // stable, as stableTier
	_, key := s.tenant(top.Slug)
	base := s.start()
	for range 3 {
		mustStatus(t, do(t, "GET", base+"/api/demo/echo", key, ""), 200)
	}
	mustStatus(t, do(t, "POST", base+"/api/demo/report", key, ""), 201)
	b := browser(t, desktopW, desktopH)
	if st := signIn(t, b, base, "dashboard", key); st != 200 {
		t.Fatalf("sign-in: %d", st)
	}
	want := getUsage(t, base, key)
	compareUsage(t, evalJS[pageUsage](t, b, readUsagePage), want)
	var today int64
	for _, d := range want.Daily {
		if d.Date == time.Now().UTC().Format(time.DateOnly) {
			today = d.Units
		}
	}
	if today != 13 {
		t.Errorf("API: %d units today, want 13 (the test's premise)", today)
	}
	if got := text(t, b, "#limit-daily .used"); got != commas(today) {
		t.Errorf("today's units on the page %q, want %s", got, commas(today))
	}
	if got := text(t, b, "#limit-daily"); !strings.Contains(got, "unlimited") {
		t.Errorf("today's card %q does not say the quota is unlimited", got)
	}
	if got := text(t, b, "#limit-monthly .used"); got != commas(today) {
		t.Errorf("the month's units on the page %q, want %s", got, commas(today))
	}
	if got := text(t, b, "#upgrade"); got != "<none>" || want.Upgrade != nil {
		t.Errorf("the top tier offers an upgrade: page %q, API %+v", got, want.Upgrade)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "")
}
