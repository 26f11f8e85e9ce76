package quota_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

func TestCheckTierLimits(t *testing.T) {
	t.Parallel()
	halfGCRA := quota.Overrides{BurstRate: quota.Set(quota.Ptr(5.0))}
	bigBurst := quota.Overrides{Burst: quota.Set(quota.Ptr(quota.MaxQuantity))}
	tenants := func(n int, o quota.Overrides) []quota.Tenant {
		var ts []quota.Tenant
		for i := range n {
			ts = append(ts, quota.Tenant{ID: fmt.Sprintf("tenant-%d", i), Overrides: o})
		}
		return ts
	}
	gcra := func(rate float64, burst int64) quota.Limits {
		return quota.Limits{BurstRate: quota.Ptr(rate), Burst: quota.Ptr(burst)}
	}
	for _, tc := range []struct {
		name    string
		limits  quota.Limits
		tenants []quota.Tenant
		want    []string // substrings of the message; nil = no error
		notWant []string
	}{
		{"no tenants", quota.Limits{}, nil, nil, nil},
		{"overrides that stay valid", gcra(1, 10), tenants(3, halfGCRA), nil, nil},
		{"half a pair left alone", quota.Limits{}, tenants(1, halfGCRA),
			[]string{"1 tenant with", "tenant-0 (overrides.burst: burst_rate and burst are both set or both null)"}, nil},
		{"a window past the bounds", gcra(1, 10), tenants(1, bigBurst),
			[]string{"tenant-0 (overrides.burst: burst / burst_rate must be at most"}, nil},
		{"five tenants: all named", quota.Limits{}, tenants(5, halfGCRA),
			[]string{"5 tenants with", "tenant-0 (", "tenant-4 ("}, []string{"more"}},
		{"many tenants: the first five named", quota.Limits{}, tenants(7, halfGCRA),
			[]string{"7 tenants with", "tenant-0 (", "tenant-4 (", "and 2 more"}, []string{"tenant-5"}},
	} {
		err := quota.CheckTierLimits(quota.Tier{Limits: tc.limits}, tc.tenants)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: got %v, want nil", tc.name, err)
			}
			continue
		}
		if got := quota.ErrorCode(err); got != quota.CodeConflict {
			t.Errorf("%s: got code %q (%v), want %q", tc.name, got, err, quota.CodeConflict)
			continue
		}
		msg := quota.ErrorMessage(err)
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: got message %q, want it to contain %q", tc.name, msg, w)
			}
		}
		for _, w := range tc.notWant {
			if strings.Contains(msg, w) {
				t.Errorf("%s: got message %q, want it not to contain %q", tc.name, msg, w)
			}
		}
	}
}
