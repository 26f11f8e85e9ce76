package admission

import (
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// Outcome names a decision of the Gate as the metered path counts it,
// which the spans of /v1/check and of the admission record.
func TestOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		d    quota.Decision
		want string
	}{
		{"admitted", quota.Decision{Allowed: true}, "allowed"},
		{"admitted failing open", quota.Decision{Allowed: true, Degraded: true}, "allowed"},
		{"refused", quota.Decision{Violated: []quota.LimitName{quota.LimitDaily}}, "refused"},
		{"a degrade policy's fallback", quota.Decision{Fallback: &quota.PolicyState{}}, "degraded"},
		{"replayed", quota.Decision{Allowed: true, Idem: quota.IdemReplayed}, "replayed"},
		{"key in flight", quota.Decision{Idem: quota.IdemInFlight}, "idempotency_conflict"},
		{"key reused", quota.Decision{Idem: quota.IdemMismatch}, "idempotency_conflict"},
		{"records full", quota.Decision{Idem: quota.IdemLimit}, "idempotency_limit"},
	} {
		if got := Outcome(tc.d); got != tc.want {
			t.Errorf("%s: Outcome = %q, want %q", tc.name, got, tc.want)
		}
	}
}
