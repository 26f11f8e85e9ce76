package admin

import (
	"bytes"
	"io"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// decoders are the admin request bodies with the validation
// their handlers run before touching the database.
var decoders = []func(c *fiber.Ctx) error{
	func(c *fiber.Ctx) error {
		var b tierCreate
		if err := httpx.DecodeJSON(c, &b); err != nil {
			return err
		}
		t, err := b.tier()
		if err != nil {
			return err
		}
		return t.Validate()
	},
	func(c *fiber.Ctx) error {
		var b tierPatch
		if err := httpx.DecodeJSON(c, &b); err != nil {
			return err
		}
		t := quota.Tier{Slug: "pro", Name: "Pro", Rank: 1, Overage: quota.OverageBlock}
		if err := b.apply(&t); err != nil {
			return err
		}
		return t.Validate()
	},
	func(c *fiber.Ctx) error {
		var b tenantCreate
		if err := httpx.DecodeJSON(c, &b); err != nil {
			return err
		}
		if _, err := required("name", b.Name); err != nil {
			return err
		}
		if _, err := required("tier", b.Tier); err != nil {
			return err
		}
		if err := (&API{}).validWebhook(b.WebhookURL); err != nil {
			return err
		}
		if _, _, err := b.calendar(); err != nil {
			return err
		}
		return b.Overrides.Apply(quota.Limits{DailyQuota: quota.Ptr(int64(10))}).Validate()
	},
	func(c *fiber.Ctx) error {
		var b tenantPatch
		if err := httpx.DecodeJSON(c, &b); err != nil {
			return err
		}
		if _, err := b.plan(); err != nil {
			return err
		}
		t := quota.Tenant{Name: "x", Tier: "free", Status: quota.StatusActive, BillingAnchorDay: 1, TimeZone: "UTC"}
		if err := b.apply(&t); err != nil {
			return err
		}
		if err := (&API{}).validWebhook(t.WebhookURL); err != nil {
			return err
		}
		return t.Overrides.Apply(quota.Limits{}).Validate()
	},
	func(c *fiber.Ctx) error {
		var b keyRotate
		if err := httpx.DecodeJSON(c, &b); err != nil {
			return err
		}
		_, err := b.validate()
		return err
	},
	func(c *fiber.Ctx) error {
		var b grantCreate
		if err := httpx.DecodeJSON(c, &b); err != nil {
			return err
		}
		_, _, err := b.validate()
		return err
	},
	func(c *fiber.Ctx) error {
		var b keyCreate
		return httpx.DecodeJSON(c, &b)
	},
	func(c *fiber.Ctx) error {
		p, err := decodePolicy(c)
		if err != nil {
			return err
		}
		p.Defaults()
		return p.Validate()
	},
	func(c *fiber.Ctx) error {
		patch, err := decodePolicyPatch(c)
		if err != nil {
			return err
		}
		p := quota.Policy{Name: "reports", Algorithm: quota.AlgLeakyBucket, Rate: quota.Ptr(5.0), Burst: quota.Ptr(int64(10)),
			Match: quota.PolicyMatch{Meters: []string{"report"}}, OnRefuse: quota.RefuseQueue, MaxWaitMS: quota.Ptr(int64(2000))}
		if err := patch.apply(&p); err != nil {
			return err
		}
		p.Defaults()
		return p.Validate()
	},
	func(c *fiber.Ctx) error {
		var body creditCreate
		if err := httpx.DecodeJSON(c, &body); err != nil {
			return err
		}
		in, err := body.credit()
		if err != nil {
			return err
		}
		return in.Check()
	},
}

func decoderApp() *fiber.App {
	app := fiber.New(fiber.Config{ErrorHandler: httpx.ErrorHandler(slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)})
	app.Post("/:kind", func(c *fiber.Ctx) error {
		k, _ := strconv.Atoi(c.Params("kind"))
		if err := decoders[k](c); err != nil {
			return err
		}
		return c.SendStatus(fiber.StatusNoContent)
	})
	return app
}

// FuzzAdminDecoders feeds arbitrary bodies to every admin decoder: each must
// answer 204 (valid) or a 4xx problem, never a 5xx or a panic. Seeds live in
// testdata/fuzz/FuzzAdminDecoders; run longer with
// go test -fuzz FuzzAdminDecoders ./internal/httpapi/admin/.
func FuzzAdminDecoders(f *testing.F) {
	for i, seed := range []string{
		`{"slug": "gold", "name": "Gold", "rank": 15, "price_cents": 9900, "burst_rate": 20, "burst": 40, "overage": "bill", "overage_price_cents_per_1k": 30}`,
		`{"daily_quota": null, "burst_rate": 1e308, "burst": 9223372036854775807}`,
		`{"name": "Acme", "tier": "free", "overrides": {"daily_quota": -1, "burst": null}}`,
		`{"status": "suspended", "overrides": null, "tier": null}`,
		`{"grace_seconds": 3600}`,
		`{"period": "month", "units": 1e400}`,
		`{"name": "k", "expires_at": "2030-01-01T00:00:00Z"}`,
		`{"api_key": 5, "meter": ["m"], "cost": -0.5}`,
	} {
		f.Add(uint8(i), []byte(seed))
	}
	f.Add(uint8(2), []byte(`{"name": "Acme", "tier": "free", "webhook_url": "http://[::ffff:a9fe:a9fe]:80/latest"}`))
	f.Add(uint8(3), []byte(`{"webhook_url": "https://0x7f.1./hook"}`))
	f.Add(uint8(2), []byte(`{"name": "Acme", "tier": "free", "billing_anchor_day": 28, "time_zone": "Europe/Paris"}`))
	f.Add(uint8(3), []byte(`{"tier": "free", "effective": "next_period", "quota": "reset", "time_zone": "posix/Local"}`))
	f.Add(uint8(3), []byte(`{"quota": "carry", "pending_change": {"tier": "pro"}, "billing_anchor_day": 1e3}`))
	f.Add(uint8(7), []byte(`{"name": "reports-concurrency", "algorithm": "concurrency", "limit": 2, "match": {"meters": ["report"], "tiers": ["free", "pro"]}, "scope": "tenant", "cost": "requests", "on_refuse": "queue", "max_wait_ms": 2000, "lease_seconds": 30}`))
	f.Add(uint8(8), []byte(`{"rate": null, "algorithm": "gcra", "match": {"methods": ["get"]}, "exceptions": {"a\u0000": 1}}`))
	f.Add(uint8(9), []byte(`{"amount_cents": 5000, "reason": "welcome credit", "expires_at": "2027-01-01T00:00:00Z"}`))
	f.Add(uint8(9), []byte(`{"amount_cents": 1e400, "reason": "\u0000", "expires_at": "tomorrow"}`))
	app := decoderApp()
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		k := int(kind) % len(decoders)
		req := httptest.NewRequest("POST", "/"+strconv.Itoa(k), bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := app.Test(req, -1)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("decoder %d answered %d to %q", k, resp.StatusCode, body)
		}
		if resp.StatusCode != 204 && resp.Header.Get("Content-Type") != httpx.ContentTypeProblem {
			t.Fatalf("decoder %d answered %d without a problem body to %q", k, resp.StatusCode, body)
		}
	})
}
