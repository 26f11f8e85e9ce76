package httpapi

import (
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
	p := refusalProblem(d, up, "/api/x")
	if p.Status != 429 || p.Type != ProblemQuotaExceeded {
		t.Fatalf("status %d type %q, want 429 %q", p.Status, p.Type, ProblemQuotaExceeded)
	}
	if got := p.Extra["violated-policies"].([]string); len(got) != 1 || got[0] != "monthly" {
		t.Errorf("violated-policies = %v, want [monthly]", got)
	}
	for k, want := range map[string]any{"limit": int64(100), "remaining": int64(2), "retry_after": int64(10800), "reset": "2026-11-22T15:00:00Z"} {
		if got := p.Extra[k]; got != want {
			t.Errorf("%s = %v (%T), want %v", k, got, got, want)
		}
	}
	if p.Extra["upgrade"] != up {
		t.Errorf("upgrade = %v, want %v", p.Extra["upgrade"], up)
	}
}
