package pages

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/usage"
)

// prepaidTier is a valid prepaid tier (quota's rules: billed overage, a
// monthly quota, no price, a top-up URL).
func prepaidTier() quota.Tier {
	return quota.Tier{Slug: "pay-go", Name: "Pay as you go", Rank: 5, Overage: quota.OverageBill, OveragePriceCentsPer1K: 250,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(0))}, Billing: quota.BillingPrepaid,
		TopUpURL: "https://pay.example.test/top-up?plan=pay-go&from=dashboard"}
}

// TestTierFormRoundTripsBilling: the editor's values of a tier read back as
// the same billing mode and top-up URL, and a bad mode or URL is an error
// beside its own field.
func TestTierFormRoundTripsBilling(t *testing.T) {
	t.Parallel()
	for _, want := range []quota.Tier{prepaidTier(), {Slug: "free", Name: "Free", Overage: quota.OverageBlock, Billing: quota.BillingPostpaid}} {
		v := tierValues(want)
		if v["billing"] != string(want.Billing) || v["top_up_url"] != want.TopUpURL {
			t.Errorf("%s: editor values billing %q, top_up_url %q", want.Slug, v["billing"], v["top_up_url"])
		}
		errs := formErrors{}
		got := tierFromForm(errs, v)
		if len(errs) > 0 || got.Billing != want.Billing || got.TopUpURL != want.TopUpURL {
			t.Errorf("%s: read back billing %q, top_up_url %q, errors %v", want.Slug, got.Billing, got.TopUpURL, errs)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("%s: the tier read back does not validate: %v", want.Slug, err)
		}
	}
	// a tier stored before billing modes ("") shows as postpaid
	if v := tierValues(quota.Tier{Slug: "old"}); v["billing"] != "postpaid" {
		t.Errorf("a tier without a billing mode shows as %q", v["billing"])
	}
	for _, tc := range []struct{ field, value, wantField string }{
		{"billing", `"><script>alert(1)</script>`, "billing"},
		{"billing", "PREPAID", "billing"},
		{"top_up_url", "javascript:alert(1)", "top_up_url"},
		{"top_up_url", "ftp://pay.example.test/", "top_up_url"},
		{"top_up_url", "https://", "top_up_url"},
		{"top_up_url", "/relative/top-up", "top_up_url"},
	} {
		v := tierValues(prepaidTier())
		v[tc.field] = tc.value
		errs := formErrors{}
		tierFromForm(errs, v)
		if errs[tc.wantField] == "" || len(errs) != 1 {
			t.Errorf("%s=%q: errors %v, want one beside %s", tc.field, tc.value, errs, tc.wantField)
		}
	}
	// an empty form field is postpaid, and no top-up URL
	v := tierValues(quota.Tier{Slug: "free", Name: "Free", Overage: quota.OverageBlock})
	delete(v, "billing")
	delete(v, "top_up_url")
	errs := formErrors{}
	if got := tierFromForm(errs, v); got.Billing != quota.BillingPostpaid || got.TopUpURL != "" || len(errs) > 0 {
		t.Errorf("absent billing: %q %q %v", got.Billing, got.TopUpURL, errs)
	}
}

// TestPrepaidCreditOf: the credit row and the top-up link are a prepaid
// tier's only, and the link only of an http or https URL.
func TestPrepaidCreditOf(t *testing.T) {
	t.Parallel()
	row := usage.Limit{Name: quota.LimitCredit, Limit: 1234, Remaining: 1233, Reset: "2026-12-01T00:00:00Z"}
	u := usage.Report{Limits: []usage.Limit{{Name: quota.LimitMonthly, Limit: 10, Remaining: 5}, row}}
	credit, link := prepaidCredit(prepaidTier(), u)
	if credit == nil || *credit != row || link != prepaidTier().TopUpURL {
		t.Errorf("prepaid: credit %+v, link %q", credit, link)
	}
	post := prepaidTier()
	post.Billing = quota.BillingPostpaid
	if credit, link := prepaidCredit(post, u); credit != nil || link != "" {
		t.Errorf("postpaid: credit %+v, link %q; want none", credit, link)
	}
	for _, bad := range []string{"javascript:alert(1)", "data:text/html,<script>alert(1)</script>", "//evil.test/x", "https:///nohost", ""} {
		tier := prepaidTier()
		tier.TopUpURL = bad
		if credit, link := prepaidCredit(tier, u); credit == nil || link != "" {
			t.Errorf("top-up URL %q: credit %+v, link %q; want the credit and no link", bad, credit, link)
		}
	}
}

// renderDashboard renders the dashboard page of v.
func renderDashboard(t *testing.T, v tenantView) string {
	t.Helper()
	vs, err := loadViews()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := vs.pages["dashboard"].ExecuteTemplate(&buf, "layout", view{Title: "Usage", Area: "dashboard", Nav: "usage",
		Who: "acme", Data: v}); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

var topUpLink = regexp.MustCompile(`<a class="button" id="top-up" href="([^"]*)"`)

// TestDashboardCreditLine: the exact words and dollars of the credit line,
// the top-up link only once the credit is used up, its URL escaped, and
// nothing of it for a postpaid tenant.
func TestDashboardCreditLine(t *testing.T) {
	t.Parallel()
	tier := prepaidTier()
	for _, tc := range []struct {
		limit, remaining int64
		want             string
		link             bool
	}{
		{1234, 1233, "Prepaid credit: $12.33 left of $12.34 this period", false},
		{123456, 5, "Prepaid credit: $0.05 left of $1,234.56 this period", false},
		{100, 0, "Prepaid credit: $0.00 left of $1.00 this period", true},
		{0, 0, "Prepaid credit: $0.00 left of $0.00 this period", true},
	} {
		credit := &usage.Limit{Name: quota.LimitCredit, Limit: tc.limit, Remaining: tc.remaining, Reset: "2026-12-01T00:00:00Z"}
		page := renderDashboard(t, tenantView{Tier: tier, Credit: credit, TopUpURL: tier.TopUpURL})
		if !strings.Contains(page, `<p class="big" id="prepaid-credit-line">`+tc.want+`</p>`) {
			t.Errorf("%d of %d: no %q in\n%s", tc.remaining, tc.limit, tc.want, section(page, "billing"))
		}
		m := topUpLink.FindStringSubmatch(page)
		if tc.link != (m != nil) || strings.Contains(page, `id="credit-exhausted"`) != tc.link {
			t.Errorf("%d of %d: top-up link %v, want %v", tc.remaining, tc.limit, m, tc.link)
		}
		if m != nil && m[1] != "https://pay.example.test/top-up?plan=pay-go&amp;from=dashboard" {
			t.Errorf("the top-up link's href is %q", m[1])
		}
	}
	// a URL that would break out of the attribute is escaped, never markup
	evil := `https://pay.example.test/"><script>alert(1)</script>`
	page := renderDashboard(t, tenantView{Tier: tier, Credit: &usage.Limit{Name: quota.LimitCredit}, TopUpURL: evil})
	if strings.Contains(page, "<script>alert") || topUpLink.FindStringSubmatch(page) == nil {
		t.Errorf("a hostile top-up URL is not escaped:\n%s", section(page, "billing"))
	}
	// postpaid: no credit line, no top-up link, the words of billed overage
	post := tier
	post.Billing = quota.BillingPostpaid
	page = renderDashboard(t, tenantView{Tier: post})
	for _, no := range []string{"Prepaid credit", `id="prepaid-credit"`, `id="top-up"`, "prepaid credit covers"} {
		if strings.Contains(page, no) {
			t.Errorf("a postpaid tenant's dashboard shows %q", no)
		}
	}
	if !strings.Contains(page, "requests are admitted and billed at $2.50 per 1,000 units") {
		t.Errorf("a postpaid tenant's dashboard lost its overage words:\n%s", page)
	}
}

// section is the part of page from the section with the id given, for
// messages.
func section(page, id string) string {
	if i := strings.Index(page, `id="`+id+`"`); i >= 0 {
		return page[i:min(len(page), i+3000)]
	}
	return page
}
