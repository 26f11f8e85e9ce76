package pages

import (
	"context"
	"fmt"
	"html/template"
	"slices"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/usage"
)

// tenantView is one tenant's usage as the dashboard and the console's tenant
// page show it: the numbers of GET /v1/usage, arranged for a page.
type tenantView struct {
	// Console is true on the console's tenant page (the words are the
	// admin's, not the tenant's)
	Console   bool
	Tenant    quota.Tenant
	Tier      quota.Tier
	Limits    quota.Limits // after overrides; the rates of the burst limits
	Usage     usage.Report
	Burst     *usage.Limit // nil when the limit is off
	Bucket    *usage.Limit
	Daily     *usage.Limit
	Monthly   *usage.Limit
	MonthName string
	Chart     template.HTML
	Days      usageTable // this month's days
	Meters    usageTable // this month's meters
	Invoices  []billing.Invoice
	// Policies are the policies of the tenant's tier with their state
	// (the dashboard's; the console's tenant page leaves them out).
	Policies policyStates
	// MeterQuotas are the tier's quotas per meter with their state.
	MeterQuotas []meterQuotaView
	Billing     billingView
	// Credit is a prepaid tenant's credit row of /v1/usage (in cents: the
	// credit its period's invoice may draw, and what admissions may still
	// draw); nil for a postpaid tenant.
	Credit *usage.Limit
	// TopUpURL is the prepaid tier's top-up URL when it is an http or
	// https URL, else "" (no link is drawn).
	TopUpURL string
}

// meterQuotaView is one quota of a meter: its terms and the "<meter>.daily"
// and "<meter>.monthly" limits of /v1/usage (nil when it has none).
type meterQuotaView struct {
	quota.MeterQuota
	Daily, Monthly *usage.Limit
}

// billingView is the tenant's billing period, in its time zone, its credit
// balance, and its spend cap with the month's overage so far.
type billingView struct {
	Period             string // "Nov 15 – Dec 15, 2026 (America/New_York)"
	PeriodStart        time.Time
	PeriodEnd          time.Time
	AnchorDay          int
	TimeZone           string
	CreditBalanceCents int64
	SpendCapCents      *int64 // after overrides; nil: no cap
	Bills              bool   // some overage is billed (tier or a meter)
	OverageCents       int64  // of the period's draft invoice
	OverageKnown       bool   // a draft invoice of the period exists
	OverageAsOf        time.Time
	// PendingTier and PendingAt describe the tenant's pending tier change
	// ("" when there is none): the tier's name and when, in its zone.
	PendingTier, PendingAt string
}

// periodLabel writes a billing period in its zone: "Nov 15 – Dec 15, 2026
// (America/New_York)", the end being the next period's first day; the
// years are both written when they differ.
func periodLabel(start, end time.Time, loc *time.Location) string {
	s, e := start.In(loc), end.In(loc)
	if s.Year() != e.Year() {
		return fmt.Sprintf("%s – %s (%s)", s.Format("Jan 2, 2006"), e.Format("Jan 2, 2006"), loc)
	}
	return fmt.Sprintf("%s – %s (%s)", s.Format("Jan 2"), e.Format("Jan 2, 2006"), loc)
}

// billingOf gathers the tenant's billing facts at now. The overage so far
// is that of the period's draft invoice, which the worker redraws every few
// minutes: the live counters know units, not their price.
func (s *Pages) billingOf(ctx context.Context, p catalog.Principal, invoices []billing.Invoice) (billingView, error) {
	loc, err := quota.LoadZone(p.Tenant.TimeZone)
	if err != nil {
		loc = time.UTC // a zone the store let in but this binary does not know
	}
	cal := quota.Calendar{AnchorDay: p.Tenant.BillingAnchorDay, Zone: loc}
	start, end := cal.Period(s.now())
	b := billingView{Period: periodLabel(start, end, loc), PeriodStart: start, PeriodEnd: end,
		AnchorDay: max(p.Tenant.BillingAnchorDay, 1), TimeZone: loc.String(), SpendCapCents: p.Limits.MaxOverageCents,
		Bills: p.Tier.Overage == quota.OverageBill || slices.ContainsFunc(p.Tier.MeterQuotas, quota.MeterQuota.Bills)}
	credits, err := s.ledger.Credits(ctx, p.Tenant.ID, s.now(), quota.Page{Limit: 1})
	if err != nil {
		return b, s.unavailable(err)
	}
	b.CreditBalanceCents = credits.BalanceCents
	if pc := p.Tenant.PendingChange; pc != nil {
		b.PendingTier, b.PendingAt = pc.Tier, pc.EffectiveAt.In(loc).Format("Jan 2, 2006 15:04")+" ("+loc.String()+")"
		tiers, err := s.catalog.Tiers(ctx)
		if err != nil {
			return b, s.unavailable(err)
		}
		for _, t := range tiers {
			if t.Slug == pc.Tier {
				b.PendingTier = t.Name
			}
		}
	}
	period := start.In(loc).Format("2006-01")
	for _, inv := range invoices {
		if inv.Period != period {
			continue
		}
		b.OverageKnown, b.OverageAsOf = true, inv.UpdatedAt
		for _, l := range inv.Lines {
			if strings.Contains(l.Kind, "overage") {
				b.OverageCents += l.AmountCents
			}
		}
	}
	return b, nil
}

// usageTable is one table of usage rows (days or meters) for the "usage"
// partial: the table's id, the header of its first column and its rows.
type usageTable struct {
	ID, Key string
	Rows    []usageRow
}

// usageRow is a day or a meter of a usageTable.
type usageRow struct {
	Key                       string
	Units, Requests, Rejected int64
}

func (s *Pages) tenantViewOf(ctx context.Context, p catalog.Principal) (tenantView, error) {
	u, err := s.reports.For(ctx, p)
	if err != nil {
		return tenantView{}, s.unavailable(err)
	}
	invoices, err := s.ledger.TenantInvoices(ctx, p.Tenant.ID)
	if err != nil {
		return tenantView{}, s.unavailable(err)
	}
	// the usage of the billing period: the UTC month's, or the local dates
	// of the tenant's calendar
	start, end, loc := u.Period()
	name := start.UTC().Format("January 2006")
	if !p.Calendar.IsDefault() {
		name = periodLabel(start, end, loc)
		name = name[:strings.LastIndex(name, " (")] // (the zone is the chart's own label)
	}
	v := tenantView{Tenant: p.Tenant, Tier: p.Tier, Limits: p.Limits, Usage: u,
		MonthName: name, Chart: periodChart(u.PeriodDates(), name, loc.String(), u.Daily), Invoices: invoices,
		Days: usageTable{ID: "daily-table", Key: "Date"}, Meters: usageTable{ID: "meters-table", Key: "Meter"}}
	for _, d := range u.Daily {
		v.Days.Rows = append(v.Days.Rows, usageRow{d.Date, d.Units, d.Requests, d.Rejected})
	}
	for _, m := range u.Meters {
		v.Meters.Rows = append(v.Meters.Rows, usageRow{m.Meter, m.Units, m.Requests, m.Rejected})
	}
	for _, q := range p.Tier.MeterQuotas {
		mv := meterQuotaView{MeterQuota: q}
		dn, mn := q.Names()
		if l, ok := u.Limit(dn); ok {
			mv.Daily = &l
		}
		if l, ok := u.Limit(mn); ok {
			mv.Monthly = &l
		}
		v.MeterQuotas = append(v.MeterQuotas, mv)
	}
	if v.Billing, err = s.billingOf(ctx, p, invoices); err != nil {
		return tenantView{}, err
	}
	v.Credit, v.TopUpURL = prepaidCredit(p.Tier, u)
	for name, dst := range map[quota.LimitName]**usage.Limit{
		quota.LimitBurst: &v.Burst, quota.LimitBucket: &v.Bucket, quota.LimitDaily: &v.Daily, quota.LimitMonthly: &v.Monthly,
	} {
		if l, ok := u.Limit(name); ok {
			*dst = &l
		}
	}
	return v, nil
}

// prepaidCredit is what the pages show of a prepaid tenant's credit: the
// credit row of its usage report, and its tier's top-up URL when that is an
// http or https URL (the store keeps what the API validated, but a link is
// drawn only from a URL that is one). A postpaid tenant has neither.
func prepaidCredit(t quota.Tier, u usage.Report) (*usage.Limit, string) {
	if !t.IsPrepaid() {
		return nil, ""
	}
	var credit *usage.Limit
	if l, ok := u.Limit(quota.LimitCredit); ok {
		credit = &l
	}
	if t.TopUpURL == "" || httpx.ValidURL("top_up_url", t.TopUpURL) != nil {
		return credit, ""
	}
	return credit, t.TopUpURL
}

// DashHome is the tenant's dashboard: tier, quotas, burst limits, the
// policies of its tier, the month's chart, usage by meter, invoices and the
// upgrade hint.
func (s *Pages) DashHome(c *fiber.Ctx) error {
	p := httpx.PrincipalOf(c)
	v, err := s.tenantViewOf(c.UserContext(), p)
	if err != nil {
		return err
	}
	if v.Policies, err = s.tenantPolicies(c, p); err != nil {
		return err
	}
	return s.render(c, fiber.StatusOK, "dashboard", view{Title: "Usage", Area: tenantArea.name, Nav: "usage",
		CSRF: sessionOf(c).CSRF, Who: p.Tenant.Name, Data: v})
}

// invoiceView is the data of an invoice page.
type invoiceView struct {
	Invoice billing.Invoice
	Tenant  quota.Tenant
}

// DashInvoice shows one of the tenant's own invoices; another tenant's id
// is not found, exactly like an id that does not exist.
func (s *Pages) DashInvoice(c *fiber.Ctx) error {
	p := httpx.PrincipalOf(c)
	invoices, err := s.ledger.TenantInvoices(c.UserContext(), p.Tenant.ID)
	if err != nil {
		return err
	}
	id := c.Params("id")
	for _, inv := range invoices {
		if inv.ID == id {
			return s.render(c, fiber.StatusOK, "invoice", view{Title: "Invoice " + inv.Period, Area: tenantArea.name,
				Nav: "usage", CSRF: sessionOf(c).CSRF, Who: p.Tenant.Name, Data: invoiceView{Invoice: inv, Tenant: p.Tenant}})
		}
	}
	return quota.Errorf(quota.CodeNotFound, "no such invoice")
}
