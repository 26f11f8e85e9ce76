package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
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

// staticPolicies is a policy list that never changes.
type staticPolicies []quota.Policy

func (s staticPolicies) Policies(context.Context) ([]quota.Policy, error) { return s, nil }

// TestUsageListsTheTierPolicies: GET /v1/usage lists the policies of the
// caller's tier, in the list's order, with the state its metered requests
// left (null where the state is per request), and counts shadow refusals
// and degraded requests per meter and day.
func TestUsageListsTheTierPolicies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	store := catalogdb.NewStore(pool)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	runner := quotaredis.New(rdb, prefix)
	ledger := billing.NewLedger(pool)
	bucket := func(name string, capacity int64, scope quota.Scope, how quota.OnRefuse, tiers ...string) quota.Policy {
		p := quota.Policy{Name: name, Algorithm: quota.AlgTokenBucket, Capacity: quota.Ptr(capacity),
			RefillPerSec: quota.Ptr(0.001), Scope: scope, OnRefuse: how, Match: quota.PolicyMatch{Tiers: tiers}}
		p.Defaults()
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		return p
	}
	list := staticPolicies{
		bucket("per-tenant", 5, quota.ScopeTenant, quota.RefuseReject, "pro"),
		bucket("enterprise-only", 50, quota.ScopeTenant, quota.RefuseReject, "enterprise"),
		bucket("per-key", 7, quota.ScopeKey, quota.RefuseReject),
		bucket("watch", 1, quota.ScopeTenant, quota.RefuseShadow),
	}
	s, err := New(Deps{Log: log, Store: store, Sessions: redisdb.NewSessions(rdb, prefix),
		Catalog: catalog.New(store, rdb, prefix, log, time.Now), Gate: admission.New(runner, time.Now),
		Ledger: ledger, Usage: usage.NewReader(runner, ledger, time.Now), Policies: list}, Options{BodyLimit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := store.CreateTenant(ctx, "test", "policed", "pro")
	if err != nil {
		t.Fatal(err)
	}
	key, err := store.IssueKey(ctx, "test", tenant.ID, "k")
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, []byte) {
		t.Helper()
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("Authorization", "Bearer "+key.Secret)
		resp, err := s.App().Test(req, 5000)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for range 2 { // the second is refused by the shadow policy "watch", and admitted
		if status, body := get("/api/demo/echo"); status != 200 {
			t.Fatalf("metered request: %d %s", status, body)
		}
	}
	status, body := get("/v1/usage")
	if status != 200 {
		t.Fatalf("GET /v1/usage: %d %s", status, body)
	}
	var u struct {
		Policies []map[string]any `json:"policies"`
		Meters   []map[string]any `json:"meters"`
		Daily    []map[string]any `json:"daily"`
	}
	if err := json.Unmarshal(body, &u); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"name": "per-tenant", "algorithm": "token_bucket", "limit": 5.0, "remaining": 3.0},
		{"name": "per-key", "algorithm": "token_bucket", "limit": 7.0, "remaining": nil, "reset": nil},
		{"name": "watch", "algorithm": "token_bucket", "limit": 1.0, "remaining": 0.0},
	}
	if len(u.Policies) != len(want) {
		t.Fatalf("policies: got %v, want %v", u.Policies, want)
	}
	for i, w := range want {
		g := u.Policies[i]
		for k, v := range w {
			if g[k] != v {
				t.Errorf("policy %d: %s = %v, want %v (%v)", i, k, g[k], v, g)
			}
		}
		if _, ok := g["reset"].(string); w["remaining"] != nil && !ok {
			t.Errorf("policy %d: reset %v, want a time", i, g["reset"])
		}
	}
	for _, rows := range [][]map[string]any{u.Meters, u.Daily} {
		if len(rows) != 1 || rows[0]["shadow_refused"] != 1.0 || rows[0]["degraded"] != 0.0 {
			t.Errorf("usage rows %v: want one with shadow_refused 1, degraded 0", rows)
		}
	}
}
