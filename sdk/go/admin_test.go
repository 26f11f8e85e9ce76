package tollgate_test

import (
	"context"
	"testing"

	tollgate "github.com/tollgate/tollgate/sdk/go"
	"github.com/tollgate/tollgate/sdk/go/admin"
)

// TestAdminClientAndHeldChecks drives the generated admin client (a tier,
// a conflict, a concurrency policy) and holds and releases a check's lease.
func TestAdminClientAndHeldChecks(t *testing.T) {
	s := sharedStack(t)
	tn := s.newTenant(t, 100)
	ctx := context.Background()

	got, err := s.admin.GetTierWithResponse(ctx, tn.tier)
	if err != nil || got.JSON200 == nil || got.JSON200.Slug != tn.tier || got.JSON200.DailyQuota == nil || *got.JSON200.DailyQuota != 100 {
		t.Fatalf("get tier %s: %v %+v", tn.tier, err, got)
	}
	dup, err := s.admin.CreateTierWithResponse(ctx, admin.Tier{Slug: tn.tier, Name: "again", Rank: 1, Overage: "block"})
	if err != nil || dup.StatusCode() != 409 || dup.ApplicationproblemJSON409 == nil || dup.ApplicationproblemJSON409.Status != 409 {
		t.Fatalf("a tier of a taken slug: %v %d %s, want a 409 problem", err, dup.StatusCode(), dup.Body)
	}
	bad, err := s.admin.CreateTierWithResponse(ctx, admin.Tier{Slug: "Not A Slug", Name: "x", Rank: 1, Overage: "block"})
	if err != nil || bad.ApplicationproblemJSON400 == nil || bad.ApplicationproblemJSON400.Field == nil || *bad.ApplicationproblemJSON400.Field != "slug" {
		t.Fatalf("a bad slug: %v %d %s, want a 400 problem naming slug", err, bad.StatusCode(), bad.Body)
	}
	wrong, err := admin.New(s.base, "not-the-admin-token-at-all", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := wrong.ListTiersWithResponse(ctx, nil); err != nil || r.StatusCode() != 401 {
		t.Fatalf("a wrong admin token: %v %d, want 401", err, r.StatusCode())
	}

	limit, lease := int64(1), 60
	scope := admin.PolicyScope("tenant")
	tiers, meters := []string{tn.tier}, []string{"jobs"}
	pol, err := s.admin.CreatePolicyWithResponse(ctx, admin.Policy{Name: "sdk-jobs-" + tn.tier[4:], Algorithm: "concurrency",
		Limit: &limit, LeaseSeconds: &lease, Scope: &scope, Match: &admin.PolicyMatch{Tiers: &tiers, Meters: &meters}})
	if err != nil || pol.JSON201 == nil {
		t.Fatalf("create a concurrency policy: %v %d %s", err, pol.StatusCode(), pol.Body)
	}

	c := s.serviceClient(newCounter())
	held, err := c.Check(ctx, tollgate.CheckRequest{APIKey: tn.key, Meter: "jobs", Hold: true})
	if err != nil || !held.Allowed || held.RequestID == "" {
		t.Fatalf("a held check: %v %+v, want admitted", err, held)
	}
	second, err := c.Check(ctx, tollgate.CheckRequest{APIKey: tn.key, Meter: "jobs", Hold: true})
	if err != nil || second.Allowed || second.Status != 429 {
		t.Fatalf("a second held check of 1: %v %+v, want refused 429", err, second)
	}
	rel, err := c.Release(ctx, tn.id, held.RequestID)
	if err != nil || !rel.Released || rel.ReleasedLeases != 1 {
		t.Fatalf("release: %v %+v, want 1 lease released", err, rel)
	}
	if _, err := c.Release(ctx, tn.id, held.RequestID); !tollgate.IsNotFound(err) {
		t.Fatalf("a second release: %v, want 404", err)
	}
	third, err := c.Check(ctx, tollgate.CheckRequest{APIKey: tn.key, Meter: "jobs", Hold: true})
	if err != nil || !third.Allowed {
		t.Fatalf("a held check after the release: %v %+v, want admitted", err, third)
	}
	if rf, err := c.Refund(ctx, tn.id, third.RequestID); err != nil || rf.ReleasedLeases != 1 {
		t.Fatalf("refund of a held check: %v %+v, want its lease released", err, rf)
	}
}
