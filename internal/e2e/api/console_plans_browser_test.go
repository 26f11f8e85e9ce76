package api

import (
	"context"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// Browser tests of the console's plan forms.

// TestBrowserAdminEditsMeterQuotas: in the tier editor an admin fills the
// blank meter quota row; a meter name with a quote is refused beside its
// field (the name shown again as typed, escaped) and saves nothing;
// corrected, it is saved and shown in its row with a new blank row; ticked
// "Remove", it goes.
func TestBrowserAdminEditsMeterQuotas(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(160, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	base := s.start()
	b := browser(t, desktopW, desktopH)
	consoleSignIn(t, b, base)
	mustNavigate(t, b, base, "/console/tiers/"+tier.Slug, 200)
	if got := text(t, b, "#mq-0 legend"); got != "New meter quota" {
		t.Fatalf("the blank row's legend %q", got)
	}

	fill(t, b, "f-mq-0-meter", `de"mo`)
	fill(t, b, "f-mq-0-daily_quota", "3")
	fill(t, b, "f-mq-0-monthly_quota", "90")
	choose(t, b, "f-mq-0-overage", "bill")
	fill(t, b, "f-mq-0-overage_price_cents_per_1k", "25")
	if st := submit(t, b, "form.tier-form button[type=submit]"); st != 400 {
		t.Fatalf("meter with a quote: status %d, want 400", st)
	}
	if got := text(t, b, "#f-mq-0-meter-error"); !strings.Contains(got, "must be 1 to 64 of a-z") {
		t.Errorf("error beside the meter %q", got)
	}
	if got := evalJS[string](t, b, `document.getElementById("f-mq-0-meter").value`); got != `de"mo` {
		t.Errorf("the meter as typed is shown again as %q", got)
	}
	if got := evalJS[string](t, b, `document.getElementById("f-mq-0-meter").getAttribute("aria-invalid")`); got != "true" {
		t.Errorf("the meter field is not marked invalid")
	}
	if !strings.Contains(text(t, b, "#form-errors"), "not saved") {
		t.Errorf("no summary saying the tier was not saved")
	}
	if got := s.adminTier(tier.Slug); len(got.MeterQuotas) != 0 {
		t.Fatalf("a refused meter quota was saved: %+v", got.MeterQuotas)
	}
	testenv.Screenshot(t, b, "invalid")

	fill(t, b, "f-mq-0-meter", "demo")
	if st := submit(t, b, "form.tier-form button[type=submit]"); st != 200 || !strings.HasPrefix(location(t, b), "/console/tiers?ok=saved") {
		t.Fatalf("valid save: %s (%d)", location(t, b), st)
	}
	got := s.adminTier(tier.Slug)
	want := []quota.MeterQuota{{Meter: "demo", DailyQuota: quota.Ptr(int64(3)), MonthlyQuota: quota.Ptr(int64(90)),
		Overage: quota.OverageBill, OveragePriceCentsPer1K: 25}}
	if jsonOf(got.MeterQuotas) != jsonOf(want) {
		t.Fatalf("saved %s, want %s", jsonOf(got.MeterQuotas), jsonOf(want))
	}
	mustNavigate(t, b, base, "/console/tiers/"+tier.Slug, 200)
	if got := text(t, b, "#mq-0 legend"); got != "Meter demo" {
		t.Errorf("row 0's legend %q, want Meter demo", got)
	}
	if got := evalJS[string](t, b, `document.getElementById("f-mq-0-overage").value`); got != "bill" {
		t.Errorf("row 0's overage %q", got)
	}
	if got := text(t, b, "#mq-1 legend"); got != "New meter quota" {
		t.Errorf("no blank row after the saved one: %q", got)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "saved")

	if err := evalJS[bool](t, b, `(() => { document.getElementById("f-mq-0-remove").click(); return true; })()`); !err {
		t.Fatal("could not tick remove")
	}
	if st := submit(t, b, "form.tier-form button[type=submit]"); st != 200 {
		t.Fatalf("remove: status %d", st)
	}
	if got := s.adminTier(tier.Slug); len(got.MeterQuotas) != 0 {
		t.Errorf("after removing: %s", jsonOf(got.MeterQuotas))
	}
}

// TestBrowserAdminManagesAPlan: on a tenant's page an admin sets the billing
// calendar (a path for a zone refused beside its field), adds a credit
// (listed with the balance), asks a tier change for the next period (shown
// pending) and cancels it.
func TestBrowserAdminManagesAPlan(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	small := s.tier(310, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	big := s.tier(311, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	tenant, _ := s.tenant(small.Slug)
	base := s.start()
	b := browser(t, desktopW, desktopH)
	consoleSignIn(t, b, base)
	path := "/console/tenants/" + tenant.ID
	mustNavigate(t, b, base, path, 200)

	fill(t, b, "f-time_zone", "../../etc/passwd")
	if st := submit(t, b, "#save-calendar"); st != 400 {
		t.Fatalf("bad zone: status %d, want 400", st)
	}
	if got := text(t, b, "#f-time_zone-error"); !strings.Contains(got, "IANA time zone name") {
		t.Errorf("error beside the zone %q", got)
	}
	if got := s.storedTenant(tenant.ID); got.TimeZone != "UTC" {
		t.Fatalf("a refused zone changed the tenant: %q", got.TimeZone)
	}
	fill(t, b, "f-time_zone", "Asia/Tokyo")
	fill(t, b, "f-billing_anchor_day", "20")
	if st := submit(t, b, "#save-calendar"); st != 200 || text(t, b, "#flash") != "Billing calendar saved." {
		t.Fatalf("calendar: %s (%d)", location(t, b), st)
	}
	if got := s.storedTenant(tenant.ID); got.TimeZone != "Asia/Tokyo" || got.BillingAnchorDay != 20 {
		t.Fatalf("calendar stored: %d %q", got.BillingAnchorDay, got.TimeZone)
	}
	if got := text(t, b, "#billing-period"); !strings.HasSuffix(got, "(Asia/Tokyo)") || !strings.Contains(got, " 20") {
		t.Errorf("period shown %q, want the 20th in Asia/Tokyo", got)
	}

	fill(t, b, "f-amount", "-5")
	fill(t, b, "f-reason", "welcome")
	if st := submit(t, b, "#add-credit"); st != 400 {
		t.Fatalf("negative credit: status %d, want 400", st)
	}
	if got := text(t, b, "#f-amount-error"); !strings.Contains(got, "positive amount") {
		t.Errorf("error beside the amount %q", got)
	}
	fill(t, b, "f-amount", "12.50")
	if st := submit(t, b, "#add-credit"); st != 200 || text(t, b, "#flash") != "Credit added." {
		t.Fatalf("credit: %s (%d)", location(t, b), st)
	}
	if got := text(t, b, "#credit-balance"); got != "$12.50" {
		t.Errorf("balance %q, want $12.50", got)
	}
	if got := text(t, b, "#credits-table .reason"); got != "welcome" {
		t.Errorf("ledger reason %q", got)
	}

	choose(t, b, "change-tier", big.Slug)
	choose(t, b, "change-effective", "next_period")
	choose(t, b, "change-quota", "reset")
	if st := submit(t, b, `form[action$="/tier"] button`); st != 200 || !strings.Contains(text(t, b, "#flash"), "next billing period") {
		t.Fatalf("pending change: %s (%d) %q", location(t, b), st, text(t, b, "#flash"))
	}
	if got := text(t, b, "#pending-change .pending-tier"); got != big.Name {
		t.Errorf("pending tier shown %q, want %s", got, big.Name)
	}
	if got := s.storedTenant(tenant.ID); got.Tier != small.Slug || got.PendingChange == nil {
		t.Fatalf("stored: tier %q pending %+v", got.Tier, got.PendingChange)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "pending")
	if st := submit(t, b, "#cancel-plan button"); st != 200 || text(t, b, "#flash") != "Pending tier change cancelled." {
		t.Fatalf("cancel: %s (%d)", location(t, b), st)
	}
	if got := s.storedTenant(tenant.ID); got.PendingChange != nil {
		t.Fatalf("still pending: %+v", got.PendingChange)
	}
	if n := evalJS[int](t, b, `document.querySelectorAll("#pending-change").length`); n != 0 {
		t.Errorf("a cancelled change is still shown")
	}
}

// TestBrowserDashboardShowsPlansAtPhoneWidth: at phone width the tenant
// sees its quotas per meter with the numbers of /v1/usage, its billing
// period in its zone and its credit balance, without the page overflowing;
// the console's tenant page with its plan forms fits too.
func TestBrowserDashboardShowsPlansAtPhoneWidth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustStack(t)
	tier := s.tier(420, quota.Limits{DailyQuota: quota.Ptr(int64(500))}, func(t *quota.Tier) {
		t.MeterQuotas = []quota.MeterQuota{{Meter: "demo", DailyQuota: quota.Ptr(int64(9)), MonthlyQuota: quota.Ptr(int64(90)), Overage: quota.OverageBlock}}
	})
	tenant, key := s.tenant(tier.Slug)
	if _, err := s.store.UpdateTenant(ctx, "test", tenant.ID, func(t *quota.Tenant) error {
		t.BillingAnchorDay, t.TimeZone = 3, "Pacific/Auckland"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	base := s.start()
	mustStatus(t, do(t, "GET", base+"/api/demo/echo", key, ""), 200)
	mustStatus(t, do(t, "POST", base+"/admin/v1/tenants/"+tenant.ID+"/credits", adminToken, `{"amount_cents": 500, "reason": "trial"}`), 201)
	api := getUsage(t, base, key)

	b := browser(t, phoneW, phoneH)
	if st := signIn(t, b, base, "dashboard", key); st != 200 || location(t, b) != "/dashboard" {
		t.Fatalf("sign-in: %s (%d)", location(t, b), st)
	}
	type row struct {
		Limit     string `json:"limit"`
		Remaining string `json:"remaining"`
		Reset     string `json:"reset"`
	}
	rows := evalJS[map[string]row](t, b, `Object.fromEntries([...document.querySelectorAll("#meter-quotas-table tr[data-limit]")].map(r =>
		[r.dataset.limit, {limit: r.querySelector(".limit").textContent.trim(), remaining: r.querySelector(".remaining").textContent.trim(),
		 reset: r.querySelector("time.reset").getAttribute("datetime")}]))`)
	n := 0
	for _, l := range api.Limits {
		if !strings.HasPrefix(l.Name, "demo.") {
			continue
		}
		n++
		if got, want := rows[l.Name], (row{commas(l.Limit), commas(l.Remaining), l.Reset}); got != want {
			t.Errorf("%s: the dashboard shows %+v, /v1/usage %+v", l.Name, got, want)
		}
	}
	if n != 2 || len(rows) != 2 {
		t.Errorf("meter quota rows %v, /v1/usage has %d", rows, n)
	}
	if got := text(t, b, "#period"); !strings.HasSuffix(got, "(Pacific/Auckland)") || !strings.Contains(got, " 3") {
		t.Errorf("period %q, want from the 3rd, in Pacific/Auckland", got)
	}
	if got := text(t, b, "#credits-balance"); got != "$5.00" {
		t.Errorf("credit balance %q, want $5.00", got)
	}
	checkPage(t, b)
	testenv.Screenshot(t, b, "dashboard")

	a := browser(t, phoneW, phoneH)
	consoleSignIn(t, a, base)
	mustNavigate(t, a, base, "/console/tenants/"+tenant.ID, 200)
	checkPage(t, a)
	mustNavigate(t, a, base, "/console/tiers/"+tier.Slug, 200)
	checkPage(t, a)
}
