package admin

import (
	"bytes"
	"encoding/json"
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
		var b httpx.TierFields
		if err := httpx.DecodeJSON(c, &b); err != nil {
			return err
		}
		t, err := newTier(b)
		if err != nil {
			return err
		}
		if err := quota.CheckName("name", t.Name); err != nil { // the store's check
			return err
		}
		return t.Validate()
	},
	func(c *fiber.Ctx) error {
		var b httpx.TierFields
		if err := httpx.DecodeJSON(c, &b); err != nil {
			return err
		}
		if err := b.RefuseSlug(); err != nil {
			return err
		}
		t := quota.Tier{Slug: "pro", Name: "Pro", Rank: 1, Overage: quota.OverageBlock}
		if err := b.Apply(&t); err != nil {
			return err
		}
		if err := quota.CheckName("name", t.Name); err != nil { // the store's check of a name changed
			return err
		}
		return t.Validate()
	},
	func(c *fiber.Ctx) error {
		var b tenantCreate
		if err := httpx.DecodeJSON(c, &b); err != nil {
			return err
		}
		name, err := required("name", b.Name)
		if err != nil {
			return err
		}
		if err := quota.CheckName("name", name); err != nil { // the store's check
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
		if err := quota.CheckName("name", t.Name); err != nil { // the store's check
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
		if err := httpx.DecodeJSON(c, &b); err != nil {
			return err
		}
		return quota.CheckKeyName(b.Name) // the store's check
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

// The decoders' kinds, by their place in decoders.
const (
	kTierCreate uint8 = iota
	kTierPatch
	kTenantCreate
	kTenantPatch
	kKeyRotate
	kGrant
	kKeyCreate
	kPolicyCreate
	kPolicyPatch
	kCredit
)

// refused are bodies every decoder must refuse with a 400 naming field
// ("" when the body as a whole is wrong): blank names and names with
// white space around them, a member named twice (in any case for a
// struct's, at any depth), an unknown member inside a value that decodes
// itself, and bodies that are not one object.
var refused = []struct {
	kind        uint8
	body, field string
}{
	{kTierCreate, `{"slug": "gold", "name": "   ", "rank": 15, "price_cents": 0, "overage": "block"}`, "name"},
	{kTierCreate, `{"slug": "gold", "name": "\u200b", "rank": 15, "price_cents": 0, "overage": "block"}`, "name"},
	{kTierCreate, `{"slug": "gold", "name": "Gold", "rank": 15, "rank": 16, "price_cents": 0, "overage": "block"}`, "rank"},
	{kTierPatch, `{"name": " Pro"}`, "name"},
	{kTierPatch, `null`, ""},
	{kTierPatch, `{"meter_quotas": [{"meter": "a", "daily_quota": 1, "overage": "block"}, {"meter": "b", "METER": "c", "daily_quota": 1, "overage": "block"}]}`, "meter_quotas[1].METER"},
	{kTierPatch, `{"meter_quotas": [{"meter": "a", "daily_qouta": 1, "overage": "block"}]}`, "meter_quotas[0].daily_qouta"},
	{kTenantCreate, `{"name": "   ", "tier": "free"}`, "name"},
	{kTenantCreate, `{"name": "Acme\n", "tier": "free"}`, "name"},
	{kTenantCreate, `{"name": "A", "name": "B", "tier": "free"}`, "name"},
	{kTenantCreate, `{"name": "A", "NAME": "B", "tier": "free"}`, "NAME"},
	{kTenantCreate, `{"name": "A", "n\u0061me": "B", "tier": "free"}`, "name"},
	{kTenantCreate, `{"name": "A", "tier": "free", "overrides": {"burst": 1, "burst": 2}}`, "overrides.burst"},
	{kTenantPatch, `null`, ""},
	{kTenantPatch, ` null `, ""},
	{kTenantPatch, `{}{}`, ""},
	{kTenantPatch, "\ufeff{}", ""},
	{kTenantPatch, `{"name": "\t"}`, "name"},
	{kTenantPatch, `{"overrides": {"daily_qouta": 5}}`, "overrides.daily_qouta"},
	{kTenantPatch, `{"overrides": {"burst": 1, "Burst": 2}}`, "overrides.Burst"},
	{kTenantPatch, `{"pending_change": {"a": 1, "a": 2}}`, "pending_change.a"},
	{kKeyRotate, `null`, ""},
	{kKeyRotate, `{"grace_seconds": 0, "name": " k"}`, "name"},
	{kGrant, `{"period": "day", "units": 1, "units": 1000}`, "units"},
	{kKeyCreate, `{"name": "\u00a0"}`, "name"},
	{kKeyCreate, `{"name": "a", "Name": "b"}`, "Name"},
	{kPolicyCreate, `{"name": "p", "algorithm": "gcra", "rate": 1, "burst": 1, "burst": 100}`, "burst"},
	{kPolicyCreate, `{"name": "p", "algorithm": "gcra", "rate": 1, "burst": 1, "match": {"tiers": ["a"], "tiers": ["b"]}}`, "match.tiers"},
	{kPolicyPatch, `{"rate": 1, "rate": 100}`, "rate"},
	{kCredit, `{"amount_cents": 1, "reason": "  "}`, "reason"},
	{kCredit, `{"amount_cents": 1, "reason": "x", "amount_cents": 100000}`, "amount_cents"},
}

// TestAdminDecodersRefuse: each of refused is a 400 problem naming its
// field.
func TestAdminDecodersRefuse(t *testing.T) {
	t.Parallel()
	app := decoderApp()
	for _, tc := range refused {
		req := httptest.NewRequest("POST", "/"+strconv.Itoa(int(tc.kind)), bytes.NewReader([]byte(tc.body)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := app.Test(req, -1)
		if err != nil {
			t.Fatal(err)
		}
		var p struct{ Field string }
		err = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if resp.StatusCode != 400 || err != nil || p.Field != tc.field {
			t.Errorf("decoder %d, %s: %d, field %q, want 400 naming %q", tc.kind, tc.body, resp.StatusCode, p.Field, tc.field)
		}
	}
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
	for _, tc := range refused {
		f.Add(tc.kind, []byte(tc.body))
	}
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
