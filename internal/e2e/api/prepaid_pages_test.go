package api

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The console's tier editor and the tenant pages of prepaid billing, over
// the real stack (Redis and Postgres): the billing mode and top-up URL
// round-trip through the editor, bad ones are shown beside their field and
// save nothing, and a prepaid tenant's pages show its credit row of
// /v1/usage in dollars, with the top-up link once it is used up.

// pagesPrepaidTier makes a tier prepaid: billed overage at a cent a unit,
// no price, top-up URL url.
func pagesPrepaidTier(url string) func(*quota.Tier) {
	return func(t *quota.Tier) {
		t.Billing, t.TopUpURL, t.PriceCents = quota.BillingPrepaid, url, 0
		t.Overage, t.OveragePriceCentsPer1K = quota.OverageBill, 1000
	}
}

// TestConsoleTierEditorCarriesPrepaidBilling: the editor shows and saves
// the billing mode and top-up URL; a bad URL, a prepaid tier without one or
// with a price, and a hostile billing value are each shown beside their
// field and change nothing; a prepaid tier without a top-up URL is not
// created.
func TestConsoleTierEditorCarriesPrepaidBilling(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(8100, quota.Limits{MonthlyQuota: quota.Ptr(int64(100))}, func(t *quota.Tier) {
		t.Overage, t.OveragePriceCentsPer1K, t.PriceCents = quota.OverageBill, 1000, 0
	})
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	path := "/console/tiers/" + tier.Slug
	page := string(c.get(path).body)
	if !strings.Contains(page, `<option value="postpaid" selected>`) || strings.Contains(page, `<option value="prepaid" selected>`) ||
		!strings.Contains(page, `name="top_up_url" type="text" value=""`) {
		t.Fatalf("the editor of a postpaid tier does not show postpaid and an empty top-up URL:\n%s", page)
	}
	const topUp = "https://pay.example.test/top-up?plan=p&src=console"
	form := map[string]string{"name": tier.Name, "rank": strconv.Itoa(tier.Rank), "price_cents": "0", "monthly_quota": "100",
		"overage": "bill", "overage_price_cents_per_1k": "1000", "billing": "prepaid", "top_up_url": topUp}
	unchanged := func(what string) {
		t.Helper()
		if got := s.adminTier(tier.Slug); got.IsPrepaid() || got.TopUpURL != "" || got.PriceCents != 0 || got.Overage != quota.OverageBill {
			t.Fatalf("%s changed the tier: billing %q, top_up_url %q, price %d, overage %q", what, got.Billing, got.TopUpURL, got.PriceCents, got.Overage)
		}
	}
	audit := auditCount(t, s)
	for _, tc := range []struct {
		name, field, want string
		change            map[string]string
	}{
		{"javascript top-up URL", "f-top_up_url", "must be an http or https URL", map[string]string{"top_up_url": "javascript:alert(1)"}},
		{"relative top-up URL", "f-top_up_url", "must be an http or https URL", map[string]string{"top_up_url": "/top-up"}},
		{"prepaid without a top-up URL", "f-top_up_url", "is required for a prepaid tier", map[string]string{"top_up_url": ""}},
		{"prepaid with a price", "f-price_cents", "must be 0 for a prepaid tier", map[string]string{"price_cents": "900"}},
		{"prepaid refusing overage", "f-billing", `a prepaid tier must have overage "bill"`,
			map[string]string{"overage": "block", "overage_price_cents_per_1k": "0"}},
		{"prepaid without a monthly quota", "f-billing", "a prepaid tier must have a monthly quota", map[string]string{"monthly_quota": ""}},
		{"hostile billing", "f-billing", "must be postpaid or prepaid", map[string]string{"billing": `"><script>alert(1)</script>`}},
	} {
		r := c.post(path, policyPageForm(c.csrf(path), with(form, tc.change)))
		if got := fieldErrorOf(r.body, tc.field); r.status != 400 || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %d, error beside %s %q; want 400 and %q", tc.name, r.status, tc.field, got, tc.want)
		}
		if strings.Contains(string(r.body), "<script>alert(1)") || strings.Contains(string(r.body), `href="javascript:`) {
			t.Errorf("%s: the page carries the hostile value as markup", tc.name)
		}
		unchanged(tc.name)
	}
	if got := auditCount(t, s); got != audit {
		t.Errorf("the refused forms wrote %d audit entries", got-audit)
	}

	// saved: prepaid with its URL, shown again by the editor
	if r := c.post(path, policyPageForm(c.csrf(path), form)); r.status != 303 {
		t.Fatalf("save prepaid: %d %s", r.status, r.body)
	}
	if got := s.adminTier(tier.Slug); !got.IsPrepaid() || got.TopUpURL != topUp {
		t.Fatalf("after the save: billing %q, top_up_url %q", got.Billing, got.TopUpURL)
	}
	page = string(c.get(path).body)
	if !strings.Contains(page, `<option value="prepaid" selected>`) ||
		!strings.Contains(page, `name="top_up_url" type="text" value="https://pay.example.test/top-up?plan=p&amp;src=console"`) {
		t.Fatalf("the editor of the prepaid tier does not show it:\n%s", page)
	}
	// and back to postpaid, the URL emptied
	if r := c.post(path, policyPageForm(c.csrf(path), with(form, map[string]string{"billing": "postpaid", "top_up_url": ""}))); r.status != 303 {
		t.Fatalf("save postpaid: %d %s", r.status, r.body)
	}
	if got := s.adminTier(tier.Slug); got.IsPrepaid() || got.TopUpURL != "" {
		t.Fatalf("back to postpaid: billing %q, top_up_url %q", got.Billing, got.TopUpURL)
	}

	// the new-tier form: not created without a top-up URL, created with one
	slug := "pp-" + strings.ToLower(tier.Slug[len(tier.Slug)-6:])
	create := with(form, map[string]string{"slug": slug, "name": "Prepaid new", "rank": "8101", "top_up_url": ""})
	r := c.post("/console/tiers", policyPageForm(c.csrf("/console/new-tier"), create))
	if got := fieldErrorOf(r.body, "f-top_up_url"); r.status != 400 || !strings.Contains(got, "is required for a prepaid tier") {
		t.Errorf("create without a top-up URL: %d, error %q", r.status, got)
	}
	if _, err := s.store.Tier(context.Background(), slug); quota.ErrorCode(err) != quota.CodeNotFound {
		t.Fatalf("a refused form created tier %s (err %v)", slug, err)
	}
	create["top_up_url"] = topUp
	if r := c.post("/console/tiers", policyPageForm(c.csrf("/console/new-tier"), create)); r.status != 303 {
		t.Fatalf("create prepaid: %d %s", r.status, r.body)
	}
	if got := s.adminTier(slug); !got.IsPrepaid() || got.TopUpURL != topUp {
		t.Errorf("created: billing %q, top_up_url %q", got.Billing, got.TopUpURL)
	}
}

var (
	pagesCreditLine = regexp.MustCompile(`<p class="big" id="prepaid-credit-line">([^<]*)</p>`)
	pagesTopUpHref  = regexp.MustCompile(`<a class="button" id="top-up" href="([^"]*)"`)
)

// pagesCreditRow is the credit row of the tenant's /v1/usage.
func pagesCreditRow(t *testing.T, base, key string) (limit, remaining int64, ok bool) {
	t.Helper()
	for _, l := range getUsage(t, base, key).Limits {
		if l.Name == string(quota.LimitCredit) {
			return l.Limit, l.Remaining, true
		}
	}
	return 0, 0, false
}

// TestPrepaidTenantPagesShowTheCredit: the dashboard and the console's
// tenant page of a prepaid tenant show /v1/usage's credit row in dollars,
// and the tier's top-up link once nothing is left (only an http or https
// one); a postpaid tenant's pages show neither.
func TestPrepaidTenantPagesShowTheCredit(t *testing.T) {
	t.Parallel()
	if now := time.Now().UTC(); quota.MonthStart(now).AddDate(0, 1, 0).Sub(now) < 2*time.Minute {
		t.Skip("too close to the month's end: the period would roll over during the test")
	}
	s := mustStack(t)
	const topUp = "https://pay.example.test/top-up?plan=p&src=dash"
	pp := s.tier(8200, quota.Limits{MonthlyQuota: quota.Ptr(int64(0))}, pagesPrepaidTier(topUp))
	// a URL the admin API would refuse, stored all the same (an older
	// binary, a hand edit): no link is drawn from it
	bad := s.tier(8201, quota.Limits{MonthlyQuota: quota.Ptr(int64(0))}, pagesPrepaidTier("javascript:alert(1)"))
	post := s.tier(8202, quota.Limits{MonthlyQuota: quota.Ptr(int64(100))}, func(t *quota.Tier) {
		t.Overage, t.OveragePriceCentsPer1K = quota.OverageBill, 100000
	})
	base := s.start()
	admin := newWebClient(t, base)
	admin.mustSignIn("console", adminToken)
	grant := func(id string, cents int) {
		t.Helper()
		mustStatus(t, do(t, "POST", base+"/admin/v1/tenants/"+id+"/credits", adminToken,
			`{"amount_cents": `+strconv.Itoa(cents)+`, "reason": "prepaid"}`), 201)
	}

	for _, tc := range []struct {
		name     string
		tier     quota.Tier
		cents    int // credit granted; 0: none
		spend    int // requests past the quota, a cent each
		want     string
		wantLink string // "": no top-up link
	}{
		{"credit left", pp, 123456, 2, "Prepaid credit: $1,234.54 left of $1,234.56 this period", ""},
		{"credit spent", pp, 3, 3, "Prepaid credit: $0.00 left of $0.03 this period", "https://pay.example.test/top-up?plan=p&amp;src=dash"},
		{"no credit", pp, 0, 0, "Prepaid credit: $0.00 left of $0.00 this period", "https://pay.example.test/top-up?plan=p&amp;src=dash"},
		{"no credit, a javascript: top-up URL", bad, 0, 0, "Prepaid credit: $0.00 left of $0.00 this period", ""},
	} {
		tenant, key := s.tenant(tc.tier.Slug)
		if tc.cents > 0 {
			grant(tenant.ID, tc.cents)
		}
		for i := range tc.spend {
			if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
				t.Fatalf("%s: request %d past the quota: %d %s", tc.name, i+1, r.status, r.body)
			}
		}
		if tc.cents == tc.spend {
			if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 402 {
				t.Fatalf("%s: with the credit spent: %d %s, want 402", tc.name, r.status, r.body)
			}
		}
		limit, remaining, ok := pagesCreditRow(t, base, key)
		if !ok || limit != int64(tc.cents) || remaining != int64(tc.cents-tc.spend) {
			t.Errorf("%s: /v1/usage credit row %d of %d (found %v)", tc.name, remaining, limit, ok)
		}
		dash := newWebClient(t, base)
		dash.mustSignIn("dashboard", key)
		for _, pg := range []struct{ where, body string }{
			{"dashboard", string(dash.get("/dashboard").body)},
			{"console", string(admin.get("/console/tenants/" + tenant.ID).body)},
		} {
			m := pagesCreditLine.FindStringSubmatch(pg.body)
			if m == nil || m[1] != tc.want {
				t.Errorf("%s, %s: credit line %q, want %q", tc.name, pg.where, m, tc.want)
			}
			link := pagesTopUpHref.FindStringSubmatch(pg.body)
			switch {
			case tc.wantLink == "" && link != nil:
				t.Errorf("%s, %s: a top-up link %q", tc.name, pg.where, link[1])
			case tc.wantLink != "" && (link == nil || link[1] != tc.wantLink):
				t.Errorf("%s, %s: top-up link %q, want href %q", tc.name, pg.where, link, tc.wantLink)
			}
			if (remaining == 0) != strings.Contains(pg.body, `id="credit-exhausted"`) {
				t.Errorf("%s, %s: the used-up notice is shown %v with %d left", tc.name, pg.where, remaining != 0, remaining)
			}
			if strings.Contains(pg.body, "javascript:") {
				t.Errorf("%s, %s: the page carries a javascript: URL", tc.name, pg.where)
			}
		}
	}

	// postpaid: no credit row, no credit line, no top-up link, even with credit
	tenant, key := s.tenant(post.Slug)
	grant(tenant.ID, 5000)
	if _, _, ok := pagesCreditRow(t, base, key); ok {
		t.Errorf("a postpaid tenant's /v1/usage has a credit row")
	}
	dash := newWebClient(t, base)
	dash.mustSignIn("dashboard", key)
	for where, body := range map[string]string{
		"dashboard": string(dash.get("/dashboard").body), "console": string(admin.get("/console/tenants/" + tenant.ID).body),
	} {
		for _, no := range []string{"Prepaid credit:", `id="prepaid-credit"`, `id="top-up"`, `id="credit-exhausted"`} {
			if strings.Contains(body, no) {
				t.Errorf("postpaid %s shows %q", where, no)
			}
		}
		if !strings.Contains(body, `id="credits-balance">$50.00<`) {
			t.Errorf("postpaid %s lost its credit balance of $50.00", where)
		}
	}
}

// TestBrowserPrepaidCreditAtPhoneWidth: at a phone's width, a prepaid
// tenant whose credit is spent sees the credit line with /v1/usage's
// numbers and a working top-up link, and the dashboard, the console's
// tenant page and the tier editor still fit the window with every control
// labelled.
func TestBrowserPrepaidCreditAtPhoneWidth(t *testing.T) {
	t.Parallel()
	if now := time.Now().UTC(); quota.MonthStart(now).AddDate(0, 1, 0).Sub(now) < 2*time.Minute {
		t.Skip("too close to the month's end: the period would roll over during the test")
	}
	s := mustStack(t)
	const topUp = "https://pay.example.test/top-up?plan=p&src=dash"
	tier := s.tier(8300, quota.Limits{MonthlyQuota: quota.Ptr(int64(1))}, pagesPrepaidTier(topUp))
	tenant, key := s.tenant(tier.Slug)
	base := s.start()
	mustStatus(t, do(t, "POST", base+"/admin/v1/tenants/"+tenant.ID+"/credits", adminToken, `{"amount_cents": 2, "reason": "trial"}`), 201)
	for range 3 { // one included, two a cent each
		mustStatus(t, do(t, "GET", base+"/api/demo/echo", key, ""), 200)
	}
	mustStatus(t, do(t, "GET", base+"/api/demo/echo", key, ""), 402)
	limit, remaining, ok := pagesCreditRow(t, base, key)
	if !ok || limit != 2 || remaining != 0 {
		t.Fatalf("/v1/usage credit row %d of %d (found %v), want 0 of 2", remaining, limit, ok)
	}

	b := browser(t, phoneW, phoneH)
	if st := signIn(t, b, base, "dashboard", key); st != 200 || location(t, b) != "/dashboard" {
		t.Fatalf("sign-in: %s (%d)", location(t, b), st)
	}
	want := "Prepaid credit: " + dollars(remaining) + " left of " + dollars(limit) + " this period"
	if got := text(t, b, "#prepaid-credit-line"); got != want || got != "Prepaid credit: $0.00 left of $0.02 this period" {
		t.Errorf("credit line %q, want %q", got, want)
	}
	if got := evalJS[string](t, b, `document.querySelector("#top-up") ? document.querySelector("#top-up").href : ""`); got != topUp {
		t.Errorf("top-up link %q, want %q", got, topUp)
	}
	if got := text(t, b, "#overage-notice"); !strings.Contains(got, "prepaid credit covers") {
		t.Errorf("quota notice %q, want the prepaid words", got)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "dashboard-prepaid")

	a := browser(t, phoneW, phoneH)
	consoleSignIn(t, a, base)
	mustNavigate(t, a, base, "/console/tenants/"+tenant.ID, 200)
	if got := text(t, a, "#prepaid-credit-line"); got != want {
		t.Errorf("console: credit line %q, want %q", got, want)
	}
	checkPage(t, a)
	mustNavigate(t, a, base, "/console/tiers/"+tier.Slug, 200)
	if got := evalJS[string](t, a, `document.querySelector("#f-billing").value + " " + document.querySelector("#f-top_up_url").value`); got != "prepaid "+topUp {
		t.Errorf("tier editor: billing and top-up URL %q", got)
	}
	checkPage(t, a)
}
