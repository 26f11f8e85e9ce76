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

const topUpURL = "https://billing.example.com/top-up"

// prepaidTier is a prepaid tier of 10 included units a month, then a cent
// a unit paid from the tenant's credit.
func prepaidTier(slug string, rank int) string {
	return `{"slug": "` + slug + `", "name": "Pay as you go", "rank": ` + strconv.Itoa(rank) + `, "price_cents": 0,
	"monthly_quota": 10, "overage": "bill", "overage_price_cents_per_1k": 1000,
	"billing": "prepaid", "top_up_url": "` + topUpURL + `"}`
}

// TestPrepaidThroughTwoInstances: a prepaid tier made through the admin
// API admits its included units, then only what the tenant's credit
// covers: with none, 402 credit-exhausted naming the top-up URL; a credit
// granted on one instance is seen by the other at once; 16 clients on two
// instances spend a 50 cent credit exactly (50 units at a cent), the rest
// 402; /v1/check and /v1/usage say so; the invoice bills the 50 units and
// its credit line pays them, to the cent.
func TestPrepaidThroughTwoInstances(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	if quota.MonthStart(now).AddDate(0, 1, 0).Sub(now) < 2*time.Minute {
		t.Skip("too close to the month's end: the period would roll over during the test")
	}
	s := mustStack(t)
	bases := []string{s.start(), s.start()}
	slug := "pp-" + testenv.RandomHex(3)
	r := admin(t, "POST", bases[0]+"/admin/v1/tiers", prepaidTier(slug, 100_000+rand.IntN(800_000)))
	if r.status != 201 || r.json(t)["billing"] != "prepaid" || r.json(t)["top_up_url"] != topUpURL {
		t.Fatalf("create: %d %s, want 201 with billing prepaid and the top-up URL", r.status, r.body)
	}
	tenant, key := s.tenant(slug)

	// the included units, then 402 on both instances
	for i := range 10 {
		if r := do(t, "GET", bases[i%2]+"/api/demo/echo", key, ""); r.status != 200 {
			t.Fatalf("included unit %d: %d %s", i+1, r.status, r.body)
		}
	}
	for _, base := range bases {
		r := do(t, "GET", base+"/api/demo/echo", key, "")
		p := r.json(t)
		if r.status != 402 || r.header.Get("Content-Type") != "application/problem+json" ||
			p["type"] != "https://tollgate.dev/problems/credit-exhausted" || p["top_up_url"] != topUpURL || p["status"] != 402.0 {
			t.Fatalf("without credit: %d %s %s, want 402 credit-exhausted with the top-up URL", r.status, r.header.Get("Content-Type"), r.body)
		}
		if v, _ := p["violated-policies"].([]any); len(v) != 1 || v[0] != "credit" {
			t.Fatalf("violated-policies %v, want [credit]", p["violated-policies"])
		}
		if ra := r.header.Get("Retry-After"); ra != "" {
			t.Fatalf("Retry-After %q on a 402: no wait brings credit", ra)
		}
	}

	// 50 cents of credit, granted through the first instance
	if r := admin(t, "POST", bases[0]+"/admin/v1/tenants/"+tenant.ID+"/credits", `{"amount_cents": 50, "reason": "top-up"}`); r.status != 201 {
		t.Fatalf("credit: %d %s", r.status, r.body)
	}
	// the second instance hears of it (pub/sub) within moments
	deadline := time.Now().Add(3 * time.Second)
	var admitted atomic.Int64
	for {
		r := do(t, "GET", bases[1]+"/api/demo/echo", key, "")
		if r.status == 200 {
			admitted.Add(1)
			break
		}
		if r.status != 402 || time.Now().After(deadline) {
			t.Fatalf("after the credit: %d %s", r.status, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var mu sync.Mutex
	var statuses = map[int]int{}
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for range 10 {
				r := do(t, "GET", bases[i%2]+"/api/demo/echo", key, "")
				mu.Lock()
				statuses[r.status]++
				mu.Unlock()
				if r.status == 200 {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 50 || statuses[402] != 160-49 || len(statuses) != 2 {
		t.Fatalf("admitted %d with 50 cents at a cent a unit, statuses %v; want exactly 50 and the rest 402", admitted.Load(), statuses)
	}

	// /v1/check refuses for credit, with the URL; /v1/usage's credit row
	c := do(t, "POST", bases[1]+"/v1/check", serviceToken, `{"tenant_id": "`+tenant.ID+`", "meter": "demo", "cost": 1}`).json(t)
	if c["allowed"] != false || c["top_up_url"] != topUpURL {
		t.Fatalf("/v1/check: %v, want refused with the top-up URL", c)
	}
	var credit map[string]any
	for _, l := range do(t, "GET", bases[0]+"/v1/usage", key, "").json(t)["limits"].([]any) {
		if l.(map[string]any)["name"] == "credit" {
			credit = l.(map[string]any)
		}
	}
	if credit == nil || credit["limit"] != 50.0 || credit["remaining"] != 0.0 {
		t.Fatalf("/v1/usage credit row %v, want limit 50 and remaining 0", credit)
	}

	// the invoice: 50 units of overage at a cent, paid by the credit
	ctx := context.Background()
	s.flushAndInvoice()
	rows, err := s.pool.Query(ctx, `SELECT l.kind, l.quantity, l.amount_cents, i.total_cents FROM invoice_lines l JOIN invoices i ON i.id = l.invoice_id
		WHERE i.tenant_id = $1 AND l.kind IN ('overage', 'credit') ORDER BY l.line_no`, tenant.ID)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var kind string
		var qty, amount, total int64
		if err := rows.Scan(&kind, &qty, &amount, &total); err != nil {
			t.Fatal(err)
		}
		got = append(got, kind+" "+strconv.FormatInt(qty, 10)+" "+strconv.FormatInt(amount, 10)+" total "+strconv.FormatInt(total, 10))
	}
	if want := []string{"overage 50 50 total 0", "credit 1 -50 total 0"}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("invoice lines %q, want %q", got, want)
	}
}

// TestPrepaidAfterAMoveHoldsThePostpaidPrice: a tenant on a postpaid plan
// since the month began, moved onto a prepaid tier through the admin API,
// may draw only what the plan's price up to the move (its invoice's
// subscription line) leaves of its credit: its included units, then 25
// cents, then 402; the draft invoice nets to zero.
func TestPrepaidAfterAMoveHoldsThePostpaidPrice(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	month := quota.MonthStart(now)
	if month.AddDate(0, 1, 0).Sub(now) < 2*time.Minute {
		t.Skip("too close to the month's end: the period would roll over during the test")
	}
	s := mustStack(t)
	base := s.start()
	ctx := context.Background()
	rank := 100_000 + rand.IntN(800_000)
	post, pre := "post-"+testenv.RandomHex(3), "pp-"+testenv.RandomHex(3)
	if r := admin(t, "POST", base+"/admin/v1/tiers", `{"slug": "`+post+`", "name": "Monthly", "rank": `+strconv.Itoa(rank)+`,
		"price_cents": 3000, "monthly_quota": 1000, "overage": "block"}`); r.status != 201 {
		t.Fatalf("postpaid tier: %d %s", r.status, r.body)
	}
	if r := admin(t, "POST", base+"/admin/v1/tiers", prepaidTier(pre, rank+1)); r.status != 201 {
		t.Fatalf("prepaid tier: %d %s", r.status, r.body)
	}
	tenant, key := s.tenant(post)
	for _, sql := range []string{`UPDATE tenants SET created_at = $2 WHERE id = $1`, `UPDATE tenant_tier_history SET valid_from = $2 WHERE tenant_id = $1`} {
		if _, err := s.pool.Exec(ctx, sql, tenant.ID, month); err != nil {
			t.Fatal(err)
		}
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"tier": "`+pre+`"}`); r.status != 200 {
		t.Fatalf("move: %d %s", r.status, r.body)
	}
	// the subscription line of the postpaid stretch, as the invoice rates
	// it: 30 dollars a month prorated by seconds, rounded half up
	var moved time.Time
	if err := s.pool.QueryRow(ctx, `SELECT valid_from FROM tenant_tier_history WHERE tenant_id = $1 AND tier = $2`, tenant.ID, pre).Scan(&moved); err != nil {
		t.Fatal(err)
	}
	secs, monthSecs := moved.Unix()-month.Unix(), month.AddDate(0, 1, 0).Unix()-month.Unix()
	price := (3000*2*secs + monthSecs) / (2 * monthSecs)
	if r := admin(t, "POST", base+"/admin/v1/tenants/"+tenant.ID+"/credits", `{"amount_cents": `+strconv.FormatInt(price+25, 10)+`, "reason": "top-up"}`); r.status != 201 {
		t.Fatalf("credit: %d %s", r.status, r.body)
	}
	admitted := 0
	for ; admitted < 100; admitted++ {
		r := do(t, "GET", base+"/api/demo/echo", key, "")
		if r.status == 402 {
			break
		}
		if r.status != 200 {
			t.Fatalf("request %d: %d %s", admitted+1, r.status, r.body)
		}
	}
	if admitted != 10+25 {
		t.Fatalf("admitted %d on a credit of %d cents after %d cents of postpaid plan, want the 10 included and 25 at a cent", admitted, price+25, price)
	}
	s.flushAndInvoice()
	var total, subscription int64
	if err := s.pool.QueryRow(ctx, `SELECT i.total_cents, coalesce(sum(l.amount_cents) FILTER (WHERE l.kind = 'subscription'), 0)::bigint
		FROM invoices i JOIN invoice_lines l ON l.invoice_id = i.id WHERE i.tenant_id = $1 GROUP BY i.id`, tenant.ID).Scan(&total, &subscription); err != nil {
		t.Fatal(err)
	}
	if total != 0 || subscription != price {
		t.Fatalf("the invoice owes %d cents with a subscription of %d, want 0 and %d", total, subscription, price)
	}
}

// TestPrepaidTierValidation: what a prepaid tier needs is checked with the
// field named, and nothing is stored.
func TestPrepaidTierValidation(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	for _, tc := range []struct{ name, from, to, field string }{
		{"a price", `"price_cents": 0`, `"price_cents": 500`, "price_cents"},
		{"no top-up URL", `"top_up_url": "` + topUpURL + `"`, `"top_up_url": ""`, "top_up_url"},
		{"a script URL", `"top_up_url": "` + topUpURL + `"`, `"top_up_url": "javascript:alert(1)"`, "top_up_url"},
		{"block overage", `"overage": "bill", "overage_price_cents_per_1k": 1000`, `"overage": "block", "overage_price_cents_per_1k": 0`, "billing"},
		{"no monthly quota", `"monthly_quota": 10`, `"monthly_quota": null`, "billing"},
		{"an unknown mode", `"billing": "prepaid"`, `"billing": "free"`, "billing"},
		{"a mode of the wrong type", `"billing": "prepaid"`, `"billing": 1`, "billing"},
	} {
		slug := "pv-" + testenv.RandomHex(3)
		body := prepaidTier(slug, 100_000+rand.IntN(800_000))
		if !strings.Contains(body, tc.from) {
			t.Fatalf("%s: %q not in the body", tc.name, tc.from)
		}
		body = strings.Replace(body, tc.from, tc.to, 1)
		r := admin(t, "POST", base+"/admin/v1/tiers", body)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" || r.json(t)["field"] != tc.field {
			t.Errorf("%s: %d %s, want 400 naming %s", tc.name, r.status, r.body, tc.field)
		}
		if r := admin(t, "GET", base+"/admin/v1/tiers/"+slug, ""); r.status != 404 {
			t.Errorf("%s: the tier was stored (%d)", tc.name, r.status)
		}
	}
	// a postpaid tier cannot turn prepaid while it has a price
	slug := "pv-" + testenv.RandomHex(3)
	if r := admin(t, "POST", base+"/admin/v1/tiers", strings.Replace(strings.Replace(prepaidTier(slug, 100_000+rand.IntN(800_000)),
		`"billing": "prepaid"`, `"billing": "postpaid"`, 1), `"price_cents": 0`, `"price_cents": 900`, 1)); r.status != 201 {
		t.Fatalf("postpaid: %d %s", r.status, r.body)
	}
	r := admin(t, "PATCH", base+"/admin/v1/tiers/"+slug, `{"billing": "prepaid"}`)
	if r.status != 400 || r.json(t)["field"] != "price_cents" {
		t.Errorf("to prepaid with a price: %d %s, want 400 naming price_cents", r.status, r.body)
	}
	// a tenant of it overriding the monthly quota to unlimited keeps it
	// postpaid (its units would all be free on a prepaid tier)
	tenant, _ := s.tenant(slug)
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"overrides": {"monthly_quota": null}}`); r.status != 200 {
		t.Fatalf("unlimited override on a postpaid tier: %d %s", r.status, r.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tiers/"+slug, `{"billing": "prepaid", "price_cents": 0}`); r.status != 409 ||
		!strings.Contains(string(r.body), tenant.ID) {
		t.Errorf("to prepaid with a tenant's unlimited override: %d %s, want 409 naming the tenant", r.status, r.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"overrides": {}}`); r.status != 200 {
		t.Fatalf("clearing the override: %d %s", r.status, r.body)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tiers/"+slug, `{"billing": "prepaid", "price_cents": 0}`); r.status != 200 || r.json(t)["billing"] != "prepaid" {
		t.Errorf("to prepaid without a price: %d %s", r.status, r.body)
	}
	r = admin(t, "PATCH", base+"/admin/v1/tenants/"+tenant.ID, `{"overrides": {"monthly_quota": null}}`)
	if r.status != 400 || r.json(t)["field"] != "overrides.monthly_quota" {
		t.Errorf("unlimited override on a prepaid tier: %d %s, want 400 naming overrides.monthly_quota", r.status, r.body)
	}
}
