package api

import (
	"context"
	"io"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// HTTP tests of the console's plan forms (issue 15, point 7): a tier's
// quotas per meter, a tenant's billing calendar, credits and tier changes
// now or at the next period; and the dashboard's view of them.

// tierFormOf is the tier editor's form for t as the page fills it in: every
// field of the tier and its meter quotas, rows mq-k-*.
func tierFormOf(tok string, t quota.Tier) url.Values {
	i := func(p *int64) string {
		if p == nil {
			return ""
		}
		return strconv.FormatInt(*p, 10)
	}
	f := func(p *float64) string {
		if p == nil {
			return ""
		}
		return strconv.FormatFloat(*p, 'f', -1, 64)
	}
	v := url.Values{"_csrf": {tok}, "name": {t.Name}, "rank": {strconv.Itoa(t.Rank)}, "price_cents": {strconv.FormatInt(t.PriceCents, 10)},
		"burst_rate": {f(t.BurstRate)}, "burst": {i(t.Burst)}, "bucket_capacity": {i(t.BucketCapacity)},
		"bucket_refill_per_sec": {f(t.BucketRefillPerSec)}, "daily_quota": {i(t.DailyQuota)}, "monthly_quota": {i(t.MonthlyQuota)},
		"overage": {string(t.Overage)}, "overage_price_cents_per_1k": {strconv.FormatInt(t.OveragePriceCentsPer1K, 10)},
		"max_overage_cents": {i(t.MaxOverageCents)}, "upgrade_url": {t.UpgradeURL}}
	for k, q := range t.MeterQuotas {
		p := "mq-" + strconv.Itoa(k) + "-"
		v.Set(p+"meter", q.Meter)
		v.Set(p+"daily_quota", i(q.DailyQuota))
		v.Set(p+"monthly_quota", i(q.MonthlyQuota))
		v.Set(p+"overage", string(q.Overage))
		v.Set(p+"overage_price_cents_per_1k", strconv.FormatInt(q.OveragePriceCentsPer1K, 10))
	}
	return v
}

// withRow sets meter quota row k of form v.
func withRow(v url.Values, k int, meter, daily, monthly, overage, price string) url.Values {
	out := url.Values{}
	for key, vals := range v {
		out[key] = append([]string(nil), vals...)
	}
	p := "mq-" + strconv.Itoa(k) + "-"
	out.Set(p+"meter", meter)
	out.Set(p+"daily_quota", daily)
	out.Set(p+"monthly_quota", monthly)
	out.Set(p+"overage", overage)
	out.Set(p+"overage_price_cents_per_1k", price)
	return out
}

func mustRedirect(tb testing.TB, r reply, prefix string) {
	tb.Helper()
	if r.status != 303 || !strings.HasPrefix(r.header.Get("Location"), prefix) {
		tb.Fatalf("status %d to %q, want 303 to %s…: %.2000s", r.status, r.header.Get("Location"), prefix, r.body)
	}
}

// TestConsoleEditsMeterQuotas: the tier editor adds, edits and removes
// quotas per meter through the path PATCH takes (the admin API then serves
// them, /v1/usage has their rows); bad rows, a meter name with a quote
// among them, are refused beside their field with 400 and change nothing.
func TestConsoleEditsMeterQuotas(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(150, quota.Limits{DailyQuota: quota.Ptr(int64(1000)), MonthlyQuota: quota.Ptr(int64(20000))})
	_, key := s.tenant(tier.Slug)
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	path := "/console/tiers/" + tier.Slug
	tok := c.csrf(path)
	page := c.get(path)
	if !strings.Contains(string(page.body), `id="f-mq-0-meter"`) || strings.Contains(string(page.body), `id="f-mq-1-meter"`) {
		t.Fatalf("a tier without meter quotas shows one blank row, mq-0: %s", page.body)
	}

	// Add one.
	form := withRow(tierFormOf(tok, tier), 0, "demo", "3", "50", "bill", "40")
	mustRedirect(t, c.post(path, form.Encode()), "/console/tiers?ok=saved")
	got := s.adminTier(tier.Slug)
	want := []quota.MeterQuota{{Meter: "demo", DailyQuota: quota.Ptr(int64(3)), MonthlyQuota: quota.Ptr(int64(50)),
		Overage: quota.OverageBill, OveragePriceCentsPer1K: 40}}
	if jsonOf(got.MeterQuotas) != jsonOf(want) {
		t.Fatalf("meter quotas after adding: %s, want %s", jsonOf(got.MeterQuotas), jsonOf(want))
	}
	if *got.DailyQuota != 1000 || got.Name != tier.Name {
		t.Errorf("the rest of the tier changed: %+v", got)
	}
	var api quota.Tier
	mustDecode(t, do(t, "GET", base+"/admin/v1/tiers/"+tier.Slug, adminToken, "").body, &api)
	if jsonOf(api.MeterQuotas) != jsonOf(want) {
		t.Errorf("admin API meter_quotas %s, want %s", jsonOf(api.MeterQuotas), jsonOf(want))
	}
	u := getUsage(t, base, key)
	var names []string
	for _, l := range u.Limits {
		names = append(names, l.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "demo.daily,demo.monthly") {
		t.Errorf("/v1/usage limits %v, want demo.daily and demo.monthly", names)
	}
	page = c.get(path)
	if !strings.Contains(string(page.body), `id="f-mq-0-meter" name="mq-0-meter" type="text" value="demo"`) ||
		!strings.Contains(string(page.body), `id="f-mq-1-meter"`) {
		t.Errorf("the editor shows the quota in row 0 and a blank row 1: %s", page.body)
	}

	// Bad rows: each refused beside its field, nothing saved.
	before := auditCount(t, s)
	withTier := tierFormOf(tok, got)
	for _, tc := range []struct {
		form      url.Values
		id, error string
	}{
		{withRow(withTier, 0, `de"mo`, "3", "50", "bill", "40"), "f-mq-0-meter", "must be 1 to 64 of a-z"},
		{withRow(withTier, 0, "demo", "-1", "50", "bill", "40"), "f-mq-0-daily_quota", "between 0 and"},
		{withRow(withTier, 0, "demo", "three", "50", "bill", "40"), "f-mq-0-daily_quota", "whole number"},
		{withRow(withTier, 0, "demo", "3", "", "bill", "40"), "f-mq-0-overage", "monthly_quota"},
		{withRow(withTier, 0, "demo", "3", "50", "bill", "0"), "f-mq-0-overage_price_cents_per_1k", "between 1 and"},
		{withRow(withTier, 0, "demo", "", "", "block", "0"), "f-mq-0-daily_quota", "needs daily_quota, monthly_quota or both"},
		{withRow(withTier, 1, "demo", "4", "", "block", "0"), "f-mq-1-meter", "has a quota already"},
		{withRow(withTier, 0, "demo", "3", "50", "sometimes", "40"), "f-mq-0-overage", `"block" or "bill"`},
	} {
		r := c.post(path, tc.form.Encode())
		if r.status != 400 || !isHTML(r) {
			t.Errorf("%s: status %d, want 400 HTML", tc.id, r.status)
			continue
		}
		if got := fieldErrorOf(r.body, tc.id); !strings.Contains(got, tc.error) {
			t.Errorf("%s: error beside the field %q, want %q", tc.id, got, tc.error)
		}
		if tc.id == "f-mq-0-meter" {
			if !strings.Contains(string(r.body), `value="de&#34;mo"`) || strings.Contains(string(r.body), `de"mo`) {
				t.Errorf("the meter name with a quote is not escaped where it is shown again")
			}
		}
	}
	if r := c.post(path, withRow(withTier, 0, "demo", "3", "50", "bill", "40").Encode()+"&mq-0-remove=yes"); r.status != 400 {
		t.Errorf("remove=yes: %d, want 400", r.status)
	}
	if after := auditCount(t, s); after != before {
		t.Errorf("refused forms changed %d things", after-before)
	}
	if g := s.adminTier(tier.Slug); jsonOf(g.MeterQuotas) != jsonOf(want) {
		t.Errorf("meter quotas after refused forms: %s", jsonOf(g.MeterQuotas))
	}

	// Edit row 0 and add row 1 at once; then remove row 0.
	form = withRow(withRow(withTier, 0, "demo", "", "60", "block", "0"), 1, "search.v2", "10", "", "block", "0")
	mustRedirect(t, c.post(path, form.Encode()), "/console/tiers?ok=saved")
	want = []quota.MeterQuota{{Meter: "demo", MonthlyQuota: quota.Ptr(int64(60)), Overage: quota.OverageBlock},
		{Meter: "search.v2", DailyQuota: quota.Ptr(int64(10)), Overage: quota.OverageBlock}}
	if g := s.adminTier(tier.Slug); jsonOf(g.MeterQuotas) != jsonOf(want) {
		t.Fatalf("meter quotas after editing: %s, want %s", jsonOf(g.MeterQuotas), jsonOf(want))
	}
	form = tierFormOf(tok, s.adminTier(tier.Slug))
	form.Set("mq-0-remove", "on")
	mustRedirect(t, c.post(path, form.Encode()), "/console/tiers?ok=saved")
	if g := s.adminTier(tier.Slug); jsonOf(g.MeterQuotas) != jsonOf(want[1:]) {
		t.Fatalf("meter quotas after removing demo: %s, want %s", jsonOf(g.MeterQuotas), jsonOf(want[1:]))
	}

	// Saving the tier's other fields keeps its meter quotas (the form carries them).
	form = tierFormOf(tok, s.adminTier(tier.Slug))
	form.Set("daily_quota", "1200")
	mustRedirect(t, c.post(path, form.Encode()), "/console/tiers?ok=saved")
	if g := s.adminTier(tier.Slug); *g.DailyQuota != 1200 || len(g.MeterQuotas) != 1 {
		t.Errorf("after editing the daily quota: %d, %s", *g.DailyQuota, jsonOf(g.MeterQuotas))
	}

	// A new tier with a meter quota.
	form = withRow(tierFormOf(tok, quota.Tier{Name: "New", Rank: 151, Overage: quota.OverageBlock}), 0, "demo", "5", "", "block", "0")
	slug := "mq-" + testenv.RandomHex(3)
	form.Set("slug", slug)
	mustRedirect(t, c.post("/console/tiers", form.Encode()), "/console/tiers?ok=created")
	if g := s.adminTier(slug); len(g.MeterQuotas) != 1 || *g.MeterQuotas[0].DailyQuota != 5 {
		t.Errorf("created tier's meter quotas %s", jsonOf(g.MeterQuotas))
	}
}

// TestConsoleEditsTheBillingCalendar: the anchor day and time zone are
// saved as PATCH saves them and the period is shown in the zone; a bad
// value, a path for a zone among them, is refused beside its field.
func TestConsoleEditsTheBillingCalendar(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tenant, _ := s.tenant("free")
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	path := "/console/tenants/" + tenant.ID
	tok := c.csrf(path)
	before := auditCount(t, s)
	for _, tc := range []struct{ day, zone, id, error string }{
		{"15", "../../etc/passwd", "f-time_zone", "IANA time zone name"},
		{"15", "Mars/Olympus_Mons", "f-time_zone", "unknown time zone"},
		{"15", "Local", "f-time_zone", "IANA"},
		{"15", "", "f-time_zone", "is required"},
		{"29", "UTC", "f-billing_anchor_day", "between 1 and 28"},
		{"0", "UTC", "f-billing_anchor_day", "between 1 and 28"},
		{"1; DROP TABLE tenants", "UTC", "f-billing_anchor_day", "whole number"},
	} {
		r := c.post(path+"/calendar", url.Values{"_csrf": {tok}, "billing_anchor_day": {tc.day}, "time_zone": {tc.zone}}.Encode())
		if r.status != 400 || !isHTML(r) {
			t.Errorf("%q %q: %d, want 400 HTML", tc.day, tc.zone, r.status)
			continue
		}
		if got := fieldErrorOf(r.body, tc.id); !strings.Contains(got, tc.error) {
			t.Errorf("%q %q: error beside %s %q, want %q", tc.day, tc.zone, tc.id, got, tc.error)
		}
	}
	if after := auditCount(t, s); after != before {
		t.Errorf("refused calendars changed %d things", after-before)
	}
	mustRedirect(t, c.post(path+"/calendar", url.Values{"_csrf": {tok}, "billing_anchor_day": {"15"}, "time_zone": {"America/New_York"}}.Encode()),
		path+"?ok=calendar")
	var got quota.Tenant
	mustDecode(t, do(t, "GET", base+"/admin/v1/tenants/"+tenant.ID, adminToken, "").body, &got)
	if got.BillingAnchorDay != 15 || got.TimeZone != "America/New_York" {
		t.Fatalf("admin API after the save: anchor %d, zone %q", got.BillingAnchorDay, got.TimeZone)
	}
	loc, _ := time.LoadLocation("America/New_York")
	start, end := quota.Calendar{AnchorDay: 15, Zone: loc}.Period(time.Now())
	label := start.In(loc).Format("Jan 2") + " – " + end.In(loc).Format("Jan 2, 2006") + " (America/New_York)"
	if start.In(loc).Year() != end.In(loc).Year() {
		label = start.In(loc).Format("Jan 2, 2006") + " – " + end.In(loc).Format("Jan 2, 2006") + " (America/New_York)"
	}
	page := string(c.get(path).body)
	if !strings.Contains(page, `<strong id="billing-period">`+label+`</strong>`) {
		t.Errorf("the tenant page does not show the period %q", label)
	}
	if !strings.Contains(page, `value="America/New_York"`) || !strings.Contains(page, `name="billing_anchor_day" type="text" value="15"`) {
		t.Errorf("the calendar form does not show the saved values")
	}
}

type creditLedger struct {
	Items []struct {
		Kind        string     `json:"kind"`
		AmountCents int64      `json:"amount_cents"`
		Reason      string     `json:"reason"`
		ExpiresAt   *time.Time `json:"expires_at"`
	} `json:"items"`
	BalanceCents int64 `json:"balance_cents"`
}

func credits(tb testing.TB, base, id string) creditLedger {
	tb.Helper()
	var l creditLedger
	mustDecode(tb, do(tb, "GET", base+"/admin/v1/tenants/"+id+"/credits", adminToken, "").body, &l)
	return l
}

// TestConsoleAddsCredits: a credit in dollars is recorded in cents, listed
// with the balance (as the admin API lists it) and escaped; a form sent
// twice records it once; a negative, a fraction of a cent, a past expiry
// are refused beside their field.
func TestConsoleAddsCredits(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tenant, key := s.tenant("free")
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	path := "/console/tenants/" + tenant.ID
	tok := c.csrf(path)
	before := auditCount(t, s)
	past := time.Now().UTC().AddDate(0, 0, -1).Format(time.DateOnly)
	for _, tc := range []struct{ amount, reason, expires, id, error string }{
		{"-5", "refund", "", "f-amount", "positive amount"},
		{"0", "refund", "", "f-amount", "at least $0.01"},
		{"0.00", "refund", "", "f-amount", "at least $0.01"},
		{"2.555", "refund", "", "f-amount", "two decimals"},
		{"ten", "refund", "", "f-amount", "positive amount"},
		{"", "refund", "", "f-amount", "is required"},
		{"99999999999999", "refund", "", "f-amount", "at most"},
		{"5", "   ", "", "f-reason", "is required"},
		{"5", strings.Repeat("r", 201), "", "f-reason", "1 to 200"},
		{"5", "refund", past, "f-expires_on", "in the future"},
		{"5", "refund", "31/12/2030", "f-expires_on", "a date such as"},
	} {
		r := c.post(path+"/credits", url.Values{"_csrf": {tok}, "amount": {tc.amount}, "reason": {tc.reason}, "expires_on": {tc.expires}}.Encode())
		if r.status != 400 || !isHTML(r) {
			t.Errorf("%q: %d, want 400 HTML", tc.amount, r.status)
			continue
		}
		if got := fieldErrorOf(r.body, tc.id); !strings.Contains(got, tc.error) {
			t.Errorf("%q %q %q: error beside %s %q, want %q", tc.amount, tc.reason, tc.expires, tc.id, got, tc.error)
		}
	}
	if after := auditCount(t, s); after != before {
		t.Errorf("refused credits changed %d things", after-before)
	}
	if l := credits(t, base, tenant.ID); len(l.Items) != 0 {
		t.Fatalf("refused credits recorded: %+v", l)
	}

	// One credit, sent twice with the same form: recorded once.
	idem := strings.Repeat("ab", 16)
	exp := time.Now().UTC().AddDate(1, 0, 0).Format(time.DateOnly)
	form := url.Values{"_csrf": {tok}, "amount": {"$1,025.50"}, "reason": {`<script>alert("x")</script>`}, "expires_on": {exp}, "idempotency_key": {idem}}
	for range 2 {
		mustRedirect(t, c.post(path+"/credits", form.Encode()), path+"?ok=credited")
	}
	// The same form sent again with another amount (the back button): refused, and drawn with a new key.
	other := url.Values{"_csrf": {tok}, "amount": {"3"}, "reason": {"other"}, "idempotency_key": {idem}}
	r := c.post(path+"/credits", other.Encode())
	if r.status != 400 || !strings.Contains(string(r.body), "the key was used for another credit") || strings.Contains(string(r.body), `value="`+idem+`"`) {
		t.Errorf("another credit under a used key: %d, want 400 with the reason and a new key", r.status)
	}
	mustRedirect(t, c.post(path+"/credits", url.Values{"_csrf": {tok}, "amount": {"7"}, "reason": {"goodwill"}}.Encode()), path+"?ok=credited")
	l := credits(t, base, tenant.ID)
	if len(l.Items) != 2 || l.BalanceCents != 102550+700 {
		t.Fatalf("ledger %+v, want two credits and a balance of 103250", l)
	}
	var found bool
	for _, it := range l.Items {
		if it.AmountCents == 102550 {
			found = true
			if it.ExpiresAt == nil || it.ExpiresAt.Format(time.DateOnly) != exp || it.Reason != `<script>alert("x")</script>` {
				t.Errorf("credit %+v, want expiry %s and the reason as typed", it, exp)
			}
		}
	}
	if !found {
		t.Errorf("no credit of 102550 cents: %+v", l)
	}
	page := string(c.get(path).body)
	if !strings.Contains(page, `<strong id="credit-balance">$1,032.50</strong>`) {
		t.Errorf("the page does not show the balance $1,032.50")
	}
	if strings.Contains(page, `<script>alert`) || !strings.Contains(page, `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;`) {
		t.Errorf("the reason is not escaped on the page")
	}
	// The tenant sees the balance too.
	tc := newWebClient(t, base)
	tc.mustSignIn("dashboard", key)
	if d := string(tc.get("/dashboard").body); !strings.Contains(d, `<dd id="credits-balance">$1,032.50</dd>`) {
		t.Errorf("the dashboard does not show the balance")
	}
}

// TestConsoleChangesPlans: a change for the next period is pending (shown,
// the tier unchanged) and can be cancelled; a change now applies at once;
// a bad effective or quota, or an unknown tier, changes nothing.
func TestConsoleChangesPlans(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	small := s.tier(300, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	big := s.tier(301, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	tenant, key := s.tenant(small.Slug)
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	path := "/console/tenants/" + tenant.ID
	tok := c.csrf(path)
	stored := func() quota.Tenant {
		var got quota.Tenant
		mustDecode(t, do(t, "GET", base+"/admin/v1/tenants/"+tenant.ID, adminToken, "").body, &got)
		return got
	}
	before := auditCount(t, s)
	for _, tc := range []struct{ form, id, error string }{
		{"tier=" + big.Slug + "&effective=later&quota=carry", "change-effective", `"now" or "next_period"`},
		{"tier=" + big.Slug + "&effective=now&quota=forget", "change-quota", `"carry" or "reset"`},
		{"tier=no-such&effective=next_period&quota=carry", "change-tier", "no tier"},
		{"tier=" + big.Slug + "%22%3E%3Cb%3E&effective=now&quota=carry", "change-tier", "no tier"},
	} {
		r := c.post(path+"/tier", "_csrf="+tok+"&"+tc.form)
		if r.status != 400 || !isHTML(r) {
			t.Errorf("%s: %d, want 400", tc.form, r.status)
			continue
		}
		if got := fieldErrorOf(r.body, tc.id); !strings.Contains(got, tc.error) {
			t.Errorf("%s: error beside %s %q, want %q", tc.form, tc.id, got, tc.error)
		}
		if strings.Contains(string(r.body), `"><b>`) {
			t.Errorf("%s: the tier as typed is not escaped", tc.form)
		}
	}
	if after := auditCount(t, s); after != before {
		t.Errorf("refused changes changed %d things", after-before)
	}

	// At the next period: pending, shown, the tier unchanged.
	mustRedirect(t, c.post(path+"/tier", "_csrf="+tok+"&tier="+big.Slug+"&effective=next_period&quota=reset"), path+"?ok=plan-pending")
	got := stored()
	if got.Tier != small.Slug || got.PendingChange == nil || got.PendingChange.Tier != big.Slug || got.PendingChange.Quota != quota.QuotaReset {
		t.Fatalf("after a change at the next period: tier %q, pending %+v", got.Tier, got.PendingChange)
	}
	page := string(c.get(path).body)
	at := got.PendingChange.EffectiveAt.UTC().Format(time.RFC3339)
	if !strings.Contains(page, `id="pending-change" data-tier="`+big.Slug+`"`) || !strings.Contains(page, `datetime="`+at+`"`) ||
		!strings.Contains(page, `<span class="pending-quota">reset</span>`) {
		t.Errorf("the page does not show the pending change to %s at %s", big.Slug, at)
	}
	d := newWebClient(t, base)
	d.mustSignIn("dashboard", key)
	wantPending := `<dd id="pending-plan">To ` + big.Name + ` from ` + got.PendingChange.EffectiveAt.UTC().Format("Jan 2, 2006 15:04") + ` (UTC)</dd>`
	if page := string(d.get("/dashboard").body); !strings.Contains(page, wantPending) {
		t.Errorf("the dashboard does not show %s", wantPending)
	}
	// Cancelled.
	mustRedirect(t, c.post(path+"/plan/cancel", "_csrf="+tok), path+"?ok=plan-cancelled")
	if page := string(d.get("/dashboard").body); strings.Contains(page, `id="pending-plan"`) {
		t.Errorf("the dashboard still shows a cancelled change")
	}
	if got := stored(); got.PendingChange != nil || got.Tier != small.Slug {
		t.Fatalf("after cancelling: tier %q, pending %+v", got.Tier, got.PendingChange)
	}
	if page := string(c.get(path).body); strings.Contains(page, `id="pending-change"`) || strings.Contains(page, `id="cancel-plan"`) {
		t.Errorf("a cancelled change is still shown")
	}
	// Now.
	mustRedirect(t, c.post(path+"/tier", "_csrf="+tok+"&tier="+big.Slug+"&effective=now&quota=carry"), path+"?ok=tier")
	if got := stored(); got.Tier != big.Slug || got.PendingChange != nil {
		t.Fatalf("after a change now: tier %q, pending %+v", got.Tier, got.PendingChange)
	}
	// Now, with the usage reset: the day's quota is whole again.
	for range 3 {
		mustStatus(t, do(t, "GET", base+"/api/demo/echo", key, ""), 200)
	}
	daily := func() int64 {
		for _, l := range getUsage(t, base, key).Limits {
			if l.Name == "daily" {
				return l.Remaining
			}
		}
		t.Fatal("no daily limit in /v1/usage")
		return 0
	}
	if got := daily(); got != 997 {
		t.Fatalf("the premise: daily remaining %d, want 997", got)
	}
	mustRedirect(t, c.post(path+"/tier", "_csrf="+tok+"&tier="+small.Slug+"&effective=now&quota=reset"), path+"?ok=tier-reset")
	if got := stored(); got.Tier != small.Slug {
		t.Fatalf("after a change now with reset: tier %q", got.Tier)
	}
	if got := daily(); got != 100 {
		t.Errorf("daily remaining after the reset %d, want 100 (the small tier's whole quota)", got)
	}
	audit := string(do(t, "GET", base+"/admin/v1/audit?entity=tenant&entity_id="+tenant.ID, adminToken, "").body)
	if strings.Count(audit, `"actor":"console"`) < 4 {
		t.Errorf("the audit log has not the console's four changes: %s", audit)
	}
}

// TestDashboardShowsPlans: the tenant's dashboard shows its quotas per
// meter with the numbers of /v1/usage, its credit balance, its spend cap
// and the month's overage so far, and its billing period in its zone.
func TestDashboardShowsPlans(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	if quota.DayStart(now).AddDate(0, 0, 1).Sub(now) < 2*time.Minute {
		t.Skip("too close to midnight UTC: the daily quota would roll over during the test")
	}
	ctx := context.Background()
	s := mustStack(t)
	tier := s.tier(400, quota.Limits{MonthlyQuota: quota.Ptr(int64(100000)), MaxOverageCents: quota.Ptr(int64(2500))}, func(t *quota.Tier) {
		t.Overage, t.OveragePriceCentsPer1K = quota.OverageBill, 10
		t.MeterQuotas = []quota.MeterQuota{{Meter: "demo", DailyQuota: quota.Ptr(int64(7)), MonthlyQuota: quota.Ptr(int64(70)), Overage: quota.OverageBlock}}
	})
	tenant, key := s.tenant(tier.Slug)
	if _, err := s.store.UpdateTenant(ctx, "test", tenant.ID, func(t *quota.Tenant) error {
		t.BillingAnchorDay, t.TimeZone = 15, "America/New_York"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	base := s.start()
	for range 2 {
		mustStatus(t, do(t, "GET", base+"/api/demo/echo", key, ""), 200)
	}
	mustStatus(t, do(t, "POST", base+"/admin/v1/tenants/"+tenant.ID+"/credits", adminToken, `{"amount_cents": 1234, "reason": "welcome"}`), 201)
	api := getUsage(t, base, key)
	c := newWebClient(t, base)
	c.mustSignIn("dashboard", key)
	page := string(c.get("/dashboard").body)
	for _, l := range api.Limits {
		if !strings.HasPrefix(l.Name, "demo.") {
			continue
		}
		row := `<tr data-limit="` + l.Name + `"><th scope="row"><code>` + l.Name + `</code></th><td class="limit">` + commas(l.Limit) +
			`</td><td class="used">` + commas(l.Limit-l.Remaining) + `</td><td class="remaining">` + commas(l.Remaining) + `</td><td><time class="reset" datetime="` + l.Reset + `">`
		if !strings.Contains(page, row) {
			t.Errorf("the dashboard has no row %s", row)
		}
	}
	var names []string
	for _, l := range api.Limits {
		names = append(names, l.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "demo.daily") {
		t.Fatalf("the premise: /v1/usage has no demo.daily: %v", names)
	}
	loc, _ := time.LoadLocation("America/New_York")
	start, end := quota.Calendar{AnchorDay: 15, Zone: loc}.Period(time.Now())
	wantPeriod := start.In(loc).Format("Jan 2") + " – " + end.In(loc).Format("Jan 2, 2006") + " (America/New_York)"
	if start.In(loc).Year() != end.In(loc).Year() {
		wantPeriod = start.In(loc).Format("Jan 2, 2006") + " – " + end.In(loc).Format("Jan 2, 2006") + " (America/New_York)"
	}
	for _, want := range []string{
		`">` + wantPeriod + `</dd>`,
		`<dd id="credits-balance">$12.34</dd>`,
		`<dd id="spend-cap">$25.00 of overage a month</dd>`,
		`<dd id="overage-so-far">$0.00`,
		`id="billing-note"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the dashboard does not show %s", want)
		}
	}
}

// storedTenant reads the tenant from the store.
func (s *stack) storedTenant(id string) quota.Tenant {
	s.tb.Helper()
	ts, err := s.store.TenantsByID(context.Background(), []string{id})
	if err != nil || len(ts) != 1 {
		s.tb.Fatalf("tenant %s: %v %v", id, ts, err)
	}
	return ts[0]
}

// TestDashboardShowsOverageAgainstTheCap: once the worker has drawn the
// month's draft invoice, the dashboard shows its overage against the spend
// cap, the override's cap over the tier's.
func TestDashboardShowsOverageAgainstTheCap(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	if quota.MonthStart(now).AddDate(0, 1, 0).Sub(now) < 5*time.Minute {
		t.Skip("too close to the end of the month: the invoice would be another month's")
	}
	ctx := context.Background()
	s := mustStack(t)
	tier := s.tier(410, quota.Limits{MonthlyQuota: quota.Ptr(int64(3)), MaxOverageCents: quota.Ptr(int64(500))}, func(t *quota.Tier) {
		t.Overage, t.OveragePriceCentsPer1K = quota.OverageBill, 1000 // a cent a unit
	})
	tenant, key := s.tenant(tier.Slug)
	if _, err := s.store.UpdateTenant(ctx, "test", tenant.ID, func(t *quota.Tenant) error {
		t.Overrides.MaxOverageCents = quota.Set(quota.Ptr(int64(700)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	base := s.start()
	for range 8 {
		mustStatus(t, do(t, "GET", base+"/api/demo/echo", key, ""), 200)
	}
	c := newWebClient(t, base)
	c.mustSignIn("dashboard", key)
	if page := string(c.get("/dashboard").body); !strings.Contains(page, `<dd id="overage-so-far">$0.00</dd>`) {
		t.Errorf("before any draft: the dashboard does not show $0.00 of overage")
	}
	rec := billing.NewReconciler(s.pool, quotaredis.New(testenv.Redis(t), s.prefix), time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := billing.NewInvoicer(s.pool, time.Now, 48*time.Hour).Run(ctx); err != nil {
		t.Fatal(err)
	}
	page := string(c.get("/dashboard").body)
	for _, want := range []string{`<dd id="overage-so-far">$0.05 of $7.00</dd>`, `<dd id="spend-cap">$7.00 of overage a month</dd>`, "as of "} {
		if !strings.Contains(page, want) {
			t.Errorf("the dashboard does not show %s", want)
		}
	}
}

// TestConsoleOverridesTheSpendCap: the tenant's own cap, no cap, and back to
// the tier's, as overrides.max_overage_cents of the admin API; a negative
// cap or an unknown choice is refused beside its field and changes nothing.
func TestConsoleOverridesTheSpendCap(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	tier := s.tier(430, quota.Limits{MonthlyQuota: quota.Ptr(int64(100)), MaxOverageCents: quota.Ptr(int64(900))}, func(t *quota.Tier) {
		t.Overage, t.OveragePriceCentsPer1K = quota.OverageBill, 100
	})
	tenant, key := s.tenant(tier.Slug)
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	path := "/console/tenants/" + tenant.ID
	tok := c.csrf(path)
	override := func() string {
		var raw struct {
			Overrides map[string]any `json:"overrides"`
		}
		mustDecode(t, do(t, "GET", base+"/admin/v1/tenants/"+tenant.ID, adminToken, "").body, &raw)
		v, ok := raw.Overrides["max_overage_cents"]
		if !ok {
			return "absent"
		}
		return jsonOf(v)
	}
	before := auditCount(t, s)
	for _, tc := range []struct{ form, id, error string }{
		{"spend_cap=cap&max_overage_cents=-1", "f-max_overage_cents", "between 0 and"},
		{"spend_cap=cap&max_overage_cents=", "f-max_overage_cents", "is required"},
		{"spend_cap=cap&max_overage_cents=1e9", "f-max_overage_cents", "whole number"},
		{"spend_cap=%3Cscript%3E", "f-spend_cap", `"tier", "none" or "cap"`},
	} {
		r := c.post(path+"/spend-cap", "_csrf="+tok+"&"+tc.form)
		if r.status != 400 || !isHTML(r) {
			t.Errorf("%s: %d, want 400", tc.form, r.status)
			continue
		}
		if got := fieldErrorOf(r.body, tc.id); !strings.Contains(got, tc.error) {
			t.Errorf("%s: error beside %s %q, want %q", tc.form, tc.id, got, tc.error)
		}
	}
	if after := auditCount(t, s); after != before || override() != "absent" {
		t.Errorf("refused caps changed %d things; override %s", after-before, override())
	}
	for _, tc := range []struct{ form, want, shown string }{
		{"spend_cap=cap&max_overage_cents=2,500", "2500", "$25.00"},
		{"spend_cap=none", "null", "no cap"},
		{"spend_cap=tier", "absent", "$9.00"},
	} {
		mustRedirect(t, c.post(path+"/spend-cap", "_csrf="+tok+"&"+tc.form), path+"?ok=spend-cap")
		if got := override(); got != tc.want {
			t.Errorf("%s: override %s, want %s", tc.form, got, tc.want)
		}
		if page := string(c.get(path).body); !strings.Contains(page, `<strong id="tenant-spend-cap">`+tc.shown+`</strong>`) {
			t.Errorf("%s: the page does not show the cap %s", tc.form, tc.shown)
		}
		d := newWebClient(t, base)
		d.mustSignIn("dashboard", key)
		want := `<dd id="spend-cap">` + tc.shown + ` of overage a month</dd>`
		if tc.shown == "no cap" {
			want = `<dd id="spend-cap">none</dd>`
		}
		if page := string(d.get("/dashboard").body); !strings.Contains(page, want) {
			t.Errorf("%s: the dashboard does not show %s", tc.form, want)
		}
	}
}
