// Package admin is the admin REST API of the HTTP layer (/admin/v1).
//
// It parses and encodes: what a change does (validation, audit, invalidating
// every node's cache) is the catalog's and the domain's.
package admin

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/usage"
)

// The actor recorded in the audit log for changes made with the admin token.
const adminActor = "admin"

// Records is what the admin API reads of the store of tiers, tenants, keys,
// grants, policies and the audit log (*catalogdb.Store): listings and single
// records, read through to Postgres, never cached. Writes go through the
// catalog.
type Records interface {
	ListTiers(ctx context.Context, p quota.Page) ([]quota.Tier, *string, error)
	Tier(ctx context.Context, slug string) (quota.Tier, error)
	ListTenants(ctx context.Context, f quota.TenantFilter, p quota.Page) ([]quota.Tenant, *string, error)
	Tenant(ctx context.Context, id string) (quota.Tenant, error)
	ListKeys(ctx context.Context, tenantID string, p quota.Page) ([]quota.APIKey, *string, error)
	Key(ctx context.Context, id string) (quota.APIKey, error)
	ListGrants(ctx context.Context, tenantID string, p quota.Page) ([]quota.Grant, *string, error)
	Grant(ctx context.Context, tenantID, id string) (quota.Grant, error)
	ListAudit(ctx context.Context, entity, entityID string, p quota.Page) ([]quota.AuditEntry, *string, error)
	ListPolicies(ctx context.Context, p quota.Page) ([]quota.Policy, *string, error)
	Policy(ctx context.Context, name string) (quota.Policy, error)
}

// Deps are what the admin API uses; internal/app (RunAPI) builds them.
type Deps struct {
	Store   Records
	Catalog *catalog.Catalog // cached reads
	Admin   *catalog.Admin   // writes of tiers, tenants, keys and policies, which invalidate the catalog
	Grants  *catalog.Grants
	Plans   *catalog.Plans // tenant changes, tier changes with their timing and quota resets
	Ledger  *billing.Ledger
	Alerts  *billing.Deliverer
	Usage   *usage.Reader
	Guard   *httpx.Guard
	Log     *slog.Logger
	Now     func() time.Time

	AdminToken string
	// WebhookAllowPrivate lets tenants' webhook URLs name loopback,
	// link-local and private addresses.
	WebhookAllowPrivate bool
}

// API is the admin REST API (/admin/v1): tiers, tenants, keys, grants,
// usage, invoices, the audit log and alerts. Its handlers are registered,
// with every other route, in internal/httpapi.
type API struct {
	store   Records
	catalog *catalog.Catalog
	admin   *catalog.Admin
	grants  *catalog.Grants
	plans   *catalog.Plans
	ledger  *billing.Ledger
	alerts  *billing.Deliverer
	reports *usage.Reader
	guard   *httpx.Guard
	log     *slog.Logger
	now     func() time.Time
	opts    Deps
}

// New returns the admin API over d.
func New(d Deps) *API {
	return &API{store: d.Store, catalog: d.Catalog, admin: d.Admin, grants: d.Grants, plans: d.Plans, ledger: d.Ledger, alerts: d.Alerts,
		reports: d.Usage, guard: d.Guard, log: d.Log, now: d.Now, opts: d}
}

// Auth lets through only requests with the admin token; with no token
// configured it refuses everything. Failed tokens are limited per address
// (see tokenIs).
func (s *API) Auth(c *fiber.Ctx) error {
	if err := s.guard.BearerAuth(c, s.guard.Admin, s.opts.AdminToken, "tollgate-admin", "admin token"); err != nil {
		return err
	}
	return c.Next()
}

// page reads limit (1..200, default 50) and cursor.
func page(c *fiber.Ctx) (quota.Page, error) {
	p := quota.Page{Limit: 50, Cursor: c.Query("cursor")}
	if v := c.Query("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 200 {
			return p, quota.FieldError("limit", "must be an integer between 1 and 200")
		}
		p.Limit = n
	}
	if len(p.Cursor) > 512 {
		return p, quota.FieldError("cursor", "not a cursor of this list")
	}
	return p, nil
}

// created answers 201 with v, the resource created at path (under
// /admin/v1), named in Location: a path, not a URL, so that it holds
// whatever host and scheme the client reached the API by.
func created(c *fiber.Ctx, path string, v any) error {
	c.Location(path)
	return c.Status(fiber.StatusCreated).JSON(v)
}

// The shapes most admin handlers share: read one resource, answer it; or
// delete one, answer 204. param names the path parameter of the resource.

// one answers a GET of one resource: what load returns for the path
// parameter param, as JSON.
func one[T any](c *fiber.Ctx, param string, load func(context.Context, string) (T, error)) error {
	v, err := load(c.UserContext(), c.Params(param))
	if err != nil {
		return err
	}
	return c.JSON(v)
}

// oneByID is one for a resource named by one of Tollgate's ids: an id of
// another shape is not found (validID) before it reaches a query.
func oneByID[T any](c *fiber.Ctx, what, param string, load func(context.Context, string) (T, error)) error {
	if err := validID(what, c.Params(param)); err != nil {
		return err
	}
	return one(c, param, load)
}

// gone answers a DELETE: remove, by the admin, of the resource the path
// parameter param names, then 204.
func gone(c *fiber.Ctx, param string, remove func(ctx context.Context, actor, id string) error) error {
	if err := remove(c.UserContext(), adminActor, c.Params(param)); err != nil {
		return err
	}
	return c.SendStatus(fiber.StatusNoContent)
}

// validID refuses, as not found, an id that is not one of Tollgate's
// before it reaches a query.
func validID(what, id string) error {
	if !quota.ValidID(id) {
		return quota.Errorf(quota.CodeNotFound, "no %s %q", what, id)
	}
	return nil
}

// paged answers a list route: it reads limit and cursor, fetches one page
// and writes {items, next_cursor}.
func paged[T any](c *fiber.Ctx, fetch func(quota.Page) ([]T, *string, error)) error {
	p, err := page(c)
	if err != nil {
		return err
	}
	items, next, err := fetch(p)
	if err != nil {
		return err
	}
	if items == nil {
		items = []T{}
	}
	return c.JSON(fiber.Map{"items": items, "next_cursor": next})
}

// ---- tiers

// ListTiers answers GET /admin/v1/tiers: one page of the tiers, {items,
// next_cursor}; a bad limit or cursor is a 400.
func (s *API) ListTiers(c *fiber.Ctx) error {
	return paged(c, func(p quota.Page) ([]quota.Tier, *string, error) { return s.store.ListTiers(c.UserContext(), p) })
}

func required[T any](field string, v *T) (T, error) {
	if v == nil {
		var zero T
		return zero, quota.FieldError(field, "is required")
	}
	return *v, nil
}

// newTier is the tier of a body of POST /admin/v1/tiers: slug, name, rank,
// price_cents and overage are required; the other fields may be absent or
// null (limits: unlimited; meter quotas: none; billing: postpaid).
func newTier(b httpx.TierFields) (quota.Tier, error) {
	t := quota.Tier{Billing: quota.BillingPostpaid}
	for _, f := range []struct {
		name    string
		present bool
	}{{"slug", b.Slug.Value != nil}, {"name", b.Name.Value != nil}, {"rank", b.Rank.Value != nil}, {"price_cents", b.PriceCents.Value != nil}, {"overage", b.Overage.Value != nil}} {
		if !f.present {
			return t, quota.FieldError(f.name, "is required")
		}
	}
	t.Slug = *b.Slug.Value
	return t, b.Fill(&t)
}

// CreateTier answers POST /admin/v1/tiers: it validates the body, creates the
// tier (audited) and answers 201 with it and its Location; an invalid field
// is a 400, a taken slug a 409.
func (s *API) CreateTier(c *fiber.Ctx) error {
	var body httpx.TierFields
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return err
	}
	t, err := newTier(body)
	if err != nil {
		return err
	}
	if t, err = s.admin.CreateTier(c.UserContext(), adminActor, t); err != nil {
		return err
	}
	return created(c, "/admin/v1/tiers/"+url.PathEscape(t.Slug), t)
}

// GetTier answers GET /admin/v1/tiers/:slug with the tier, or a 404.
func (s *API) GetTier(c *fiber.Ctx) error { return one(c, "slug", s.store.Tier) }

// PatchTier answers PATCH /admin/v1/tiers/:slug: it applies the fields given
// (the slug cannot change) and answers with the tier; an invalid field is a
// 400, an unknown tier a 404, a result that conflicts with its tenants'
// limits or another tier's rank a 409.
func (s *API) PatchTier(c *fiber.Ctx) error {
	var body httpx.TierFields
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return err
	}
	if err := body.RefuseSlug(); err != nil {
		return err
	}
	t, err := s.admin.UpdateTier(c.UserContext(), adminActor, c.Params("slug"), body.Apply)
	if err != nil {
		return err
	}
	return c.JSON(t)
}

// DeleteTier answers DELETE /admin/v1/tiers/:slug with a 204 once the tier
// is deleted (audited); an unknown tier is a 404, one still in use a 409.
func (s *API) DeleteTier(c *fiber.Ctx) error { return gone(c, "slug", s.admin.DeleteTier) }

// ---- tenants

// ListTenants answers GET /admin/v1/tenants: one page of the tenants,
// filtered by q (name) and tier; a bad filter, limit or cursor is a 400.
func (s *API) ListTenants(c *fiber.Ctx) error {
	f := quota.TenantFilter{Query: c.Query("q"), Tier: c.Query("tier")}
	if len(f.Query) > quota.MaxNameLen {
		return quota.FieldError("q", "must be at most %d characters", quota.MaxNameLen)
	}
	return paged(c, func(p quota.Page) ([]quota.Tenant, *string, error) {
		return s.store.ListTenants(c.UserContext(), f, p)
	})
}

type tenantCreate struct {
	Name             *string         `json:"name"`
	Tier             *string         `json:"tier"`
	Overrides        quota.Overrides `json:"overrides"`
	WebhookURL       string          `json:"webhook_url"`
	BillingAnchorDay *int            `json:"billing_anchor_day"` // absent: 1
	TimeZone         *string         `json:"time_zone"`          // absent: UTC
}

// calendar returns the body's billing calendar with its defaults, checked.
func (b tenantCreate) calendar() (int, string, error) {
	day, zone := quota.DefaultAnchorDay, quota.DefaultTimeZone
	if b.BillingAnchorDay != nil {
		day = *b.BillingAnchorDay
	}
	if b.TimeZone != nil {
		zone = *b.TimeZone
	}
	return day, zone, quota.CheckCalendar(day, zone)
}

// CreateTenant answers POST /admin/v1/tenants: it creates the tenant on its
// tier (audited) and answers 201 with it and its Location; an invalid field
// or unknown tier is a 400.
func (s *API) CreateTenant(c *fiber.Ctx) error {
	var body tenantCreate
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return err
	}
	name, err := required("name", body.Name)
	if err != nil {
		return err
	}
	tier, err := required("tier", body.Tier)
	if err != nil {
		return err
	}
	if err := s.validWebhook(body.WebhookURL); err != nil {
		return err
	}
	day, zone, err := body.calendar()
	if err != nil {
		return err
	}
	t, err := s.admin.CreateTenant(c.UserContext(), adminActor, quota.Tenant{Name: name, Tier: tier,
		Overrides: body.Overrides, WebhookURL: body.WebhookURL, BillingAnchorDay: day, TimeZone: zone})
	if err != nil {
		return err
	}
	return created(c, "/admin/v1/tenants/"+t.ID, t)
}

// GetTenant answers GET /admin/v1/tenants/:id with the tenant, or a 404.
func (s *API) GetTenant(c *fiber.Ctx) error { return one(c, "id", s.store.Tenant) }

type tenantPatch struct {
	Name             quota.Optional[string]             `json:"name"`
	Tier             quota.Optional[string]             `json:"tier"`
	Status           quota.Optional[quota.TenantStatus] `json:"status"`
	Overrides        quota.Optional[quota.Overrides]    `json:"overrides"`
	WebhookURL       quota.Optional[string]             `json:"webhook_url"`
	BillingAnchorDay quota.Optional[int]                `json:"billing_anchor_day"`
	TimeZone         quota.Optional[string]             `json:"time_zone"`
	// Effective and Quota go with Tier: when the change applies and what
	// it does with the usage already counted (quota.PlanRequest).
	Effective quota.Optional[quota.Effective] `json:"effective"`
	Quota     quota.Optional[quota.QuotaMode] `json:"quota"`
	// PendingChange takes null only: it cancels the pending change.
	PendingChange quota.Optional[json.RawMessage] `json:"pending_change"`
}

// plan returns the tier change the body asks for, nil when it names no
// tier; effective or quota without tier is a CodeInvalid error naming it.
func (p tenantPatch) plan() (*quota.PlanRequest, error) {
	if !p.Tier.Set {
		switch {
		case p.Effective.Set:
			return nil, quota.FieldError("effective", "goes with tier: say which tier the change is to")
		case p.Quota.Set:
			return nil, quota.FieldError("quota", "goes with tier: say which tier the change is to")
		}
		return nil, nil
	}
	var r quota.PlanRequest
	for _, err := range []error{
		httpx.Assign("tier", p.Tier, &r.Tier), httpx.Assign("effective", p.Effective, &r.Effective), httpx.Assign("quota", p.Quota, &r.Quota),
	} {
		if err != nil {
			return nil, err
		}
	}
	return &r, r.Validate()
}

func (p tenantPatch) apply(t *quota.Tenant) error {
	for _, err := range []error{
		httpx.Assign("name", p.Name, &t.Name), httpx.Assign("status", p.Status, &t.Status),
		httpx.Assign("webhook_url", p.WebhookURL, &t.WebhookURL),
		httpx.Assign("billing_anchor_day", p.BillingAnchorDay, &t.BillingAnchorDay), httpx.Assign("time_zone", p.TimeZone, &t.TimeZone),
	} {
		if err != nil {
			return err
		}
	}
	if p.PendingChange.Set {
		if p.PendingChange.Value != nil {
			return quota.FieldError("pending_change", "takes only null, which cancels the pending change; "+
				`to plan a change, send tier with "effective": "next_period"`)
		}
		t.PendingChange = nil
	}
	if p.BillingAnchorDay.Set || p.TimeZone.Set {
		if err := quota.CheckCalendar(t.BillingAnchorDay, t.TimeZone); err != nil {
			return err
		}
	}
	if p.Overrides.Set {
		t.Overrides = quota.Overrides{} // null clears every override
		if p.Overrides.Value != nil {
			t.Overrides = *p.Overrides.Value
		}
	}
	return httpx.ValidURL("webhook_url", t.WebhookURL)
}

// PatchTenant changes a tenant. A tier change applies at once by default
// when the new tier's rank is higher or equal, at the start of the
// tenant's next billing period (a pending change the worker applies) when
// it is lower; effective says otherwise. Applied now, it counts from the
// next request on every node; the usage already counted in the day and
// month stays counted (quota carry: counters belong to the tenant, not to
// its tier) unless quota is reset. The answer's Tollgate-Quota-Reset
// header says "applied", or "pending" when Redis did not answer: the
// change is made and the worker empties the counters within one reconcile
// interval.
func (s *API) PatchTenant(c *fiber.Ctx) error {
	var body tenantPatch
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return err
	}
	plan, err := body.plan()
	if err != nil {
		return err
	}
	t, reset, err := s.plans.Change(c.UserContext(), adminActor, c.Params("id"), plan, func(t *quota.Tenant) error {
		if err := body.apply(t); err != nil || !body.WebhookURL.Set {
			return err // a URL stored before it was checked is left to the worker's check
		}
		return s.validWebhook(t.WebhookURL)
	})
	if err != nil {
		return err
	}
	if reset != catalog.ResetNone {
		c.Set("Tollgate-Quota-Reset", reset)
	}
	return c.JSON(t)
}

// DeleteTenant answers DELETE /admin/v1/tenants/:id with a 204 once the
// tenant is deleted (audited); an unknown tenant is a 404, one with a final
// invoice a 409.
func (s *API) DeleteTenant(c *fiber.Ctx) error { return gone(c, "id", s.admin.DeleteTenant) }

// ---- keys

// ListKeys answers GET /admin/v1/tenants/:id/keys: one page of the tenant's
// API keys (prefixes, never secrets).
func (s *API) ListKeys(c *fiber.Ctx) error {
	return paged(c, func(p quota.Page) ([]quota.APIKey, *string, error) {
		return s.store.ListKeys(c.UserContext(), c.Params("id"), p)
	})
}

type keyCreate struct {
	Name      string     `json:"name"`
	ExpiresAt *time.Time `json:"expires_at"`
}

// IssueKey answers POST /admin/v1/tenants/:id/keys: it issues a key (the
// body, optional, may name it and set its expiry) and answers 201 with it,
// its secret shown this once; an invalid field is a 400.
func (s *API) IssueKey(c *fiber.Ctx) error {
	var body keyCreate
	if len(c.Body()) > 0 {
		if err := httpx.DecodeJSON(c, &body); err != nil {
			return err
		}
	}
	var exp []time.Time
	if body.ExpiresAt != nil {
		if !body.ExpiresAt.After(s.now()) {
			return quota.FieldError("expires_at", "must be in the future")
		}
		exp = append(exp, *body.ExpiresAt)
	}
	k, err := s.admin.IssueKey(c.UserContext(), adminActor, c.Params("id"), body.Name, exp...)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return created(c, "/admin/v1/keys/"+k.ID, k)
}

// GetKey answers one key, without its secret.
func (s *API) GetKey(c *fiber.Ctx) error { return oneByID(c, "key", "id", s.store.Key) }

// RevokeKey answers DELETE /admin/v1/keys/:id with a 204 once the key is
// revoked (audited), or a 404.
func (s *API) RevokeKey(c *fiber.Ctx) error {
	if _, err := s.admin.RevokeKey(c.UserContext(), adminActor, c.Params("id")); err != nil {
		return err
	}
	return c.SendStatus(fiber.StatusNoContent)
}

type keyRotate struct {
	GraceSeconds *int64 `json:"grace_seconds"`
	Name         string `json:"name"`
}

// maxGrace bounds how long a rotated key stays valid.
const maxGrace = 30 * 24 * time.Hour

func (b keyRotate) validate() (time.Duration, error) {
	grace, err := required("grace_seconds", b.GraceSeconds)
	if err != nil {
		return 0, err
	}
	if grace < 0 || grace > int64(maxGrace/time.Second) {
		return 0, quota.FieldError("grace_seconds", "must be between 0 and %d", int64(maxGrace/time.Second))
	}
	if err := quota.CheckKeyName(b.Name); err != nil {
		return 0, err
	}
	return time.Duration(grace) * time.Second, nil
}

// RotateKey answers POST /admin/v1/keys/:id/rotate: it issues the key's
// successor and lets the old one live for the grace given, answering 201 with
// {new, old}; an invalid grace is a 400, an unknown key a 404.
func (s *API) RotateKey(c *fiber.Ctx) error {
	var body keyRotate
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return err
	}
	grace, err := body.validate()
	if err != nil {
		return err
	}
	fresh, old, err := s.admin.RotateKey(c.UserContext(), adminActor, c.Params("id"), body.Name, grace)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return created(c, "/admin/v1/keys/"+fresh.ID, fiber.Map{"new": fresh, "old": old})
}

// ---- grants

type grantCreate struct {
	Period *string `json:"period"`
	Units  *int64  `json:"units"`
}

// grantLater is the detail of a grant recorded but not yet applied.
const grantLater = "the grant is recorded but not applied yet (Redis did not answer): " +
	"the worker applies it within one reconcile interval (TOLLGATE_RECONCILE_INTERVAL)"

// CreateGrant answers 201 with a grant applied at once; 202 with applied
// false and a detail when Redis did not answer, so that the worker applies
// it; 200 with the grant first recorded for a repeat of its Idempotency-Key.
func (s *API) CreateGrant(c *fiber.Ctx) error {
	key, err := httpx.IdempotencyKey(c)
	if err != nil {
		return err
	}
	var body grantCreate
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return err
	}
	g, created, err := s.grant(c.UserContext(), adminActor, c.Params("id"), key, body)
	if err != nil {
		return err
	}
	status := fiber.StatusCreated
	if !created {
		status = fiber.StatusOK
		c.Set("Idempotent-Replayed", "true")
	} else {
		c.Location("/admin/v1/tenants/" + g.TenantID + "/grants/" + g.ID)
	}
	if g.Applied {
		return c.Status(status).JSON(g)
	}
	if created {
		status = fiber.StatusAccepted
	}
	return c.Status(status).JSON(struct {
		quota.Grant
		Detail string `json:"detail"`
	}{g, grantLater})
}

// validate returns the grant's period ("day" or "month") and units.
func (b grantCreate) validate() (string, int64, error) {
	period, err := required("period", b.Period)
	if err != nil {
		return "", 0, err
	}
	units, err := required("units", b.Units)
	if err != nil {
		return "", 0, err
	}
	return period, units, catalog.CheckGrant(period, units)
}

// grant grants through the catalog's Grants, for the API and the console.
func (s *API) grant(ctx context.Context, actor, tenantID, key string, body grantCreate) (quota.Grant, bool, error) {
	period, units, err := body.validate()
	if err != nil {
		return quota.Grant{}, false, err
	}
	return s.grants.Create(ctx, actor, tenantID, key, period, units)
}

// GetGrant answers one of a tenant's grants.
func (s *API) GetGrant(c *fiber.Ctx) error {
	tenantID, id := c.Params("id"), c.Params("grant")
	if err := validID("grant", id); err != nil {
		return err
	}
	g, err := s.store.Grant(c.UserContext(), tenantID, id)
	if err != nil {
		return err
	}
	return c.JSON(g)
}

// ListGrants answers GET /admin/v1/tenants/:id/grants: one page of the
// tenant's quota grants.
func (s *API) ListGrants(c *fiber.Ctx) error {
	return paged(c, func(p quota.Page) ([]quota.Grant, *string, error) {
		return s.store.ListGrants(c.UserContext(), c.Params("id"), p)
	})
}

// ---- usage and invoices exports

// parseTime reads a date (YYYY-MM-DD, UTC midnight) or an RFC 3339 time.
func parseTime(field, v string, def time.Time) (time.Time, error) {
	if v == "" {
		return def, nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return t, quota.FieldError(field, "must be a date (2026-11-01) or an RFC 3339 time")
	}
	return t.UTC(), nil
}

// maxUsageRange bounds one usage export.
const maxUsageRange = 2 * 366 * 24 * time.Hour

// TenantUsage answers GET /admin/v1/tenants/:id/usage: the tenant's usage
// from from to to (default: this UTC month so far) by hour or day, streamed
// as JSON or CSV; a bad range, granularity or meter is a 400.
func (s *API) TenantUsage(c *fiber.Ctx) error {
	now := s.now().UTC()
	from, err := parseTime("from", c.Query("from"), quota.MonthStart(now))
	if err != nil {
		return err
	}
	to, err := parseTime("to", c.Query("to"), now)
	if err != nil {
		return err
	}
	if !to.After(from) {
		return quota.FieldError("to", "must be after from")
	}
	if to.Sub(from) > maxUsageRange {
		return quota.FieldError("to", "the range must be at most two years")
	}
	gran := c.Query("granularity", "day")
	if gran != "hour" && gran != "day" {
		return quota.FieldError("granularity", `must be "hour" or "day"`)
	}
	meter := c.Query("meter")
	if meter != "" && !httpx.ValidMeter(meter) {
		return quota.FieldError("meter", "must be 1 to 64 of a-z 0-9 _ . -")
	}
	t, err := s.store.Tenant(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	each := func(ctx context.Context, fn func(billing.UsageRow) error) error {
		return s.ledger.EachUsage(ctx, t.ID, from, to, gran, meter, fn)
	}
	if httpx.WantsCSV(c) {
		c.Attachment(fmt.Sprintf("usage-%s-%s.csv", t.ID, from.Format("20060102")))
		return httpx.Stream(c, s.log, "text/csv; charset=utf-8", func(ctx context.Context, w *bufio.Writer) error {
			cw := csv.NewWriter(w)
			// New columns go at the end: spreadsheets and scripts read them by position.
			_ = cw.Write([]string{"period_start", "meter", "units", "requests", "rejected", "overage_units",
				"shadow_refused", "degraded"})
			err := each(ctx, func(r billing.UsageRow) error {
				return cw.Write([]string{r.PeriodStart.Format(time.RFC3339), r.Meter, httpx.Itoa(r.Units), httpx.Itoa(r.Requests),
					httpx.Itoa(r.Rejected), httpx.Itoa(r.OverageUnits), httpx.Itoa(r.ShadowRefused), httpx.Itoa(r.Degraded)})
			})
			cw.Flush()
			return err
		})
	}
	return httpx.Stream(c, s.log, fiber.MIMEApplicationJSON, func(ctx context.Context, w *bufio.Writer) error {
		return httpx.JSONItems(w, func(item func(any) error) error {
			return each(ctx, func(r billing.UsageRow) error { return item(r) })
		})
	})
}

// TenantSummary answers a tenant's usage exactly as the tenant's own
// GET /v1/usage would: limits, this month's days and meters, its tier's
// policies with their state, upgrade hint.
func (s *API) TenantSummary(c *fiber.Ctx) error {
	p, err := s.catalog.Principal(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	u, err := s.reports.For(c.UserContext(), p)
	if err != nil {
		return err
	}
	list, err := s.catalog.Policies(c.UserContext())
	if err != nil {
		return err
	}
	if u.Policies, err = s.reports.Policies(c.UserContext(), p, usage.TierPolicies(list, p.Tier.Slug)); err != nil {
		return err
	}
	return c.JSON(u)
}

// ListInvoices answers GET /admin/v1/invoices: the invoices of a period
// (YYYY-MM), as JSON or, when asked, CSV; a bad period is a 400.
func (s *API) ListInvoices(c *fiber.Ctx) error {
	raw := c.Query("period")
	period, err := httpx.ParsePeriod(raw)
	if err != nil {
		return err
	}
	if httpx.WantsCSV(c) {
		return httpx.InvoicesCSV(c, s.log, s.ledger, raw, period)
	}
	return httpx.Stream(c, s.log, fiber.MIMEApplicationJSON, func(ctx context.Context, w *bufio.Writer) error {
		return httpx.JSONItems(w, func(item func(any) error) error {
			return s.ledger.EachInvoice(ctx, period, func(inv billing.Invoice) error { return item(inv) })
		})
	})
}

// ---- audit

// ListAudit answers GET /admin/v1/audit: one page of the audit log, newest
// first, filtered by entity and entity_id.
func (s *API) ListAudit(c *fiber.Ctx) error {
	return paged(c, func(p quota.Page) ([]quota.AuditEntry, *string, error) {
		return s.store.ListAudit(c.UserContext(), c.Query("entity"), c.Query("entity_id"), p)
	})
}

// validWebhook accepts "" or an http(s) URL whose host may receive webhooks:
// not a loopback, link-local, private or reserved address, unless
// WebhookAllowPrivate. Names are not resolved here (what a name resolves to
// may change after any check); the worker checks each address it dials.
func (s *API) validWebhook(v string) error {
	if err := httpx.ValidURL("webhook_url", v); err != nil || v == "" || s.opts.WebhookAllowPrivate {
		return err
	}
	u, _ := url.Parse(v) // httpx.ValidURL parsed it
	if billing.CheckWebhookHost(u.Hostname()) != nil {
		return quota.FieldError("webhook_url", "must name a public host: loopback, link-local, private and reserved addresses "+
			"are refused (TOLLGATE_WEBHOOK_ALLOW_PRIVATE=true allows them)")
	}
	return nil
}

// ListAlerts lists threshold alerts with their delivery state, newest first.
func (s *API) ListAlerts(c *fiber.Ctx) error {
	return paged(c, func(p quota.Page) ([]billing.Alert, *string, error) {
		return s.alerts.List(c.UserContext(), c.Query("status"), p.Limit, p.Cursor)
	})
}
