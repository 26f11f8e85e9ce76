package admin

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

func TestCheckStringsNamesTheMember(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ body, field string }{
		{`{"name": "ok", "match": {"meters": ["a", "b"]}, "exceptions": {"é": 1}, "limit": 1e400}`, ""},
		{`{"name": "\ufffd is a character"}`, ""},
		{"{\"match\": {\"meters\": [\"a\", \"\xff\"]}}", "match.meters"},
		{"{\"match\": {\"meters\": [\"a\"]}, \"param\": \"\xc3\x28\"}", "param"},
		{"{\"exceptions\": {\"\xed\xa0\x80\": 1}}", "exceptions"},
		{`{"exceptions": {"a": 1, "b\u0000": 2}}`, "exceptions"},
		{`{"fallback": {"status": 200, "body": "x\u0000y"}}`, "fallback.body"},
		{`{"match": {"tiers": [], "methods": ["GET"]}, "fallback": {"content_type": "a\u0000"}}`, "fallback.content_type"},
		{`{"a": [{"b": 1}, {"c": ["\u0000"]}]}`, "a.c"},
		{"{\"\xff\": 1}", "body"},
	} {
		err := checkStrings([]byte(tc.body))
		var qe *quota.Error
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%q: %v, want no error", tc.body, err)
		case tc.field != "" && (!errors.As(err, &qe) || qe.Code != quota.CodeInvalid || qe.Field != tc.field):
			t.Errorf("%q: %v, want an invalid error naming %q", tc.body, err, tc.field)
		}
	}
}

func TestPolicyPatchMergesMembers(t *testing.T) {
	t.Parallel()
	stored := func() quota.Policy {
		return quota.Policy{Name: "reports", Algorithm: quota.AlgLeakyBucket, Rate: quota.Ptr(5.0), Burst: quota.Ptr(int64(10)),
			Match: quota.PolicyMatch{Meters: []string{"report"}, Tiers: []string{"free"}}, Scope: quota.ScopeKey,
			Cost: quota.CostUnits, OnRefuse: quota.RefuseQueue, MaxWaitMS: quota.Ptr(int64(2000))}
	}
	for _, tc := range []struct {
		name, patch string
		want        func(*quota.Policy)
	}{
		{"nothing", `{}`, func(*quota.Policy) {}},
		{"one number", `{"burst": 3}`, func(p *quota.Policy) { p.Burst = quota.Ptr(int64(3)) }},
		{"match replaced whole", `{"match": {"methods": ["GET"]}}`,
			func(p *quota.Policy) { p.Match = quota.PolicyMatch{Methods: []string{"GET"}} }},
		{"null removes an optional field", `{"on_refuse": "reject", "max_wait_ms": null}`,
			func(p *quota.Policy) { p.OnRefuse, p.MaxWaitMS = quota.RefuseReject, nil }},
		{"null empties a defaulted field", `{"scope": null, "cost": null}`,
			func(p *quota.Policy) { p.Scope, p.Cost = "", "" }},
		{"another algorithm", `{"algorithm": "token_bucket", "rate": null, "burst": null, "capacity": 9, "refill_per_sec": 0.5}`,
			func(p *quota.Policy) {
				p.Algorithm, p.Rate, p.Burst, p.Capacity, p.RefillPerSec = quota.AlgTokenBucket, nil, nil, quota.Ptr(int64(9)), quota.Ptr(0.5)
			}},
	} {
		var patch policyPatch
		if err := json.Unmarshal([]byte(tc.patch), &patch); err != nil {
			t.Fatal(err)
		}
		got, want := stored(), stored()
		if err := patch.apply(&got); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		tc.want(&want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, want)
		}
	}
}
