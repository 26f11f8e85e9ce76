package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// admin calls the admin API of one node.
type admin struct {
	base, token string
	client      *http.Client
}

// call sends body (JSON, nil for none) and decodes the answer into out
// when its status is want.
func (a admin) call(ctx context.Context, method, path string, body any, want int, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: got %d, want %d: %s", method, path, resp.StatusCode, want, trim(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// plan sizes the run's tiers from its duration, so that quotas, caps and
// credit run out part-way through a 60 s run and a 10-minute one alike.
type plan struct {
	postQuota, plusQuota int64 // monthly quotas of soak-post and soak-post-plus
	billQuota, capCents  int64 // soak-bill's monthly quota and spend cap (1 cent a unit)
	credit               int64 // a prepaid tenant's credit at start, and the grant mid-run (cents, 1 cent a unit)
	grant                int64 // the month grant mid-run, units
}

func newPlan(d time.Duration) plan {
	s := max(int64(d/time.Second), 60)
	return plan{postQuota: 3 * s, plusQuota: 9 * s, billQuota: 2 * s, capCents: s, credit: s / 2, grant: s}
}

// tiers creates the soak's tiers: every limit but the one each kind is
// about is far beyond the load.
func (a admin) tiers(ctx context.Context, p plan) error {
	base := func(slug string, rank int) map[string]any {
		return map[string]any{
			"slug": slug, "name": "Soak " + slug, "rank": rank, "price_cents": 0,
			"burst_rate": 100000, "burst": 100000, "bucket_capacity": 10000000, "bucket_refill_per_sec": 1000000,
			"daily_quota": nil, "monthly_quota": nil, "overage": "block", "overage_price_cents_per_1k": 0,
			"fail_open": false, "upgrade_url": "https://example.com/upgrade",
		}
	}
	post := base("soak-post", 1001)
	post["monthly_quota"] = p.postQuota
	plus := base("soak-post-plus", 1002)
	plus["monthly_quota"] = p.plusQuota
	bill := base("soak-bill", 1003)
	bill["monthly_quota"], bill["overage"], bill["overage_price_cents_per_1k"], bill["max_overage_cents"] = p.billQuota, "bill", 1000, p.capCents
	pre := base("soak-prepaid", 1004)
	pre["monthly_quota"], pre["overage"], pre["overage_price_cents_per_1k"] = 0, "bill", 1000
	pre["billing"], pre["top_up_url"] = "prepaid", "https://example.com/top-up"
	open := base("soak-open", 1005)
	open["fail_open"] = true
	for _, t := range []map[string]any{post, plus, bill, pre, open} {
		if err := a.call(ctx, http.MethodPost, "/admin/v1/tiers", t, http.StatusCreated, nil); err != nil {
			return err
		}
	}
	return nil
}

// tenants creates n tenants, the kinds in turn, each with a key and, on
// the prepaid tier, its starting credit.
func (a admin) tenants(ctx context.Context, n int, p plan) ([]*tenant, error) {
	kinds := []struct{ kind, tier string }{
		{kindPost, "soak-post"}, {kindBill, "soak-bill"}, {kindPrepaid, "soak-prepaid"}, {kindOpen, "soak-open"}}
	var out []*tenant
	for i := range n {
		k := kinds[i%len(kinds)]
		var t struct {
			ID string `json:"id"`
		}
		if err := a.call(ctx, http.MethodPost, "/admin/v1/tenants",
			map[string]any{"name": fmt.Sprintf("soak %s %d", k.kind, i), "tier": k.tier}, http.StatusCreated, &t); err != nil {
			return nil, err
		}
		var key struct {
			Secret string `json:"secret"`
		}
		if err := a.call(ctx, http.MethodPost, "/admin/v1/tenants/"+t.ID+"/keys",
			map[string]any{"name": "soak"}, http.StatusCreated, &key); err != nil {
			return nil, err
		}
		ten := &tenant{id: t.ID, key: key.Secret, kind: k.kind, quota: -1, capUnits: -1}
		switch k.kind {
		case kindPost:
			ten.quota = p.postQuota
		case kindBill:
			ten.quota, ten.capUnits = p.billQuota+p.capCents, p.capCents
		case kindPrepaid:
			if err := a.credit(ctx, ten, p.credit, "soak: starting credit"); err != nil {
				return nil, err
			}
		}
		out = append(out, ten)
	}
	return out, nil
}

// credit adds cents of prepaid credit to t (1 cent pays a unit on soak-prepaid).
func (a admin) credit(ctx context.Context, t *tenant, cents int64, reason string) error {
	if err := a.call(ctx, http.MethodPost, "/admin/v1/tenants/"+t.id+"/credits",
		map[string]any{"amount_cents": cents, "reason": reason}, http.StatusCreated, nil); err != nil {
		return err
	}
	t.mu.Lock()
	t.capUnits = max(t.capUnits, 0) + cents
	t.mu.Unlock()
	return nil
}

// grant adds units to t's month.
func (a admin) grant(ctx context.Context, t *tenant, units int64) error {
	if err := a.call(ctx, http.MethodPost, "/admin/v1/tenants/"+t.id+"/grants",
		map[string]any{"period": "month", "units": units}, http.StatusCreated, nil); err != nil {
		return err
	}
	t.mu.Lock()
	t.quota += units
	t.mu.Unlock()
	return nil
}

// upgrade moves t to soak-post-plus now, carrying its usage.
func (a admin) upgrade(ctx context.Context, t *tenant, p plan) error {
	// The quota checked is the larger one from the moment the change is sent.
	t.mu.Lock()
	old := t.quota
	t.quota = old - p.postQuota + p.plusQuota
	t.mu.Unlock()
	err := a.call(ctx, http.MethodPatch, "/admin/v1/tenants/"+t.id,
		map[string]any{"tier": "soak-post-plus", "effective": "now", "quota": "carry"}, http.StatusOK, nil)
	if err != nil {
		t.mu.Lock()
		t.quota = old
		t.mu.Unlock()
	}
	return err
}
