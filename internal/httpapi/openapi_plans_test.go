package httpapi

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// TestOpenAPITenantPlanFields: the Tenant schema lists every key a tenant
// answer has (its calendar and pending change included, all required),
// PendingChange every key of a pending change, and TenantPatch the plan
// change fields with their values.
func TestOpenAPITenantPlanFields(t *testing.T) {
	t.Parallel()
	doc := mustOpenAPI(t)
	schema := func(name string) map[string]any {
		t.Helper()
		v, err := resolvePointer(doc, "#/components/schemas/"+name)
		if err != nil {
			t.Fatal(err)
		}
		return v.(map[string]any)
	}
	keysOf := func(v any) []string {
		t.Helper()
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		return keys
	}
	pending := quota.PendingChange{Tier: "free", EffectiveAt: time.Now(), Quota: quota.QuotaCarry, RequestedAt: time.Now()}
	for name, v := range map[string]any{
		"Tenant":        quota.Tenant{PendingChange: &pending},
		"PendingChange": pending,
	} {
		s := schema(name)
		props, _ := s["properties"].(map[string]any)
		var required []string
		for _, r := range s["required"].([]any) {
			required = append(required, r.(string))
		}
		for _, k := range keysOf(v) {
			if props[k] == nil {
				t.Errorf("%s: key %q of an answer is not in the schema's properties", name, k)
			}
			if !slices.Contains(required, k) {
				t.Errorf("%s: key %q, always in an answer, is not required", name, k)
			}
		}
	}
	patch, _ := schema("TenantPatch")["properties"].(map[string]any)
	for field, want := range map[string][]any{"effective": {"now", "next_period"}, "quota": {"carry", "reset"}} {
		p, _ := patch[field].(map[string]any)
		if got, _ := p["enum"].([]any); !slices.Equal(got, want) {
			t.Errorf("TenantPatch.%s: enum %v, want %v", field, got, want)
		}
	}
	for _, name := range []string{"TenantPatch", "TenantCreate"} {
		props, _ := schema(name)["properties"].(map[string]any)
		for _, f := range []string{"billing_anchor_day", "time_zone"} {
			if props[f] == nil {
				t.Errorf("%s: no %s", name, f)
			}
		}
	}
	if p, _ := patch["pending_change"].(map[string]any); p["type"] != "null" {
		t.Errorf("TenantPatch.pending_change: %v, want type null (it only cancels)", p)
	}
}
