package httpapi

import (
	"encoding/json"
	"testing"

	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/quota"
)

// TestRelayOfCreditAndFallbackRefusals: a refusal for want of credit
// relays the metered route's 402 with the top-up URL and no Retry-After;
// a degrade policy's refusal relays its fallback as it is.
func TestRelayOfCreditAndFallbackRefusals(t *testing.T) {
	var s Server
	p := catalog.Principal{Tier: quota.Tier{Slug: "pre", TopUpURL: "https://pay.example.test/top-up"}}
	credit := quota.Decision{Violated: []quota.LimitName{quota.LimitCredit}, RetryAfter: 5e9}
	r := s.relay(p, credit, "/api/x")
	var body map[string]any
	if err := json.Unmarshal(r.Body, &body); err != nil {
		t.Fatalf("402 body %q: %v", r.Body, err)
	}
	h := r.HeaderMap()
	if r.Status != 402 || body["top_up_url"] != p.Tier.TopUpURL || body["instance"] != "/api/x" ||
		h["Content-Type"] != "application/problem+json" || h["Retry-After"] != "" {
		t.Fatalf("credit refusal relayed %d %v %s, want 402 problem+json with the top-up URL and no Retry-After", r.Status, h, r.Body)
	}

	pol := &quota.Policy{Name: "soft", Fallback: &quota.Fallback{Status: 203, ContentType: "text/plain", Body: "cached answer"}}
	degraded := quota.Decision{Violated: []quota.LimitName{"soft"}, RetryAfter: -1, Fallback: &quota.PolicyState{Policy: pol}}
	r = s.relay(p, degraded, "/api/x")
	h = r.HeaderMap()
	if r.Status != 203 || string(r.Body) != "cached answer" || h["Content-Type"] != "text/plain" || h["Tollgate-Degraded"] != "soft" {
		t.Fatalf("fallback relayed %d %v %q, want 203 text/plain \"cached answer\" marked Tollgate-Degraded: soft", r.Status, h, r.Body)
	}

	admitted := quota.Decision{Allowed: true, Limits: []quota.LimitState{{Name: "daily", Limit: 10, Remaining: 9}}}
	r = s.relay(p, admitted, "")
	if r.Status != 200 || r.Body != nil || r.HeaderMap()["X-Ratelimit-Remaining"] != "9" {
		t.Fatalf("admission relayed %d %v %q, want 200, the quota headers, no body", r.Status, r.HeaderMap(), r.Body)
	}
}
