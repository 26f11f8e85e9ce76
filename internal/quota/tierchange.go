package quota

import (
	"errors"
	"fmt"
	"strings"
)

// maxNamedTenants bounds how many tenants a refused tier change names.
const maxNamedTenants = 5

// CheckTierLimits reports whether tier, a tier as changed, leaves valid
// the effective limits of each of tenants, the tier's tenants: the tier's
// limits with the tenant's overrides, checked by Tier.CheckOverrides as a
// tenant change checks them (and Limits.Validate every admission). It returns nil, or a
// CodeConflict *Error naming the first few tenants whose limits would turn
// invalid and why. Stored anyway, such a change would refuse every call of
// those tenants as bad configuration; their overrides must change first.
func CheckTierLimits(tier Tier, tenants []Tenant) error {
	var named []string
	bad := 0
	for _, t := range tenants {
		err := tier.CheckOverrides(t.Overrides)
		if err == nil {
			continue
		}
		bad++
		if len(named) < maxNamedTenants {
			named = append(named, fmt.Sprintf("%s (%s)", t.ID, reason(err)))
		}
	}
	if bad == 0 {
		return nil
	}
	more, noun := "", "tenants"
	if bad > len(named) {
		more = fmt.Sprintf(" and %d more", bad-len(named))
	}
	if bad == 1 {
		noun = "tenant"
	}
	return Errorf(CodeConflict, "the change would make the limits of %d %s with overrides invalid, "+
		"and every call of theirs refused: %s%s; change their overrides first", bad, noun, strings.Join(named, "; "), more)
}

// reason words a validation error for a message about overrides.
func reason(err error) string {
	var e *Error
	if errors.As(OverridesError(err), &e) && e.Field != "" {
		return e.Field + ": " + e.Message
	}
	return ErrorMessage(err)
}
