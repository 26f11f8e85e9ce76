package api

import (
	"context"
	"encoding/csv"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/quota"
)

// TestInvoicesShowBillingPeriods: an invoice names the billing period it
// covers, the tenant's own (set through PATCH), in the tenant's
// GET /v1/invoices and the admin's GET /admin/v1/invoices?period= (JSON and
// CSV), beside its label; a default tenant's is the UTC month.
func TestInvoicesShowBillingPeriods(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	anchored, key := s.tenant("pro")
	plain, plainKey := s.tenant("free")
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+anchored.ID, `{"billing_anchor_day": 15, "time_zone": "America/New_York"}`); r.status != 200 {
		t.Fatalf("PATCH calendar: %d %s", r.status, r.body)
	}
	now := time.Now().UTC()
	if err := billing.NewInvoicer(s.pool, func() time.Time { return now }, 48*time.Hour).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	ny, err := quota.LoadZone("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	cal := quota.Calendar{AnchorDay: 15, Zone: ny}
	start, end := cal.Period(now)
	label := fmt.Sprintf("%04d-%02d", cal.PeriodID(now)/100, cal.PeriodID(now)%100)
	month := quota.MonthStart(now)

	for _, c := range []struct {
		name, tenantID, key, label string
		start, end                 time.Time
	}{
		{"anchored", anchored.ID, key, label, start, end},
		{"default", plain.ID, plainKey, month.Format("2006-01"), month, month.AddDate(0, 1, 0)},
	} {
		mine := do(t, "GET", base+"/v1/invoices", c.key, "").json(t)["items"].([]any)
		if len(mine) != 1 {
			t.Fatalf("%s: tenant invoices = %v, want one draft", c.name, mine)
		}
		var listed map[string]any
		for _, it := range admin(t, "GET", base+"/admin/v1/invoices?period="+c.label, "").json(t)["items"].([]any) {
			if it.(map[string]any)["tenant_id"] == c.tenantID {
				listed = it.(map[string]any)
			}
		}
		if listed == nil {
			t.Fatalf("%s: not in GET /admin/v1/invoices?period=%s", c.name, c.label)
		}
		csvBody := do(t, "GET", base+"/admin/v1/invoices?period="+c.label, adminToken, "", "Accept", "text/csv")
		recs, err := csv.NewReader(strings.NewReader(string(csvBody.body))).ReadAll()
		if err != nil || len(recs) < 2 || strings.Join(recs[0][11:], ",") != "period_start,period_end" {
			t.Fatalf("%s: invoices CSV = %v, %v; want period_start and period_end last", c.name, recs, err)
		}
		for _, r := range recs[1:] {
			if r[1] == c.tenantID && (r[11] != c.start.Format(time.RFC3339) || r[12] != c.end.Format(time.RFC3339)) {
				t.Errorf("%s: CSV row %v, want [%s, %s)", c.name, r, c.start.Format(time.RFC3339), c.end.Format(time.RFC3339))
			}
		}
		for route, inv := range map[string]map[string]any{"/v1/invoices": mine[0].(map[string]any), "/admin/v1/invoices": listed} {
			if inv["period"] != c.label || inv["period_start"] != c.start.Format(time.RFC3339) || inv["period_end"] != c.end.Format(time.RFC3339) {
				t.Errorf("%s, %s: period %v [%v, %v), want %s [%s, %s)", c.name, route, inv["period"], inv["period_start"], inv["period_end"],
					c.label, c.start.Format(time.RFC3339), c.end.Format(time.RFC3339))
			}
		}
	}
}
