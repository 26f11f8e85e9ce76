package pages

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// The actor recorded in the audit log for changes made in the console.
const consoleActor = "console"

// consoleFlash are the confirmations a console redirect may ask for (?ok=).
var consoleFlash = map[string]string{
	"saved":              "Tier saved.",
	"created":            "Created.",
	"revoked":            "Key revoked.",
	"granted":            "Grant added.",
	"pending":            "Grant recorded; it counts once the worker applies it, within one reconcile interval.",
	"tier":               "Tier changed.",
	"tier-reset":         "Tier changed; the day's and month's usage start again from zero.",
	"tier-reset-pending": "Tier changed; the day's and month's usage are reset by the worker within one reconcile interval.",
	"plan-pending":       "Tier change recorded: it takes effect at the start of the next billing period.",
	"plan-same":          "The tenant is on that tier already; any pending change is dropped.",
	"plan-cancelled":     "Pending tier change cancelled.",
	"calendar":           "Billing calendar saved.",
	"credited":           "Credit added.",
	"suspended":          "Tenant suspended: its keys are refused until it is resumed.",
	"resumed":            "Tenant resumed.",

	"policy-created": "Policy created: every node applies it within a second.",
	"policy-saved":   "Policy saved: every node applies it within a second.",
	"policy-deleted": "Policy deleted: every node drops it within a second.",
}

func (s *Pages) consoleView(c *fiber.Ctx, title, nav string, data any) view {
	return view{Title: title, Area: adminArea.name, Nav: nav, CSRF: sessionOf(c).CSRF, Who: "admin",
		Flash: consoleFlash[c.Query("ok")], Data: data}
}

// ConsoleHome redirects the console's root to its tenants page (303).
func (s *Pages) ConsoleHome(c *fiber.Ctx) error {
	return c.Redirect("/console/tenants", fiber.StatusSeeOther)
}

// ---- tiers

type tiersView struct {
	Tiers []quota.Tier
	Next  string // cursor of the next page, "" on the last
	// Warnings are, by tier slug, the tiers ranked below it that it
	// gives less than (tierWarnings).
	Warnings map[string][]string
}

// ConsoleTiers shows the tiers, up to 200 from the cursor given, with the
// warnings about each.
func (s *Pages) ConsoleTiers(c *fiber.Ctx) error {
	tiers, next, err := s.store.ListTiers(c.UserContext(), quota.Page{Limit: 200, Cursor: c.Query("cursor")})
	if err != nil {
		return err
	}
	all, err := s.store.Tiers(c.UserContext())
	if err != nil {
		return err
	}
	return s.render(c, fiber.StatusOK, "tiers", s.consoleView(c, "Tiers", "tiers",
		tiersView{Tiers: tiers, Next: strOr(next), Warnings: tierWarnings(all)}))
}

// tierWarnings returns, by tier slug, a warning for each tier ranked below
// it that it gives less than in some limit (quota.Shortfall): the upgrade
// hint never offers a tier to the tenants of one it gives less than, so
// such a rank is likely a mistake.
func tierWarnings(all []quota.Tier) map[string][]string {
	out := map[string][]string{}
	for _, t := range all {
		for _, below := range all {
			if below.Rank >= t.Rank {
				continue
			}
			if limit, less := quota.Shortfall(t, below); less {
				out[t.Slug] = append(out[t.Slug], fmt.Sprintf("Ranked above %s but gives less (%s): %s's tenants are never offered it as an upgrade.",
					below.Name, limitWords(limit), below.Name))
			}
		}
	}
	return out
}

// limitWords names a limit as the tier editor does.
func limitWords(l quota.LimitName) string {
	switch l {
	case quota.LimitBurst:
		return "burst limit"
	case quota.LimitBucket:
		return "token bucket"
	case quota.LimitDaily:
		return "daily quota"
	case quota.LimitMonthly:
		return "monthly quota, or the month's units with its overage"
	}
	return "the " + string(l) + " quota"
}

// strOr is *p, or "" for nil.
func strOr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// tierFormView is the tier editor: the values as typed and an error beside
// each field that has one.
type tierFormView struct {
	Create bool
	Slug   string
	Values map[string]string
	Errors formErrors
	// MeterRows are the meter quota rows shown (fields mq-k-*).
	MeterRows []mqRow
	// Warnings are the tier's, as the tier list shows them.
	Warnings []string
}

var tierFields = []string{"name", "rank", "price_cents", "burst_rate", "burst", "bucket_capacity", "bucket_refill_per_sec",
	"daily_quota", "monthly_quota", "overage", "overage_price_cents_per_1k", "max_overage_cents", "fail_open", "upgrade_url",
	"billing", "top_up_url"}

// tierValues writes a tier as the editor's field values; unlimited is "".
func tierValues(t quota.Tier) map[string]string {
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
	v := map[string]string{
		"slug": t.Slug, "name": t.Name, "rank": strconv.Itoa(t.Rank), "price_cents": httpx.Itoa(t.PriceCents),
		"burst_rate": f(t.BurstRate), "burst": i(t.Burst), "bucket_capacity": i(t.BucketCapacity),
		"bucket_refill_per_sec": f(t.BucketRefillPerSec), "daily_quota": i(t.DailyQuota), "monthly_quota": i(t.MonthlyQuota),
		"overage": string(t.Overage), "overage_price_cents_per_1k": httpx.Itoa(t.OveragePriceCentsPer1K), "upgrade_url": t.UpgradeURL,
		"max_overage_cents": i(t.MaxOverageCents), "billing": string(quota.BillingPostpaid), "top_up_url": t.TopUpURL,
	}
	if t.IsPrepaid() {
		v["billing"] = string(quota.BillingPrepaid)
	}
	if t.FailOpen {
		v["fail_open"] = "on"
	}
	meterQuotaValues(v, t.MeterQuotas)
	return v
}

// tierFromForm parses the editor's fields into a new tier with the admin
// API's decoder (httpx.TierFields, through decodeForm); errors go to errs
// by field. The
// domain's Validate, run by the store, checks the values themselves.
func tierFromForm(errs formErrors, f map[string]string) quota.Tier {
	t := quota.Tier{Slug: strings.TrimSpace(f["slug"]), Billing: quota.BillingPostpaid}
	var fields httpx.TierFields
	decodeForm(errs, f, &fields)
	// the billing mode: one of the select's two values (absent is postpaid);
	// what prepaid needs of the other fields is the domain's Validate's,
	// shown beside the field it names
	switch b := quota.Billing(f["billing"]); b {
	case "":
		fields.Billing.Set = false
	case quota.BillingPostpaid, quota.BillingPrepaid:
	default:
		errs.add(quota.FieldError("billing", "must be postpaid or prepaid"))
	}
	for _, name := range []string{"rank", "price_cents"} {
		if strings.TrimSpace(f[name]) == "" {
			errs.add(quota.FieldError(name, "is required"))
		}
	}
	// An empty field that cannot be null keeps its default, as an absent one
	// does (Fill): an empty overage price is 0.
	if len(errs) == 0 {
		if err := fields.Fill(&t); err != nil {
			errs.add(err)
		}
	}
	return t
}

// tierForm reads the whole editor: the tier's fields and its meter quotas,
// and the rows the meter quotas came from (for errors naming them).
func tierForm(errs formErrors, f map[string]string) (quota.Tier, []int) {
	t := tierFromForm(errs, f)
	var rows []int
	t.MeterQuotas, rows = meterQuotasFromForm(errs, f)
	return t, rows
}

// tierFormFields are the fields the editor posts.
var tierFormFields = append(append([]string{csrfField}, tierFields...), mqFields...)

// ConsoleTierForm shows the editor of the tier named by :slug; an unknown
// tier is a 404.
func (s *Pages) ConsoleTierForm(c *fiber.Ctx) error {
	t, err := s.store.Tier(c.UserContext(), c.Params("slug"))
	if err != nil {
		return err
	}
	all, err := s.store.Tiers(c.UserContext())
	if err != nil {
		return err
	}
	v := newTierFormView(false, t.Slug, tierValues(t), formErrors{})
	v.Warnings = tierWarnings(all)[t.Slug]
	return s.render(c, fiber.StatusOK, "tier", s.consoleView(c, "Tier "+t.Name, "tiers", v))
}

// ConsoleNewTier shows an empty tier editor, with the defaults of a new
// tier.
func (s *Pages) ConsoleNewTier(c *fiber.Ctx) error {
	return s.render(c, fiber.StatusOK, "tier", s.consoleView(c, "New tier", "tiers",
		newTierFormView(true, "", map[string]string{"overage": "block", "price_cents": "0", "overage_price_cents_per_1k": "0",
			"billing": string(quota.BillingPostpaid)}, formErrors{})))
}

// ConsoleSaveTier saves the editor: every field is replaced by the form's,
// then the tier is validated exactly as PATCH /admin/v1/tiers/{slug}
// validates it. A bad value is shown beside its field and changes nothing.
func (s *Pages) ConsoleSaveTier(c *fiber.Ctx) error {
	slug := c.Params("slug")
	f, err := readForm(c, tierFormFields...)
	if err != nil {
		return err
	}
	errs := formErrors{}
	t, rows := tierForm(errs, f)
	status := fiber.StatusBadRequest
	if len(errs) == 0 {
		saved, err := s.admin.UpdateTier(c.UserContext(), consoleActor, slug, func(cur *quota.Tier) error {
			t.Slug = cur.Slug
			*cur = t
			return nil
		})
		if err == nil {
			return c.Redirect("/console/tiers?ok=saved#tier-"+url.PathEscape(saved.Slug), fiber.StatusSeeOther)
		}
		switch quota.ErrorCode(err) {
		case quota.CodeInvalid:
		case quota.CodeConflict: // a rank another tier has
			status = fiber.StatusConflict
		default:
			return err
		}
		errs.add(meterQuotaError(err, rows))
	}
	return s.render(c, status, "tier", s.consoleView(c, "Tier "+slug, "tiers",
		newTierFormView(false, slug, f, errs)))
}

// ConsoleCreateTier creates a tier from the editor, validated as POST
// /admin/v1/tiers validates it, and redirects to the tiers page (303); a bad
// value is shown beside its field and creates nothing.
func (s *Pages) ConsoleCreateTier(c *fiber.Ctx) error {
	f, err := readForm(c, append([]string{"slug"}, tierFormFields...)...)
	if err != nil {
		return err
	}
	errs := formErrors{}
	t, rows := tierForm(errs, f)
	status, done, err := createFromForm(c, errs, func(err error) { errs.add(meterQuotaError(err, rows)) }, func() (string, error) {
		created, err := s.admin.CreateTier(c.UserContext(), consoleActor, t)
		return "/console/tiers?ok=created#tier-" + url.PathEscape(created.Slug), err
	})
	if done {
		return err
	}
	return s.render(c, status, "tier", s.consoleView(c, "New tier", "tiers",
		newTierFormView(true, "", f, errs)))
}

func newTierFormView(create bool, slug string, v map[string]string, errs formErrors) tierFormView {
	return tierFormView{Create: create, Slug: slug, Values: v, Errors: errs, MeterRows: meterRows(v)}
}

// createFromForm runs create for a form read without errors: on success it
// redirects to the page create names (done); a validation error (400) or
// a conflict (409, a name taken) goes beside its field through addErr and
// the form is to be shown again with the status returned; any other error
// is returned (done). A form with errors already creates nothing (400).
func createFromForm(c *fiber.Ctx, errs formErrors, addErr func(error), create func() (string, error)) (status int, done bool, err error) {
	if len(errs) > 0 {
		return fiber.StatusBadRequest, false, nil
	}
	to, err := create()
	if err == nil {
		return 0, true, c.Redirect(to, fiber.StatusSeeOther)
	}
	status = fiber.StatusBadRequest
	switch quota.ErrorCode(err) {
	case quota.CodeInvalid:
	case quota.CodeConflict:
		status = fiber.StatusConflict
	default:
		return 0, true, err
	}
	addErr(err)
	return status, false, nil
}

// ---- tenants

type tenantRow struct {
	Tenant       quota.Tenant
	TierName     string
	Month        billing.Totals
	MonthlyQuota *int64 // after overrides; nil when unlimited
}

type tenantsView struct {
	Query  string
	Rows   []tenantRow
	Next   string
	Tiers  []quota.Tier
	Values map[string]string // the create form
	Errors formErrors
}

// ConsoleTenants shows the tenants, with the form that creates one.
func (s *Pages) ConsoleTenants(c *fiber.Ctx) error {
	return s.renderTenants(c, fiber.StatusOK, map[string]string{}, formErrors{})
}

// renderTenants lists tenants matching ?q= (a name substring or an id) with
// their tier, status and this month's usage, flushed plus pending: the sum
// of the tenant's /v1/usage daily rows.
func (s *Pages) renderTenants(c *fiber.Ctx, status int, values map[string]string, errs formErrors) error {
	ctx := c.UserContext()
	q := strings.TrimSpace(c.Query("q"))
	if len(q) > quota.MaxNameLen {
		return quota.FieldError("q", "must be at most %d characters", quota.MaxNameLen)
	}
	tenants, next, err := s.store.ListTenants(ctx, quota.TenantFilter{Query: q}, quota.Page{Limit: 50, Cursor: c.Query("cursor")})
	if err != nil {
		return err
	}
	tiers, err := s.store.Tiers(ctx)
	if err != nil {
		return err
	}
	bySlug := map[string]quota.Tier{}
	for _, t := range tiers {
		bySlug[t.Slug] = t
	}
	ids := make([]string, len(tenants))
	for i, t := range tenants {
		ids[i] = t.ID
	}
	totals, err := s.reports.MonthTotals(ctx, ids)
	if err != nil {
		return err
	}
	v := tenantsView{Query: q, Next: strOr(next), Tiers: tiers, Values: values, Errors: errs}
	for _, t := range tenants {
		tier := bySlug[t.Tier]
		v.Rows = append(v.Rows, tenantRow{Tenant: t, TierName: tier.Name, Month: totals[t.ID],
			MonthlyQuota: t.Overrides.Apply(tier.Limits).MonthlyQuota})
	}
	return s.render(c, status, "tenants", s.consoleView(c, "Tenants", "tenants", v))
}

// ConsoleCreateTenant creates a tenant from the form, as POST
// /admin/v1/tenants does, and redirects to it (303); a bad value is shown
// beside its field and creates nothing.
func (s *Pages) ConsoleCreateTenant(c *fiber.Ctx) error {
	f, err := readForm(c, csrfField, "name", "tier")
	if err != nil {
		return err
	}
	t, err := s.admin.CreateTenant(c.UserContext(), consoleActor, quota.Tenant{Name: strings.TrimSpace(f["name"]), Tier: f["tier"]})
	if err != nil {
		if quota.ErrorCode(err) != quota.CodeInvalid {
			return err
		}
		errs := formErrors{}
		errs.add(err)
		return s.renderTenants(c, fiber.StatusBadRequest, f, errs)
	}
	return c.Redirect("/console/tenants/"+t.ID+"?ok=created", fiber.StatusSeeOther)
}

// consoleTenantView is a tenant's page: its usage as the tenant sees it,
// its keys and grants, and the forms that change them.
type consoleTenantView struct {
	View     tenantView
	Keys     []quota.APIKey
	MoreKeys bool
	Grants   []quota.Grant
	Tiers    []quota.Tier
	Issued   *quota.IssuedKey // a key just issued, with the secret shown this once
	Credits  billing.CreditPage
	// CreditKey is the credit form's idempotency key, new on each drawing.
	CreditKey string
	// PendingTier is the name of the pending change's tier ("" for none).
	PendingTier string
	Values      map[string]string
	Errors      formErrors
}

// tenantPage gathers a tenant's page: its usage, keys, grants and the tiers
// to change to.
func (s *Pages) tenantPage(c *fiber.Ctx, id string) (consoleTenantView, error) {
	ctx := c.UserContext()
	p, err := s.catalog.Principal(ctx, id)
	if err != nil {
		return consoleTenantView{}, err
	}
	tv, err := s.tenantViewOf(ctx, p)
	if err != nil {
		return consoleTenantView{}, err
	}
	tv.Console = true
	if tv.Policies, err = s.tenantPolicies(c, p); err != nil {
		return consoleTenantView{}, err
	}
	keys, nextKeys, err := s.store.ListKeys(ctx, id, quota.Page{Limit: 200})
	if err != nil {
		return consoleTenantView{}, err
	}
	grants, _, err := s.store.ListGrants(ctx, id, quota.Page{Limit: 20})
	if err != nil {
		return consoleTenantView{}, err
	}
	tiers, err := s.catalog.Tiers(ctx)
	if err != nil {
		return consoleTenantView{}, err
	}
	credits, err := s.creditsOf(ctx, id)
	if err != nil {
		return consoleTenantView{}, err
	}
	v := consoleTenantView{View: tv, Keys: keys, MoreKeys: nextKeys != nil, Grants: grants, Tiers: tiers,
		Credits: credits, CreditKey: newFormKey(), Errors: formErrors{},
		Values: map[string]string{"billing_anchor_day": strconv.Itoa(tv.Billing.AnchorDay), "time_zone": tv.Billing.TimeZone,
			"spend_cap": "tier"}}
	if o := p.Tenant.Overrides.MaxOverageCents; o.Set && o.Value == nil {
		v.Values["spend_cap"] = "none"
	} else if o.Set {
		v.Values["spend_cap"], v.Values["max_overage_cents"] = "cap", strconv.FormatInt(*o.Value, 10)
	}
	if pc := p.Tenant.PendingChange; pc != nil {
		v.PendingTier = pc.Tier
		for _, t := range tiers {
			if t.Slug == pc.Tier {
				v.PendingTier = t.Name
			}
		}
	}
	return v, nil
}

func (s *Pages) showTenant(c *fiber.Ctx, status int, v consoleTenantView) error {
	pv := s.consoleView(c, v.View.Tenant.Name, "tenants", v)
	if v.Issued != nil {
		pv.Flash = ""
	}
	return s.render(c, status, "tenant", pv)
}

// ConsoleTenant shows the page of the tenant named by :id; an unknown
// tenant is a 404.
func (s *Pages) ConsoleTenant(c *fiber.Ctx) error {
	v, err := s.tenantPage(c, c.Params("id"))
	if err != nil {
		return err
	}
	return s.showTenant(c, fiber.StatusOK, v)
}

// tenantFormError re-renders the tenant page with err beside its field, or
// returns err when it is not a validation error.
func (s *Pages) tenantFormError(c *fiber.Ctx, id string, f map[string]string, err error) error {
	if quota.ErrorCode(err) != quota.CodeInvalid {
		return err
	}
	errs := formErrors{}
	errs.add(err)
	return s.tenantFormErrors(c, id, f, errs)
}

func (s *Pages) tenantFormErrors(c *fiber.Ctx, id string, f map[string]string, errs formErrors) error {
	v, err := s.tenantPage(c, id)
	if err != nil {
		return err
	}
	for k, val := range f {
		v.Values[k] = val
	}
	v.Errors = errs
	if k := f["idempotency_key"]; validFormKey(k) && errs["form"] == "" {
		v.CreditKey = k // the same credit, should the corrected form be sent twice
	}
	return s.showTenant(c, fiber.StatusBadRequest, v)
}

// ConsoleIssueKey issues a key and shows its secret on the answer itself,
// never in a URL or a later page. The page is gathered first, so that a key
// is issued only when its secret can be shown.
func (s *Pages) ConsoleIssueKey(c *fiber.Ctx) error {
	id := c.Params("id")
	f, err := readForm(c, csrfField, "name")
	if err != nil {
		return err
	}
	v, err := s.tenantPage(c, id)
	if err != nil {
		return err
	}
	k, err := s.admin.IssueKey(c.UserContext(), consoleActor, id, strings.TrimSpace(f["name"]))
	if err != nil {
		return s.tenantFormError(c, id, f, err)
	}
	v.Issued = &k
	if !v.MoreKeys {
		v.Keys = append(v.Keys, k.APIKey)
	}
	c.Location("/console/tenants/" + url.PathEscape(id) + "#keys") // where the new key is listed
	return s.showTenant(c, fiber.StatusCreated, v)
}

// ConsoleRevokeKey revokes the key named by :id, as DELETE
// /admin/v1/keys/{id} does, and redirects to its tenant's page (303).
func (s *Pages) ConsoleRevokeKey(c *fiber.Ctx) error {
	if _, err := readForm(c, csrfField); err != nil {
		return err
	}
	k, err := s.admin.RevokeKey(c.UserContext(), consoleActor, c.Params("id"))
	if err != nil {
		return err
	}
	return c.Redirect("/console/tenants/"+k.TenantID+"?ok=revoked#keys", fiber.StatusSeeOther)
}

// ConsoleGrant records a quota grant of units for the period given and
// redirects to the tenant's grants (303); a bad value is shown beside its
// field and grants nothing.
func (s *Pages) ConsoleGrant(c *fiber.Ctx) error {
	id := c.Params("id")
	f, err := readForm(c, csrfField, "period", "units")
	if err != nil {
		return err
	}
	errs := formErrors{}
	period := f["period"]
	units := intField(errs, f, "units", false)
	if len(errs) > 0 {
		return s.tenantFormErrors(c, id, f, errs)
	}
	g, _, err := s.grants.Create(c.UserContext(), consoleActor, id, "", period, *units)
	if err != nil {
		return s.tenantFormError(c, id, f, err)
	}
	ok := "granted"
	if !g.Applied { // Redis did not take it: the worker applies it
		ok = "pending"
	}
	return c.Redirect("/console/tenants/"+url.PathEscape(id)+"?ok="+ok+"#grants", fiber.StatusSeeOther)
}

// consoleUpdateTenant changes one field of a tenant (tier or status) as
// PATCH /admin/v1/tenants/{id} does.
func (s *Pages) consoleUpdateTenant(c *fiber.Ctx, field string, change func(*quota.Tenant, string), ok func(quota.Tenant) string) error {
	id := c.Params("id")
	f, err := readForm(c, csrfField, field)
	if err != nil {
		return err
	}
	t, err := s.admin.UpdateTenant(c.UserContext(), consoleActor, id, func(t *quota.Tenant) error {
		change(t, f[field])
		return nil
	})
	if err != nil {
		return s.tenantFormError(c, id, f, err)
	}
	return c.Redirect("/console/tenants/"+t.ID+"?ok="+ok(t), fiber.StatusSeeOther)
}

// ConsoleSetStatus suspends or reactivates the tenant named by :id, as
// PATCH /admin/v1/tenants/{id} with status does, and redirects to it (303).
func (s *Pages) ConsoleSetStatus(c *fiber.Ctx) error {
	return s.consoleUpdateTenant(c, "status", func(t *quota.Tenant, v string) { t.Status = quota.TenantStatus(v) },
		func(t quota.Tenant) string {
			if t.Status == quota.StatusSuspended {
				return "suspended"
			}
			return "resumed"
		})
}

// ---- invoices and alerts

type invoiceRow struct {
	billing.Invoice
	TenantName string
}

type invoicesView struct {
	Period     string
	Rows       []invoiceRow
	Next       string // tenant id to continue after
	Count      int64
	TotalCents int64
}

// tenantNames returns the name of each item's tenant, in the items' order,
// for the lists that show them.
func tenantNames[T any](s *Pages, c *fiber.Ctx, items []T, tenantID func(T) string) ([]string, error) {
	out := make([]string, len(items))
	if len(items) == 0 {
		return out, nil
	}
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = tenantID(it)
	}
	ts, err := s.store.TenantsByID(c.UserContext(), ids)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]string, len(ts))
	for _, t := range ts {
		byID[t.ID] = t.Name
	}
	for i, id := range ids {
		out[i] = byID[id]
	}
	return out, nil
}

// consolePeriod reads ?period=, by default the current month.
func (s *Pages) consolePeriod(c *fiber.Ctx) (string, error) {
	raw := c.Query("period")
	if raw == "" {
		return quota.MonthStart(s.now()).Format("2006-01"), nil
	}
	_, err := httpx.ParsePeriod(raw)
	return raw, err
}

// ConsoleInvoices shows the invoices of the month asked for (?period=
// YYYY-MM, by default the current UTC month); a bad period is a 400.
func (s *Pages) ConsoleInvoices(c *fiber.Ctx) error {
	raw, err := s.consolePeriod(c)
	if err != nil {
		return err
	}
	period, _ := httpx.ParsePeriod(raw)
	after := c.Query("after")
	if after != "" && !quota.ValidID(after) {
		return quota.FieldError("after", "must be a tenant id")
	}
	invs, more, err := s.ledger.InvoicePage(c.UserContext(), period, after, 100)
	if err != nil {
		return err
	}
	count, total, err := s.ledger.InvoiceSummary(c.UserContext(), period)
	if err != nil {
		return err
	}
	names, err := tenantNames(s, c, invs, func(inv billing.Invoice) string { return inv.TenantID })
	if err != nil {
		return err
	}
	v := invoicesView{Period: raw, Count: count, TotalCents: total}
	for i, inv := range invs {
		v.Rows = append(v.Rows, invoiceRow{Invoice: inv, TenantName: names[i]})
	}
	if more {
		v.Next = invs[len(invs)-1].TenantID
	}
	return s.render(c, fiber.StatusOK, "invoices", s.consoleView(c, "Invoices "+raw, "invoices", v))
}

// ConsoleInvoicesCSV downloads the month's invoices as the admin API's CSV.
func (s *Pages) ConsoleInvoicesCSV(c *fiber.Ctx) error {
	raw, err := s.consolePeriod(c)
	if err != nil {
		return err
	}
	period, _ := httpx.ParsePeriod(raw)
	return httpx.InvoicesCSV(c, s.log, s.ledger, raw, period)
}

type alertRow struct {
	billing.Alert
	TenantName string
}

type alertsView struct {
	Status string
	Rows   []alertRow
	Next   string
}

// ConsoleAlerts shows the webhook alerts, 50 a page from the cursor given,
// filtered by status.
func (s *Pages) ConsoleAlerts(c *fiber.Ctx) error {
	status := c.Query("status")
	alerts, next, err := s.alerts.List(c.UserContext(), status, 50, c.Query("cursor"))
	if err != nil {
		return err
	}
	names, err := tenantNames(s, c, alerts, func(a billing.Alert) string { return a.TenantID })
	if err != nil {
		return err
	}
	v := alertsView{Status: status, Next: strOr(next)}
	for i, a := range alerts {
		v.Rows = append(v.Rows, alertRow{Alert: a, TenantName: names[i]})
	}
	return s.render(c, fiber.StatusOK, "alerts", s.consoleView(c, "Alerts", "alerts", v))
}
