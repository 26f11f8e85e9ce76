package api

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/quota"
)

// BenchmarkPages measures whole requests over loopback to one api: the
// tenant's dashboard against GET /v1/usage, which carries the same numbers
// (the ratio is the cost of the page: invoices, template, chart), and the
// console's tenant list of 50 tenants with their month's usage.
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 2s ./internal/e2e/api
func BenchmarkPages(b *testing.B) {
	ctx := context.Background()
	s := mustStack(b)
	tenant, key := s.tenant("pro")
	base := s.start()
	for range 20 {
		if r := do(b, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
			b.Fatal(r.status)
		}
	}
	if _, err := billing.NewInvoicer(s.pool, time.Now, 48*time.Hour).Generate(ctx, tenant.ID, quota.MonthStart(time.Now())); err != nil {
		b.Fatal(err)
	}
	for i := range 49 {
		if _, err := s.store.CreateTenant(ctx, "bench", fmt.Sprintf("tenant %02d", i), "free"); err != nil {
			b.Fatal(err)
		}
	}
	dash := newWebClient(b, base)
	dash.mustSignIn("dashboard", key)
	console := newWebClient(b, base)
	console.mustSignIn("console", adminToken)
	for _, bc := range []struct {
		name string
		get  func() reply
	}{
		{"usage-json", func() reply { return do(b, "GET", base+"/v1/usage", key, "") }},
		{"dashboard-page", func() reply { return dash.get("/dashboard") }},
		{"console-tenants-50", func() reply { return console.get("/console/tenants") }},
		{"console-tenant-page", func() reply { return console.get("/console/tenants/" + tenant.ID) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if r := bc.get(); r.status != 200 {
					b.Fatalf("status %d", r.status)
				}
			}
		})
	}
}
