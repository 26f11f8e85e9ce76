package api

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// Browser tests of the admin console.

func consoleSignIn(tb testing.TB, ctx context.Context, base string) {
	tb.Helper()
	if st := signIn(tb, ctx, base, "console", adminToken); st != 200 || location(tb, ctx) != "/console/tenants" {
		tb.Fatalf("admin sign-in: %s (%d), want /console/tenants (200)", location(tb, ctx), st)
	}
}

func (s *stack) adminTier(slug string) quota.Tier {
	s.tb.Helper()
	t, err := s.store.Tier(context.Background(), slug)
	if err != nil {
		s.tb.Fatal(err)
	}
	return t
}

// TestBrowserAdminEditsATier: an invalid value is shown beside its field
// and saves nothing; a valid one is saved, shown in the table and served by
// the admin API.
func TestBrowserAdminEditsATier(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(100, quota.Limits{BurstRate: quota.Ptr(5.0), Burst: quota.Ptr(int64(10)),
		DailyQuota: quota.Ptr(int64(1000)), MonthlyQuota: quota.Ptr(int64(20000))})
	base := s.start()
	b := browser(t, desktopW, desktopH)
	consoleSignIn(t, b, base)

	mustNavigate(t, b, base, "/console/tiers", 200)
	if got := text(t, b, "#tier-"+tier.Slug+" .daily"); got != "1,000" {
		t.Fatalf("tier table shows daily quota %q, want 1,000", got)
	}
	if st := submit(t, b, fmt.Sprintf(`a[href="/console/tiers/%s"]`, tier.Slug)); st != 200 || location(t, b) != "/console/tiers/"+tier.Slug {
		t.Fatalf("edit link: %s (%d)", location(t, b), st)
	}
	valid := map[string]string{"daily_quota": "1000", "burst": "10"}
	for _, tc := range []struct{ field, value, wantErr string }{
		{"daily_quota", "-5", "must be an integer between 0 and"},
		{"daily_quota", "lots", "must be a whole number"},
		{"burst", "", "burst_rate and burst are both set or both empty"},
	} {
		fill(t, b, "f-"+tc.field, tc.value)
		if st := submit(t, b, "form.tier-form button[type=submit]"); st != 400 {
			t.Errorf("%s=%q: status %d, want 400", tc.field, tc.value, st)
		}
		if got := text(t, b, "#f-"+tc.field+"-error"); !strings.Contains(got, tc.wantErr) {
			t.Errorf("%s=%q: error beside the field %q, want %q", tc.field, tc.value, got, tc.wantErr)
		}
		if got := evalJS[string](t, b, fmt.Sprintf(`document.getElementById("f-%s").getAttribute("aria-invalid")`, tc.field)); got != "true" {
			t.Errorf("%s=%q: field not marked invalid", tc.field, tc.value)
		}
		if got := evalJS[string](t, b, fmt.Sprintf(`document.getElementById("f-%s").value`, tc.field)); got != tc.value {
			t.Errorf("%s: the form lost the typed value: %q, want %q", tc.field, got, tc.value)
		}
		if !strings.Contains(text(t, b, "#form-errors"), "not saved") {
			t.Errorf("%s=%q: no summary saying the tier was not saved", tc.field, tc.value)
		}
		if got := s.adminTier(tier.Slug); *got.DailyQuota != 1000 || *got.Burst != 10 {
			t.Fatalf("%s=%q changed the tier: daily %d, burst %d", tc.field, tc.value, *got.DailyQuota, *got.Burst)
		}
		if tc.field == "daily_quota" && tc.value == "-5" {
			testenv.Screenshot(t, b, "invalid")
		}
		fill(t, b, "f-"+tc.field, valid[tc.field]) // back to valid for the next case
	}

	fill(t, b, "f-daily_quota", "2500")
	if st := submit(t, b, "form.tier-form button[type=submit]"); st != 200 || !strings.HasPrefix(location(t, b), "/console/tiers?ok=saved") {
		t.Fatalf("valid save: %s (%d), want the tier table", location(t, b), st)
	}
	if got := text(t, b, "#flash"); got != "Tier saved." {
		t.Errorf("flash %q", got)
	}
	if got := text(t, b, "#tier-"+tier.Slug+" .daily"); got != "2,500" {
		t.Errorf("tier table shows daily quota %q, want 2,500", got)
	}
	var api quota.Tier
	if err := json.Unmarshal(do(t, "GET", base+"/admin/v1/tiers/"+tier.Slug, adminToken, "").body, &api); err != nil {
		t.Fatal(err)
	}
	if api.DailyQuota == nil || *api.DailyQuota != 2500 || *api.MonthlyQuota != 20000 || *api.Burst != 10 || api.Name != tier.Name {
		t.Errorf("admin API after the save: %+v, want daily 2500 and the rest unchanged", api)
	}
	audit := do(t, "GET", base+"/admin/v1/audit?entity=tier&entity_id="+tier.Slug, adminToken, "")
	if !strings.Contains(string(audit.body), `"actor":"console"`) {
		t.Errorf("the audit log has no console change of the tier: %s", audit.body)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "")
}

// TestBrowserAdminIssuesAndRevokesAKey: the new key's secret is shown once
// and works; revoked, it stops working at once.
func TestBrowserAdminIssuesAndRevokesAKey(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tenant, _ := s.tenant("free")
	base := s.start()
	b := browser(t, desktopW, desktopH)
	consoleSignIn(t, b, base)
	mustNavigate(t, b, base, "/console/tenants/"+tenant.ID, 200)

	fill(t, b, "key-name", "ci-runner")
	if st := submit(t, b, "#issue-key"); st != 201 {
		t.Fatalf("issue key: status %d, want 201", st)
	}
	secret := text(t, b, "#new-secret")
	if !strings.HasPrefix(secret, "tg_") {
		t.Fatalf("secret shown %q", secret)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "issued")
	if r := do(t, "GET", base+"/v1/usage", secret, ""); r.status != 200 {
		t.Fatalf("the new key: GET /v1/usage %d, want 200", r.status)
	}
	prefix := evalJS[string](t, b, `(() => { for (const r of document.querySelectorAll("#keys-table tr[data-prefix]"))
		if (r.querySelector("th").textContent.trim() === "ci-runner") return r.dataset.prefix; return ""; })()`)
	if prefix == "" || !strings.HasPrefix(secret, prefix) {
		t.Fatalf("key row prefix %q, want the secret's prefix", prefix)
	}

	// Shown once: the tenant's page does not show it again.
	mustNavigate(t, b, base, "/console/tenants/"+tenant.ID, 200)
	if got := text(t, b, "#new-secret"); got != "<none>" {
		t.Errorf("the secret is shown again: %q", got)
	}
	if strings.Contains(evalJS[string](t, b, `document.documentElement.outerHTML`), secret) {
		t.Error("the secret is in the page again")
	}

	row := fmt.Sprintf(`#keys-table tr[data-prefix=%q]`, prefix)
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(row+" details summary"))); err != nil {
		t.Fatal(err)
	}
	if st := submit(t, b, row+" form button"); st != 200 || !strings.Contains(location(t, b), "ok=revoked") {
		t.Fatalf("revoke: %s (%d)", location(t, b), st)
	}
	if got := text(t, b, "#flash"); got != "Key revoked." {
		t.Errorf("flash %q", got)
	}
	if got := text(t, b, row+" .state"); !strings.HasPrefix(got, "revoked") {
		t.Errorf("key state %q, want revoked", got)
	}
	if r := do(t, "GET", base+"/v1/usage", secret, ""); r.status != 401 {
		t.Errorf("the revoked key: GET /v1/usage %d, want 401", r.status)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "")
}

// TestBrowserAdminManagesTenants walks the rest of the console: the tenant
// list (its month's usage equal to the JSON API, search, creation), a
// tenant's page (usage equal to the API, grants, tier change, suspend and
// resume), invoices with the CSV download, and alerts.
func TestBrowserAdminManagesTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustStack(t)
	tier := s.stableTier(100, 100, 1000)
	acme, acmeKey := s.tenant(tier.Slug)
	globex, _ := s.tenant("free")
	for _, name := range []struct {
		id, name string
	}{{acme.ID, "Acme Corp"}, {globex.ID, "Globex"}} {
		if _, err := s.store.UpdateTenant(ctx, "test", name.id, func(t *quota.Tenant) error { t.Name = name.name; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	base := s.start()
	for range 3 {
		mustStatus(t, do(t, "POST", base+"/api/demo/report", acmeKey, ""), 201)
	}
	mustStatus(t, do(t, "GET", base+"/api/demo/echo", acmeKey, ""), 200)
	month := quota.MonthStart(time.Now())
	if _, err := billing.NewInvoicer(s.pool, time.Now, 48*time.Hour).Generate(ctx, acme.ID, month); err != nil {
		t.Fatal(err)
	}
	if _, err := billing.NewInvoicer(s.pool, time.Now, 48*time.Hour).Generate(ctx, globex.ID, month); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO alerts (tenant_id, period, threshold, units, quota, status, attempts, last_error)
		VALUES ($1, $2, 80, 820, 1000, 'failed', 10, 'POST https://hooks.example.test: connection refused')`, acme.ID, month); err != nil {
		t.Fatal(err)
	}
	summary := func() apiUsage {
		var u apiUsage
		if err := json.Unmarshal(do(t, "GET", base+"/admin/v1/tenants/"+acme.ID+"/summary", adminToken, "").body, &u); err != nil {
			t.Fatal(err)
		}
		return u
	}

	b := browser(t, desktopW, desktopH)
	consoleSignIn(t, b, base)

	// The list: tier, status and the month's usage, as the API sums it.
	type row struct {
		Tier     string `json:"tier"`
		Status   string `json:"status"`
		Units    string `json:"units"`
		Requests string `json:"requests"`
		Rejected string `json:"rejected"`
	}
	rows := func() map[string]row {
		return evalJS[map[string]row](t, b, `Object.fromEntries([...document.querySelectorAll("#tenants-table tr[data-tenant]")].map(r =>
			[r.dataset.tenant, {tier: r.querySelector(".tier").textContent.trim(), status: r.querySelector(".status").textContent.trim(),
			 units: r.querySelector(".units").textContent.trim(), requests: r.querySelector(".requests").textContent.trim(),
			 rejected: r.querySelector(".rejected").textContent.trim()}]))`)
	}
	var units, requests, rejected int64
	for _, d := range summary().Daily {
		units, requests, rejected = units+d.Units, requests+d.Requests, rejected+d.Rejected
	}
	got := rows()
	if want := (row{tier.Name, "active", commas(units), commas(requests), commas(rejected)}); got[acme.ID] != want {
		t.Errorf("Acme's row %+v, want %+v (the API's sums)", got[acme.ID], want)
	}
	if units != 31 || rejected != 0 {
		t.Errorf("API month: %d units, %d refused; want 31 and 0 (the test's premise)", units, rejected)
	}
	if got[globex.ID].Units != "0" || got[globex.ID].Tier != "Free" {
		t.Errorf("Globex's row %+v", got[globex.ID])
	}
	fill(t, b, "q", "glob")
	submit(t, b, "form.search button")
	if got := rows(); len(got) != 1 || got[globex.ID].Tier != "Free" {
		t.Errorf("search for glob: rows %v, want Globex only", got)
	}

	// Create a tenant from the list.
	mustNavigate(t, b, base, "/console/tenants", 200)
	fill(t, b, "new-name", "Initech")
	if err := chromedp.Do(b, chromedp.SetValue(chromedp.ID("new-tier"), "pro")); err != nil {
		t.Fatal(err)
	}
	if st := submit(t, b, `form[method=post][action="/console/tenants"] button`); st != 200 || !strings.Contains(location(t, b), "ok=created") {
		t.Fatalf("create tenant: %s (%d)", location(t, b), st)
	}
	if got := text(t, b, "#page-h"); got != "Initech" {
		t.Errorf("new tenant page heading %q", got)
	}
	if got := text(t, b, "#tier-name"); !strings.HasPrefix(got, "Pro") {
		t.Errorf("new tenant tier %q, want Pro", got)
	}

	// Acme's page shows its usage as the API does.
	mustNavigate(t, b, base, "/console/tenants/"+acme.ID, 200)
	compareUsage(t, evalJS[pageUsage](t, b, readUsagePage), summary())

	// Grants: a bad amount is refused beside its field; a good one adds to
	// the month at once.
	if err := chromedp.Do(b, chromedp.SetValue(chromedp.ID("grant-period"), "month")); err != nil {
		t.Fatal(err)
	}
	fill(t, b, "grant-units", "-3")
	if st := submit(t, b, `form[action$="/grants"] button`); st != 400 {
		t.Errorf("grant of -3: status %d, want 400", st)
	}
	if got := text(t, b, "#grant-units-error"); !strings.Contains(got, "between 1 and") {
		t.Errorf("grant error %q", got)
	}
	fill(t, b, "grant-units", "500")
	if st := submit(t, b, `form[action$="/grants"] button`); st != 200 || text(t, b, "#flash") != "Grant added." {
		t.Fatalf("grant: %s (%d) flash %q", location(t, b), st, text(t, b, "#flash"))
	}
	if got := text(t, b, "#grants-table .units"); got != "500" {
		t.Errorf("grants table shows %q, want 500", got)
	}
	if got := text(t, b, "#limit-monthly .limit"); got != "1,500" {
		t.Errorf("monthly quota after the grant %q, want 1,500", got)
	}
	compareUsage(t, evalJS[pageUsage](t, b, readUsagePage), summary())

	// Tier change, then suspend and resume: the key follows at once.
	if err := chromedp.Do(b, chromedp.SetValue(chromedp.ID("change-tier"), "pro")); err != nil {
		t.Fatal(err)
	}
	if st := submit(t, b, `form[action$="/tier"] button`); st != 200 || text(t, b, "#flash") != "Tier changed." {
		t.Fatalf("tier change: %d, flash %q", st, text(t, b, "#flash"))
	}
	if got := evalJS[string](t, b, `document.getElementById("tier-name").dataset.tier`); got != "pro" {
		t.Errorf("tier after the change %q, want pro", got)
	}
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(".manage details summary"))); err != nil {
		t.Fatal(err)
	}
	if st := submit(t, b, "#suspend"); st != 200 || text(t, b, "#tenant-status") != "suspended" {
		t.Fatalf("suspend: %d, status %q", st, text(t, b, "#tenant-status"))
	}
	if r := do(t, "GET", base+"/v1/usage", acmeKey, ""); r.status != 403 {
		t.Errorf("suspended tenant's key: %d, want 403", r.status)
	}
	if st := submit(t, b, "#resume"); st != 200 || text(t, b, "#tenant-status") != "active" {
		t.Fatalf("resume: %d, status %q", st, text(t, b, "#tenant-status"))
	}
	if r := do(t, "GET", base+"/v1/usage", acmeKey, ""); r.status != 200 {
		t.Errorf("resumed tenant's key: %d, want 200", r.status)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "tenant")

	// Invoices of the month, and the CSV download equal to the admin API's.
	period := month.Format("2006-01")
	mustNavigate(t, b, base, "/console/invoices?period="+period, 200)
	if got := text(t, b, "#invoice-count"); got != "2" {
		t.Errorf("invoice count %q, want 2", got)
	}
	// The download link, fetched as the browser would: with its session
	// cookie (the page's CSP lets no script fetch it).
	csvHref := evalJS[string](t, b, `document.getElementById("csv").getAttribute("href")`)
	session := cookies(t, b, base)["tg_console"]
	if session == nil {
		t.Fatal("no console session cookie")
	}
	pageCSV := do(t, "GET", base+csvHref, "", "", "Cookie", "tg_console="+session.Value)
	apiCSV := do(t, "GET", base+"/admin/v1/invoices?period="+period, adminToken, "", "Accept", "text/csv")
	if pageCSV.status != 200 || string(pageCSV.body) != string(apiCSV.body) || !strings.Contains(string(pageCSV.body), acme.ID) ||
		!strings.HasPrefix(string(pageCSV.body), "invoice_id,") || !strings.HasPrefix(pageCSV.header.Get("Content-Type"), "text/csv") {
		t.Errorf("console CSV (%d, %s):\n%s\nadmin API CSV:\n%s", pageCSV.status, pageCSV.header.Get("Content-Type"), pageCSV.body, apiCSV.body)
	}
	if r := do(t, "GET", base+csvHref, "", ""); r.status == 200 && strings.Contains(string(r.body), acme.ID) {
		t.Error("the CSV download works without a session")
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "invoices")

	// Alerts and their delivery state.
	mustNavigate(t, b, base, "/console/alerts?status=failed", 200)
	if got := text(t, b, "#alerts-table tr[data-alert] .state"); got != "failed" {
		t.Errorf("alert state %q, want failed", got)
	}
	if got := text(t, b, "#alerts-table tr[data-alert] .last-error"); !strings.Contains(got, "connection refused") {
		t.Errorf("alert last error %q", got)
	}
	mustNavigate(t, b, base, "/console/alerts?status=delivered", 200)
	if got := text(t, b, "#alerts-table tr[data-alert]"); got != "<none>" {
		t.Errorf("delivered alerts show %q, want none", got)
	}
	mustNavigate(t, b, base, "/console/alerts", 200)
	checkPage(t, b)
	testenv.Screenshot(t, b, "")
}

// TestBrowserPagesAtPhoneWidth opens every page at a phone's width: none is
// wider than the screen, every form control has a label, every posting form
// has its CSRF token.
func TestBrowserPagesAtPhoneWidth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustStack(t)
	tenant, key := s.tenant("pro")
	base := s.start()
	mustStatus(t, do(t, "POST", base+"/api/demo/report", key, ""), 201)
	if _, err := billing.NewInvoicer(s.pool, time.Now, 48*time.Hour).Generate(ctx, tenant.ID, quota.MonthStart(time.Now())); err != nil {
		t.Fatal(err)
	}
	b := browser(t, phoneW, phoneH)
	mustNavigate(t, b, base, "/dashboard/login", 200)
	checkPage(t, b)
	if st := signIn(t, b, base, "dashboard", key); st != 200 {
		t.Fatalf("sign-in: %d", st)
	}
	if w := evalJS[int](t, b, `window.innerWidth`); w != phoneW {
		t.Fatalf("window is %d px wide, want %d", w, phoneW)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "dashboard")
	mustNavigate(t, b, base, "/console/login", 200)
	checkPage(t, b)
	consoleSignIn(t, b, base)
	for _, p := range []struct{ name, path string }{
		{"tenants", "/console/tenants"},
		{"tenant", "/console/tenants/" + tenant.ID},
		{"tiers", "/console/tiers"},
		{"tier", "/console/tiers/pro"},
		{"new-tier", "/console/new-tier"},
		{"invoices", "/console/invoices"},
		{"alerts", "/console/alerts"},
	} {
		mustNavigate(t, b, base, p.path, 200)
		checkPage(t, b)
		testenv.Screenshot(t, b, p.name)
	}
}
