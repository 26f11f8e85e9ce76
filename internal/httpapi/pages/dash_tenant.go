package pages

import (
	"context"
	"html/template"

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
	month := u.MonthStart()
	v := tenantView{Tenant: p.Tenant, Tier: p.Tier, Limits: p.Limits, Usage: u,
		MonthName: month.Format("January 2006"), Chart: dailyChart(month, u.Daily), Invoices: invoices,
		Days: usageTable{ID: "daily-table", Key: "Date"}, Meters: usageTable{ID: "meters-table", Key: "Meter"}}
	for _, d := range u.Daily {
		v.Days.Rows = append(v.Days.Rows, usageRow{d.Date, d.Units, d.Requests, d.Rejected})
	}
	for _, m := range u.Meters {
		v.Meters.Rows = append(v.Meters.Rows, usageRow{m.Meter, m.Units, m.Requests, m.Rejected})
	}
	for name, dst := range map[quota.LimitName]**usage.Limit{
		quota.LimitBurst: &v.Burst, quota.LimitBucket: &v.Bucket, quota.LimitDaily: &v.Daily, quota.LimitMonthly: &v.Monthly,
	} {
		if l, ok := u.Limit(name); ok {
			*dst = &l
		}
	}
	return v, nil
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
