package httpapi

import (
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/quota"
)

func TestRateLimitHeaders(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	allowed := quota.Decision{
		Allowed: true, Now: now,
		Limits: []quota.LimitState{
			{Name: quota.LimitBurst, Limit: 20, Remaining: 19, Reset: now.Add(100 * time.Millisecond), Window: 2 * time.Second},
			{Name: quota.LimitDaily, Limit: 1000, Remaining: 998, Reset: now.Add(12 * time.Hour), Window: 24 * time.Hour},
		},
	}
	refused := quota.Decision{
		Allowed: false, Now: now, Violated: []quota.LimitName{quota.LimitDaily}, RetryAfter: 1500 * time.Millisecond,
		Limits: []quota.LimitState{
			{Name: quota.LimitBurst, Limit: 20, Remaining: 5, Reset: now.Add(time.Second), Window: 2 * time.Second},
			{Name: quota.LimitDaily, Limit: 1000, Remaining: 0, Reset: now.Add(1500 * time.Millisecond), Window: 24 * time.Hour},
		},
	}
	for _, tc := range []struct {
		name string
		d    quota.Decision
		want map[string]string
	}{
		{"allowed", allowed, map[string]string{
			"RateLimit-Policy":      `"burst";q=20;w=2, "daily";q=1000;w=86400`,
			"RateLimit":             `"burst";r=19;t=1, "daily";r=998;t=43200`,
			"X-RateLimit-Limit":     "20",
			"X-RateLimit-Remaining": "19",
			"X-RateLimit-Reset":     "1795348801",
			"Retry-After":           "",
		}},
		{"refused", refused, map[string]string{
			"X-RateLimit-Limit":     "1000",
			"X-RateLimit-Remaining": "0",
			"Retry-After":           "2",
		}},
		{"refused forever", quota.Decision{Now: now, Violated: []quota.LimitName{quota.LimitBucket}, RetryAfter: -1,
			Limits: []quota.LimitState{{Name: quota.LimitBucket, Limit: 5, Remaining: 5, Reset: now, Window: time.Second}}},
			map[string]string{"Retry-After": "", "RateLimit": `"bucket";r=5;t=0`}},
	} {
		app := fiber.New()
		app.Get("/", func(c *fiber.Ctx) error { setRateLimitHeaders(c, tc.d); return nil })
		resp, err := app.Test(httptest.NewRequest("GET", "/", nil))
		if err != nil {
			t.Fatal(err)
		}
		for h, want := range tc.want {
			if got := resp.Header.Get(h); got != want {
				t.Errorf("%s: %s = %q, want %q", tc.name, h, got, want)
			}
		}
	}
}

func TestRefusalProblem(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	d := quota.Decision{Now: now, Violated: []quota.LimitName{quota.LimitMonthly}, RetryAfter: 3 * time.Hour,
		Limits: []quota.LimitState{{Name: quota.LimitMonthly, Limit: 100, Remaining: 2, Reset: now.Add(3 * time.Hour), Window: 30 * 24 * time.Hour}}}
	up := &quota.Upgrade{Tier: "pro", Name: "Pro", PriceCents: 4900}
	var p map[string]any
	if err := json.Unmarshal(refusalProblem(d, up, "/api/x").appendJSON(nil), &p); err != nil {
		t.Fatal(err)
	}
	if p["status"] != 429.0 || p["type"] != ProblemQuotaExceeded {
		t.Fatalf("status %v type %v, want 429 %q", p["status"], p["type"], ProblemQuotaExceeded)
	}
	if got, ok := p["violated-policies"].([]any); !ok || len(got) != 1 || got[0] != "monthly" {
		t.Errorf("violated-policies = %v, want [monthly]", p["violated-policies"])
	}
	for k, want := range map[string]any{"limit": 100.0, "remaining": 2.0, "retry_after": 10800.0, "reset": "2026-11-22T15:00:00Z",
		"instance": "/api/x", "detail": "the monthly limit is exhausted; retry in 10800 s, or upgrade to Pro"} {
		if got := p[k]; got != want {
			t.Errorf("%s = %v (%T), want %v", k, got, got, want)
		}
	}
	if u, ok := p["upgrade"].(map[string]any); !ok || u["tier"] != "pro" || u["name"] != "Pro" || u["price_cents"] != 4900.0 {
		t.Errorf("upgrade = %v, want %+v", p["upgrade"], up)
	}
}
