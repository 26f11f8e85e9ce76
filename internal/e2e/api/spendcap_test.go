package api

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// spendCapTier is a bill tier of 100 units a month at 1000 cents per 1,000
// units past them (a cent a unit), capped at 40 cents.
func spendCapTier(slug string) string {
	return `{"slug": "` + slug + `", "name": "Capped", "rank": 77, "price_cents": 0, "burst_rate": null, "burst": null,
	"bucket_capacity": null, "bucket_refill_per_sec": null, "daily_quota": null, "monthly_quota": 100,
	"overage": "bill", "overage_price_cents_per_1k": 1000, "fail_open": false, "upgrade_url": "", "max_overage_cents": 40}`
}

// TestSpendCapThroughTwoInstances: a bill tier's spend cap, set and changed
// through the admin API, holds exactly through two API instances under
// concurrency: 100 units of quota and 50 of overage (a cap of 50 cents at a
// cent a unit), then 429s naming spend_cap with Retry-After to the month's
// end. A tenant's override raises it; the invoice bills the capped overage.
func TestSpendCapThroughTwoInstances(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	monthEnd := quota.MonthStart(now).AddDate(0, 1, 0)
	if monthEnd.Sub(now) < 2*time.Minute {
		t.Skip("too close to the month's end: the quota would roll over during the test")
	}
	s := mustStack(t)
	bases := []string{s.start(), s.start()}
	slug := "capped-" + testenv.RandomHex(3)
	r := admin(t, "POST", bases[0]+"/admin/v1/tiers", spendCapTier(slug))
	if r.status != 201 || r.json(t)["max_overage_cents"] != 40.0 {
		t.Fatalf("create: %d %s, want 201 with max_overage_cents 40", r.status, r.body)
	}
	if r := admin(t, "PATCH", bases[0]+"/admin/v1/tiers/"+slug, `{"max_overage_cents": 50}`); r.status != 200 || r.json(t)["max_overage_cents"] != 50.0 {
		t.Fatalf("patch: %d %s, want max_overage_cents 50", r.status, r.body)
	}
	tenant, key := s.tenant(slug)

	var admitted atomic.Int64
	var mu sync.Mutex
	var refusals []reply
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			base := bases[i%2]
			for range 20 {
				switch r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status {
				case 200:
					admitted.Add(1)
				case 429:
					mu.Lock()
					refusals = append(refusals, r)
					mu.Unlock()
				default:
					t.Errorf("status %d: %s", r.status, r.body)
				}
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 150 || len(refusals) != 170 {
		t.Fatalf("admitted %d, refused %d of 320; want exactly 150 (100 of quota, 50 of overage) and 170", admitted.Load(), len(refusals))
	}
	for _, r := range refusals {
		p := r.json(t)
		if v, _ := p["violated-policies"].([]any); len(v) != 1 || v[0] != "spend_cap" {
			t.Fatalf("violated-policies = %v, want [spend_cap]: %s", p["violated-policies"], r.body)
		}
		ra, err := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
		left := int64(time.Until(monthEnd).Seconds())
		if err != nil || p["retry_after"] != float64(ra) || ra < left || ra > left+60 {
			t.Fatalf("Retry-After %q, retry_after %v; want the %d s to the month's end", r.header.Get("Retry-After"), p["retry_after"], left)
		}
	}

	// The tenant's own cap, 60 cents: 10 more units, then refused again.
	if r := admin(t, "PATCH", bases[0]+"/admin/v1/tenants/"+tenant.ID, `{"overrides": {"max_overage_cents": 60}}`); r.status != 200 {
		t.Fatalf("tenant patch: %d %s", r.status, r.body)
	}
	more, deadline := 0, time.Now().Add(3*time.Second)
	for {
		r := do(t, "GET", bases[0]+"/api/demo/echo", key, "")
		if r.status == 200 {
			more++
			continue
		}
		if r.status != 429 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if more > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the change on its way to the node
	}
	if more != 10 {
		t.Fatalf("after raising the tenant's cap to 60 cents: %d more admitted, want 10", more)
	}
	if r := do(t, "GET", bases[1]+"/api/demo/echo", key, ""); r.status != 429 {
		t.Fatalf("the other instance: status %d, want 429", r.status)
	}
	// /v1/usage shows the cap and what is left of it, in cents: none
	var capRow map[string]any
	for _, l := range do(t, "GET", bases[1]+"/v1/usage", key, "").json(t)["limits"].([]any) {
		if l.(map[string]any)["name"] == "spend_cap" {
			capRow = l.(map[string]any)
		}
	}
	if capRow == nil || capRow["limit"] != 60.0 || capRow["remaining"] != 0.0 {
		t.Fatalf("/v1/usage spend_cap row %v, want limit 60 and remaining 0", capRow)
	}

	// The invoice bills the overage admitted: 60 units at a cent, 60 cents.
	ctx := context.Background()
	s.flushAndInvoice()
	var qty, amount int64
	err := s.pool.QueryRow(ctx, `SELECT l.quantity, l.amount_cents FROM invoice_lines l JOIN invoices i ON i.id = l.invoice_id
		WHERE i.tenant_id = $1 AND i.period = $2 AND l.kind = 'overage'`, tenant.ID, quota.MonthStart(now)).Scan(&qty, &amount)
	if err != nil || qty != 60 || amount != 60 {
		t.Fatalf("overage line: %d units, %d cents (%v); want 60 and 60", qty, amount, err)
	}
}

// TestSpendCapValidation: 400s naming max_overage_cents, on a tier (out of
// range, or set on a block tier) and on a tenant's overrides.
func TestSpendCapValidation(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	rank := 100_000 + rand.IntN(800_000) // ranks are unique
	for _, tc := range []struct{ patch string }{
		{`"max_overage_cents": -1`},
		{`"max_overage_cents": 1099511627777`},
		{`"max_overage_cents": "lots"`},
		{`"overage": "block", "overage_price_cents_per_1k": 0, "max_overage_cents": 5`},
	} {
		rank++
		body := strings.Replace(spendCapTier("c-"+testenv.RandomHex(3)), `"max_overage_cents": 40`, tc.patch, 1)
		body = strings.Replace(body, `"rank": 77`, `"rank": `+strconv.Itoa(rank), 1)
		if strings.Contains(tc.patch, "block") {
			body = strings.Replace(body, `"overage": "bill", "overage_price_cents_per_1k": 1000, `, "", 1)
		}
		r := admin(t, "POST", base+"/admin/v1/tiers", body)
		if r.status != 400 || r.json(t)["field"] != "max_overage_cents" {
			t.Errorf("%s: %d %s, want 400 naming max_overage_cents", tc.patch, r.status, r.body)
		}
	}
	// a bill tier with a cap cannot go to block and keep it
	slug := "c-" + testenv.RandomHex(3)
	if r := admin(t, "POST", base+"/admin/v1/tiers", strings.Replace(spendCapTier(slug), `"rank": 77`, `"rank": `+strconv.Itoa(rank+1), 1)); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	r := admin(t, "PATCH", base+"/admin/v1/tiers/"+slug, `{"overage": "block", "overage_price_cents_per_1k": 0}`)
	if r.status != 400 || r.json(t)["field"] != "max_overage_cents" {
		t.Errorf("to block with a cap: %d %s, want 400 naming max_overage_cents", r.status, r.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tiers/"+slug, `{"overage": "block", "overage_price_cents_per_1k": 0, "max_overage_cents": null}`); r.status != 200 {
		t.Errorf("to block without a cap: %d %s", r.status, r.body)
	}
	tenant, _ := s.tenant("pro")
	for _, v := range []string{"-1", "1099511627777"} {
		r := admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"overrides": {"max_overage_cents": `+v+`}}`)
		if r.status != 400 || r.json(t)["field"] != "overrides.max_overage_cents" {
			t.Errorf("override %s: %d %s, want 400 naming overrides.max_overage_cents", v, r.status, r.body)
		}
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"overrides": {"max_overage_cents": 0}}`); r.status != 200 ||
		!strings.Contains(string(r.body), `"max_overage_cents":0`) {
		t.Errorf("override 0: %d %s", r.status, r.body)
	}
}

// TestConsoleTierEditorCarriesTheSpendCap: the tier editor shows the cap,
// saves it, clears it when emptied, and shows a bad one beside its field,
// saving nothing.
func TestConsoleTierEditorCarriesTheSpendCap(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	cents := int64(40)
	tier := s.tier(7100, quota.Limits{MonthlyQuota: quota.Ptr(int64(100)), MaxOverageCents: &cents}, func(t *quota.Tier) {
		t.Overage, t.OveragePriceCentsPer1K = quota.OverageBill, 1000
	})
	base := s.start()
	c := newWebClient(t, base)
	c.mustSignIn("console", adminToken)
	path := "/console/tiers/" + tier.Slug
	if r := c.get(path); !strings.Contains(string(r.body), `name="max_overage_cents" type="text" value="40"`) {
		t.Fatalf("the editor does not show the cap of 40 cents:\n%s", r.body)
	}
	form := map[string]string{"name": tier.Name, "rank": strconv.Itoa(tier.Rank), "price_cents": "100", "monthly_quota": "100",
		"overage": "bill", "overage_price_cents_per_1k": "1000", "max_overage_cents": "1,250"}
	if r := c.post(path, policyPageForm(c.csrf(path), form)); r.status != 303 {
		t.Fatalf("save: %d %s", r.status, r.body)
	}
	if got := s.adminTier(tier.Slug).MaxOverageCents; got == nil || *got != 1250 {
		t.Fatalf("after the save: max_overage_cents %v, want 1250", got)
	}
	for _, tc := range []struct{ overage, price, cap, want string }{
		{"bill", "1000", "-3", "must be an integer between 0 and"},
		{"bill", "1000", "some", "must be a whole number"},
		{"block", "0", "10", "must be null when overage is block"},
	} {
		form["overage"], form["overage_price_cents_per_1k"], form["max_overage_cents"] = tc.overage, tc.price, tc.cap
		r := c.post(path, policyPageForm(c.csrf(path), form))
		if got := fieldErrorOf(r.body, "f-max_overage_cents"); r.status != 400 || !strings.Contains(got, tc.want) {
			t.Errorf("%s %q: %d, error %q; want 400 and %q beside the field", tc.overage, tc.cap, r.status, got, tc.want)
		}
		if got := s.adminTier(tier.Slug).MaxOverageCents; got == nil || *got != 1250 {
			t.Fatalf("a bad value changed the tier: %v", got)
		}
	}
	form["overage"], form["overage_price_cents_per_1k"], form["max_overage_cents"] = "bill", "1000", ""
	if r := c.post(path, policyPageForm(c.csrf(path), form)); r.status != 303 {
		t.Fatalf("clear: %d %s", r.status, r.body)
	}
	if got := s.adminTier(tier.Slug).MaxOverageCents; got != nil {
		t.Fatalf("after emptying the field: max_overage_cents %d, want null", *got)
	}
}

// TestSpendCapBindsAMeterWithItsOwnQuota: a bill tier of 10 units a
// month, a cent a unit past them, capped at 5 cents, with a quota of its
// own for the demo meter that bills nothing (1,000 a day, blocked past
// it): of 40 echo calls 15 are admitted (10 of quota, 5 of overage), the
// rest are 429s naming spend_cap, exactly as the same tier without the
// meter quota answers; the invoice bills 5 cents of overage.
func TestSpendCapBindsAMeterWithItsOwnQuota(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	if quota.MonthStart(now).AddDate(0, 1, 0).Sub(now) < 2*time.Minute {
		t.Skip("too close to the month's end: the quota would roll over during the test")
	}
	s := mustStack(t)
	base := s.start()
	tier := func(rank int, meterQuotas string) string {
		slug := "capped-" + testenv.RandomHex(3)
		body := `{"slug": "` + slug + `", "name": "Capped", "rank": ` + strconv.Itoa(rank) + `, "price_cents": 0, "burst_rate": null,
		"burst": null, "bucket_capacity": null, "bucket_refill_per_sec": null, "daily_quota": null, "monthly_quota": 10,
		"overage": "bill", "overage_price_cents_per_1k": 1000, "fail_open": false, "upgrade_url": "", "max_overage_cents": 5,
		"meter_quotas": ` + meterQuotas + `}`
		if r := admin(t, "POST", base+"/admin/v1/tiers", body); r.status != 201 {
			t.Fatalf("create: %d %s", r.status, r.body)
		}
		return slug
	}
	for i, mq := range []string{`[]`, `[{"meter": "demo", "daily_quota": 1000, "monthly_quota": null, "overage": "block", "overage_price_cents_per_1k": 0}]`} {
		tenant, key := s.tenant(tier(78+i, mq))
		admitted := 0
		for range 40 {
			switch r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status {
			case 200:
				admitted++
			case 429:
				if v, _ := r.json(t)["violated-policies"].([]any); len(v) != 1 || v[0] != "spend_cap" {
					t.Fatalf("meter quotas %s: refusal %s, want [spend_cap]", mq, r.body)
				}
			default:
				t.Fatalf("status %d: %s", r.status, r.body)
			}
		}
		if admitted != 15 {
			t.Fatalf("meter quotas %s: %d of 40 admitted, want 15 (10 of quota, 5 cents of overage)", mq, admitted)
		}
		s.flushAndInvoice()
		var qty, amount int64
		err := s.pool.QueryRow(context.Background(), `SELECT l.quantity, l.amount_cents FROM invoice_lines l JOIN invoices i ON i.id = l.invoice_id
			WHERE i.tenant_id = $1 AND i.period = $2 AND l.kind = 'overage'`, tenant.ID, quota.MonthStart(now)).Scan(&qty, &amount)
		if err != nil || qty != 5 || amount != 5 {
			t.Fatalf("meter quotas %s: overage line %d units, %d cents (%v); want 5 and 5", mq, qty, amount, err)
		}
	}
}

// TestQuotaResetKeepsTheSpendCap: a tier change with quota "reset" gives
// the tenant a fresh quota, not a fresh spend cap. On a tier of 10 units a
// month, a cent a unit past them, capped at 5 cents, 15 of 20 calls are
// admitted; moved to another such tier with a reset, 10 more fit the
// quota and the next are refused naming spend_cap: the month's invoice
// bills 5 cents of overage, never more than the cap.
func TestQuotaResetKeepsTheSpendCap(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	if quota.MonthStart(now).AddDate(0, 1, 0).Sub(now) < 2*time.Minute {
		t.Skip("too close to the month's end: the quota would roll over during the test")
	}
	s := mustStack(t)
	base := s.start()
	capped := func(rank int) quota.Tier {
		return s.tier(rank, quota.Limits{MonthlyQuota: quota.Ptr(int64(10)), MaxOverageCents: quota.Ptr(int64(5))}, func(t *quota.Tier) {
			t.Overage, t.OveragePriceCentsPer1K = quota.OverageBill, 1000
		})
	}
	from, to := capped(8201), capped(8202)
	tenant, key := s.tenant(from.Slug)
	calls := func(n int) (admitted int) {
		t.Helper()
		for range n {
			switch r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status {
			case 200:
				admitted++
			case 429:
				if v, _ := r.json(t)["violated-policies"].([]any); len(v) != 1 || v[0] != "spend_cap" {
					t.Fatalf("refusal %s, want [spend_cap]", r.body)
				}
			default:
				t.Fatalf("status %d: %s", r.status, r.body)
			}
		}
		return admitted
	}
	if n := calls(20); n != 15 {
		t.Fatalf("before the change: %d of 20 admitted, want 15", n)
	}
	r := admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"tier": "`+to.Slug+`", "quota": "reset"}`)
	if r.status != 200 || r.header.Get("Tollgate-Quota-Reset") != "applied" {
		t.Fatalf("change with reset: %d %s, Tollgate-Quota-Reset %q", r.status, r.body, r.header.Get("Tollgate-Quota-Reset"))
	}
	if n := calls(20); n != 10 {
		t.Fatalf("after the reset: %d of 20 admitted, want 10 (a fresh quota, the cap spent)", n)
	}
	s.flushAndInvoice()
	var qty, amount int64
	err := s.pool.QueryRow(context.Background(), `SELECT sum(l.quantity), sum(l.amount_cents) FROM invoice_lines l JOIN invoices i ON i.id = l.invoice_id
		WHERE i.tenant_id = $1 AND i.period = $2 AND l.kind = 'overage'`, tenant.ID, quota.MonthStart(now)).Scan(&qty, &amount)
	if err != nil || qty != 5 || amount != 5 {
		t.Fatalf("overage lines: %d units, %d cents (%v); want 5 and 5", qty, amount, err)
	}
}
