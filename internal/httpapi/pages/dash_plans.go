package pages

// The console's forms of the plans (API.md "Plans (v2)"): a tier's quotas
// per meter (part of the tier editor), a tenant's billing calendar, its
// prepaid credits and its tier changes now or at the next period.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/quota"
)

// ---- meter quotas in the tier editor

// The fields of one meter quota row k of the tier editor are "mq-k-<field>",
// <field> the JSON member (meter, daily_quota, monthly_quota, overage,
// overage_price_cents_per_1k) or "remove", a checkbox.
var mqFieldNames = []string{"meter", "daily_quota", "monthly_quota", "overage", "overage_price_cents_per_1k", "remove"}

func mqField(row int, field string) string { return fmt.Sprintf("mq-%d-%s", row, field) }

// mqFields are every meter quota field the editor may post: MaxMeterQuotas
// rows.
var mqFields = func() []string {
	var out []string
	for row := range quota.MaxMeterQuotas {
		for _, f := range mqFieldNames {
			out = append(out, mqField(row, f))
		}
	}
	return out
}()

// meterQuotaValues writes qs as editor rows, then one blank row to add a
// quota (while there is room).
func meterQuotaValues(v map[string]string, qs []quota.MeterQuota) {
	i := func(p *int64) string {
		if p == nil {
			return ""
		}
		return strconv.FormatInt(*p, 10)
	}
	for row, q := range qs {
		v[mqField(row, "meter")] = q.Meter
		v[mqField(row, "daily_quota")] = i(q.DailyQuota)
		v[mqField(row, "monthly_quota")] = i(q.MonthlyQuota)
		v[mqField(row, "overage")] = string(q.Overage)
		v[mqField(row, "overage_price_cents_per_1k")] = strconv.FormatInt(q.OveragePriceCentsPer1K, 10)
	}
}

// mqRow is one meter quota row of the editor: its index k (fields
// mq-k-*) and whether nothing is typed in it (the row that adds one).
type mqRow struct {
	Index int
	Blank bool
}

// meterRows are the rows the editor shows for the values v: every row
// given, and a blank one to add a quota while there is room.
func meterRows(v map[string]string) []mqRow {
	n := 0
	for row := range quota.MaxMeterQuotas {
		for _, f := range mqFieldNames {
			if _, ok := v[mqField(row, f)]; ok {
				n = row + 1
			}
		}
	}
	if n < quota.MaxMeterQuotas && !mqBlank(v, n-1) {
		n++
	}
	out := make([]mqRow, n)
	for k := range out {
		out[k] = mqRow{Index: k, Blank: mqBlank(v, k)}
	}
	return out
}

// mqBlank reports whether row has nothing typed in it (the overage select
// and a zero price do not count): a row left empty adds nothing.
func mqBlank(f map[string]string, row int) bool {
	if row < 0 {
		return false
	}
	for _, name := range []string{"meter", "daily_quota", "monthly_quota"} {
		if strings.TrimSpace(f[mqField(row, name)]) != "" {
			return false
		}
	}
	p := strings.TrimSpace(f[mqField(row, "overage_price_cents_per_1k")])
	return p == "" || p == "0"
}

// meterQuotasFromForm reads the editor's meter quota rows: blank rows and
// rows marked remove are left out. It returns the list and, for each of its
// entries, the row it came from, which errors naming meter_quotas[k] are
// shown beside. The domain's ValidateMeterQuotas runs here too, so that its
// error lands beside the row's field.
func meterQuotasFromForm(errs formErrors, f map[string]string) ([]quota.MeterQuota, []int) {
	qs := []quota.MeterQuota{}
	var rows []int
	for row := range quota.MaxMeterQuotas {
		switch f[mqField(row, "remove")] {
		case "":
		case "on":
			continue
		default:
			errs.add(quota.FieldError(mqField(row, "remove"), "must be on or absent"))
			continue
		}
		if mqBlank(f, row) {
			continue
		}
		q := quota.MeterQuota{Meter: strings.TrimSpace(f[mqField(row, "meter")]), Overage: quota.Overage(f[mqField(row, "overage")])}
		if q.Overage == "" {
			q.Overage = quota.OverageBlock
		}
		q.DailyQuota = intField(errs, f, mqField(row, "daily_quota"), true)
		q.MonthlyQuota = intField(errs, f, mqField(row, "monthly_quota"), true)
		if p := intField(errs, f, mqField(row, "overage_price_cents_per_1k"), true); p != nil {
			q.OveragePriceCentsPer1K = *p
		}
		qs = append(qs, q)
		rows = append(rows, row)
	}
	if len(errs) == 0 {
		if err := quota.ValidateMeterQuotas(qs); err != nil {
			errs.add(meterQuotaError(err, rows))
		}
	}
	return qs, rows
}

// mqErrField is the domain's name of a meter quota's field.
var mqErrField = regexp.MustCompile(`^meter_quotas\[(\d+)\]\.([a-z_0-9]+)$`)

// meterQuotaError renames an error on meter_quotas[k].field to the
// editor's field of the row entry k came from; other errors pass as they
// are ("meter_quotas" itself, too many, goes to the form's summary).
func meterQuotaError(err error, rows []int) error {
	var qe *quota.Error
	if !errors.As(err, &qe) {
		return err
	}
	if qe.Field == "meter_quotas" {
		return quota.Errorf(qe.Code, "meter quotas: %s", qe.Message)
	}
	m := mqErrField.FindStringSubmatch(qe.Field)
	if m == nil {
		return err
	}
	k, _ := strconv.Atoi(m[1])
	if k >= len(rows) {
		return err
	}
	return &quota.Error{Code: qe.Code, Field: mqField(rows[k], m[2]), Message: qe.Message}
}

// ---- a tenant's billing calendar

// ConsoleSetCalendar changes a tenant's billing anchor day and time zone,
// as PATCH /admin/v1/tenants/{id} does; a bad value is shown beside its
// field and changes nothing.
func (s *Pages) ConsoleSetCalendar(c *fiber.Ctx) error {
	id := c.Params("id")
	f, err := readForm(c, csrfField, "billing_anchor_day", "time_zone")
	if err != nil {
		return err
	}
	errs := formErrors{}
	day := intField(errs, f, "billing_anchor_day", false)
	if day != nil && (*day < 1 || *day > quota.MaxAnchorDay) {
		errs.add(quota.FieldError("billing_anchor_day", "must be a whole number between 1 and %d", quota.MaxAnchorDay))
	}
	zone := strings.TrimSpace(f["time_zone"])
	if zone == "" {
		errs.add(quota.FieldError("time_zone", "is required: an IANA time zone name such as UTC or Europe/Berlin"))
	} else if _, err := quota.LoadZone(zone); err != nil {
		errs.add(err)
	}
	if len(errs) > 0 {
		return s.tenantFormErrors(c, id, f, errs)
	}
	t, err := s.admin.UpdateTenant(c.UserContext(), consoleActor, id, func(t *quota.Tenant) error {
		t.BillingAnchorDay, t.TimeZone = int(*day), zone
		return nil
	})
	if err != nil {
		return s.tenantFormError(c, id, f, err)
	}
	return c.Redirect("/console/tenants/"+t.ID+"?ok=calendar#calendar", fiber.StatusSeeOther)
}

// ---- credits

// creditAmount reads an amount of US dollars, "25", "25.5" or "1,250.00",
// as cents; at most two decimals.
var creditAmountRE = regexp.MustCompile(`^(\d{1,3}(,\d{3})+|\d+)(\.\d{1,2})?$`)

func creditAmount(errs formErrors, f map[string]string) int64 {
	v := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(f["amount"]), "$"))
	if v == "" {
		errs.add(quota.FieldError("amount", "is required, in dollars, such as 25 or 25.50"))
		return 0
	}
	if !creditAmountRE.MatchString(v) {
		errs.add(quota.FieldError("amount", "must be a positive amount of dollars with at most two decimals, such as 25 or 25.50"))
		return 0
	}
	whole, frac, _ := strings.Cut(strings.ReplaceAll(v, ",", ""), ".")
	frac = (frac + "00")[:2]
	d, err1 := strconv.ParseInt(whole, 10, 64)
	cts, err2 := strconv.ParseInt(frac, 10, 64)
	if err1 != nil || err2 != nil || d > quota.MaxPrice/100 || d*100+cts > quota.MaxPrice {
		errs.add(quota.FieldError("amount", "must be at most %s", formatMoney(quota.MaxPrice)))
		return 0
	}
	if d*100+cts < 1 {
		errs.add(quota.FieldError("amount", "must be at least $0.01"))
		return 0
	}
	return d*100 + cts
}

// ConsoleAddCredit grants prepaid credit, as POST
// /admin/v1/tenants/{id}/credits does. The form carries an idempotency key
// made when the page was drawn, so that a form sent twice (a double click,
// a reload) records one credit.
func (s *Pages) ConsoleAddCredit(c *fiber.Ctx) error {
	id := c.Params("id")
	f, err := readForm(c, csrfField, "amount", "reason", "expires_on", "idempotency_key")
	if err != nil {
		return err
	}
	errs := formErrors{}
	in := billing.NewCredit{AmountCents: creditAmount(errs, f), Reason: strings.TrimSpace(f["reason"])}
	if in.Reason == "" {
		errs.add(quota.FieldError("reason", "is required: it becomes the invoice line \"Credit: <reason>\""))
	}
	if v := strings.TrimSpace(f["expires_on"]); v != "" {
		d, err := time.Parse(time.DateOnly, v)
		if err != nil {
			errs.add(quota.FieldError("expires_on", "must be a date such as 2027-01-31"))
		} else {
			in.ExpiresAt = &d
		}
	}
	key := f["idempotency_key"]
	if key != "" && !validFormKey(key) {
		errs.add(quota.FieldError("form", "the form is stale: reload the page"))
	}
	if len(errs) > 0 {
		return s.tenantFormErrors(c, id, f, errs)
	}
	e, created, err := s.ledger.CreateCredit(c.UserContext(), consoleActor, id, key, in, s.now())
	if err != nil {
		if e := creditFieldError(err); e != nil {
			return s.tenantFormError(c, id, f, e)
		}
		return s.tenantFormError(c, id, f, err)
	}
	if created {
		s.catalog.Credited(c.UserContext(), e.TenantID)
	}
	return c.Redirect("/console/tenants/"+url.PathEscape(id)+"?ok=credited#credits", fiber.StatusSeeOther)
}

// creditFieldError renames the ledger's field names to the form's, nil
// when err names none of them.
func creditFieldError(err error) error {
	var qe *quota.Error
	if !errors.As(err, &qe) {
		return nil
	}
	field := map[string]string{"amount_cents": "amount", "expires_at": "expires_on", "Idempotency-Key": "form"}[qe.Field]
	if field == "" {
		return nil
	}
	code := qe.Code
	if code == quota.CodeMismatch {
		code = quota.CodeInvalid
	}
	return &quota.Error{Code: code, Field: field, Message: qe.Message}
}

// newFormKey is a random idempotency key for one drawing of a form.
func newFormKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validFormKey(k string) bool {
	if len(k) != 32 {
		return false
	}
	_, err := hex.DecodeString(k)
	return err == nil
}

// creditsOf is the tenant's credit ledger, its 50 latest entries, and its
// balance now.
func (s *Pages) creditsOf(ctx context.Context, tenantID string) (billing.CreditPage, error) {
	p, err := s.ledger.Credits(ctx, tenantID, s.now(), quota.Page{Limit: 50})
	return p, s.unavailable(err)
}

// ---- tier changes

// ConsoleSetTier changes a tenant's tier as PATCH /admin/v1/tenants/{id}
// with tier, effective and quota does. Without effective (the form before
// it had one) the change is made now, as it always was here.
func (s *Pages) ConsoleSetTier(c *fiber.Ctx) error {
	id := c.Params("id")
	f, err := readForm(c, csrfField, "tier", "effective", "quota")
	if err != nil {
		return err
	}
	plan := quota.PlanRequest{Tier: f["tier"], Effective: quota.Effective(f["effective"]), Quota: quota.QuotaMode(f["quota"])}
	if plan.Effective == "" {
		plan.Effective = quota.EffectiveNow
	}
	if err := plan.Validate(); err != nil {
		return s.tenantFormError(c, id, f, err)
	}
	if s.plans == nil {
		return quota.Errorf(quota.CodeUnavailable, "tier changes are not available on this server")
	}
	before, err := s.catalog.Principal(c.UserContext(), id)
	if err != nil {
		return err
	}
	t, reset, err := s.plans.Change(c.UserContext(), consoleActor, id, &plan, func(*quota.Tenant) error { return nil })
	if err != nil {
		return s.tenantFormError(c, id, f, err)
	}
	ok := "tier"
	switch {
	case t.Tier == before.Tenant.Tier && t.PendingChange != nil:
		ok = "plan-pending"
	case t.Tier == before.Tenant.Tier:
		ok = "plan-same"
	case reset == catalog.ResetPending:
		ok = "tier-reset-pending"
	case reset == catalog.ResetApplied:
		ok = "tier-reset"
	}
	return c.Redirect("/console/tenants/"+t.ID+"?ok="+ok+"#plan", fiber.StatusSeeOther)
}

// ConsoleCancelPlan drops the tenant's pending tier change (pending_change
// null, as the admin API's PATCH takes it); the tier stays as it is.
func (s *Pages) ConsoleCancelPlan(c *fiber.Ctx) error {
	id := c.Params("id")
	if _, err := readForm(c, csrfField); err != nil {
		return err
	}
	if s.plans == nil {
		return quota.Errorf(quota.CodeUnavailable, "tier changes are not available on this server")
	}
	t, _, err := s.plans.Change(c.UserContext(), consoleActor, id, nil, func(t *quota.Tenant) error {
		t.PendingChange = nil
		return nil
	})
	if err != nil {
		return err
	}
	return c.Redirect("/console/tenants/"+t.ID+"?ok=plan-cancelled#plan", fiber.StatusSeeOther)
}

// ---- a tenant's spend cap

// ConsoleSetSpendCap sets or clears the tenant's override of its tier's
// spend cap (overrides.max_overage_cents of PATCH /admin/v1/tenants/{id}):
// spend_cap "tier" keeps the tier's, "none" lifts any cap, "cap" sets
// max_overage_cents, in cents.
func (s *Pages) ConsoleSetSpendCap(c *fiber.Ctx) error {
	id := c.Params("id")
	f, err := readForm(c, csrfField, "spend_cap", "max_overage_cents")
	if err != nil {
		return err
	}
	errs := formErrors{}
	var override quota.Optional[int64]
	switch f["spend_cap"] {
	case "tier":
	case "none":
		override = quota.Set[int64](nil)
	case "cap":
		if n := intField(errs, f, "max_overage_cents", false); n != nil {
			override = quota.Set(n)
		}
	default:
		errs.add(quota.FieldError("spend_cap", `must be "tier", "none" or "cap"`))
	}
	if len(errs) > 0 {
		return s.tenantFormErrors(c, id, f, errs)
	}
	t, err := s.admin.UpdateTenant(c.UserContext(), consoleActor, id, func(t *quota.Tenant) error {
		t.Overrides.MaxOverageCents = override
		return nil
	})
	if err != nil {
		var qe *quota.Error
		if errors.As(err, &qe) && qe.Field == "overrides.max_overage_cents" {
			err = &quota.Error{Code: qe.Code, Field: "max_overage_cents", Message: qe.Message}
		}
		return s.tenantFormError(c, id, f, err)
	}
	return c.Redirect("/console/tenants/"+t.ID+"?ok=spend-cap#spend-cap-form", fiber.StatusSeeOther)
}
