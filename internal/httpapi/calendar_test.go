package httpapi

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/admission"
	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/usage"
)

// TestMeteredFollowsTheCalendar: a tenant in America/New_York with anchor
// 20 gets RateLimit headers whose daily and monthly resets and windows are
// those of its local day and billing month (the catalog's Principal
// carries its calendar to the admission).
func TestMeteredFollowsTheCalendar(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	store := catalogdb.NewStore(pool)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	runner := quotaredis.New(rdb, prefix)
	ledger := billing.NewLedger(pool)
	s, err := New(Deps{Log: log, Store: store, Sessions: redisdb.NewSessions(rdb, prefix),
		Catalog: catalog.New(store, rdb, prefix, log, time.Now), Gate: admission.New(runner, time.Now),
		Ledger: ledger, Usage: usage.NewReader(runner, ledger, time.Now)}, Options{BodyLimit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := store.CreateTenantWith(ctx, "test", quota.Tenant{Name: "ny", Tier: "pro",
		BillingAnchorDay: 20, TimeZone: "America/New_York"})
	if err != nil {
		t.Fatal(err)
	}
	key, err := store.IssueKey(ctx, "test", tenant.ID, "k")
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("GET", "/api/demo/echo", nil)
	req.Header.Set("Authorization", "Bearer "+key.Secret)
	now := time.Now()
	resp, err := s.App().Test(req, 5000)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("metered request: %d", resp.StatusCode)
	}
	ny, _ := quota.LoadZone("America/New_York")
	cal := quota.Calendar{AnchorDay: 20, Zone: ny}
	ds, de := cal.Day(now)
	ps, pe := cal.Period(now)
	for _, tc := range []struct {
		name       string
		start, end time.Time
	}{{"daily", ds, de}, {"monthly", ps, pe}} {
		w := regexp.MustCompile(`"` + tc.name + `";q=\d+;w=(\d+)`).FindStringSubmatch(resp.Header.Get("RateLimit-Policy"))
		if w == nil || w[1] != strconv.FormatInt(int64(tc.end.Sub(tc.start)/time.Second), 10) {
			t.Errorf("%s in RateLimit-Policy %q: want w=%d", tc.name, resp.Header.Get("RateLimit-Policy"), int64(tc.end.Sub(tc.start)/time.Second))
		}
		m := regexp.MustCompile(`"` + tc.name + `";r=\d+;t=(\d+)`).FindStringSubmatch(resp.Header.Get("RateLimit"))
		want := tc.end.Sub(now).Seconds()
		if m == nil {
			t.Fatalf("no %s item in RateLimit %q", tc.name, resp.Header.Get("RateLimit"))
		}
		if got, _ := strconv.ParseFloat(m[1], 64); got < want-3 || got > want+3 {
			t.Errorf("%s resets in %s s, want %.0f (at %s)", tc.name, m[1], want, tc.end)
		}
	}
}
