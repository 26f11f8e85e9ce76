package pending

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// PrepaidDrawn returns what the admission script counts against
// pp.BalanceMillicents: the millicents that the admissions of pp's period,
// and of the previous one while its invoice is not final (pp.PrevID), drew
// on the tenant's credit and no final invoice holds, and the rounding it
// keeps back (999 millicents per invoice line past the first).
func (r *Usage) PrepaidDrawn(ctx context.Context, tenantID string, pp quota.Prepaid) (int64, error) {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return 0, err
	}
	lines := int64(max(pp.Lines, 1))
	v, err := r.Client().HGet(ctx, r.Key(tenantID, "mq"), "P").Result()
	if errors.Is(err, redis.Nil) {
		return 999 * (lines - 1), nil
	}
	if err != nil {
		return 0, fmt.Errorf("ratelimit: prepaid draws: %w", err)
	}
	var f [4]int64
	parts := strings.Split(v, ",")
	if len(parts) != 4 {
		return 0, fmt.Errorf("ratelimit: prepaid draws: malformed field %q", v)
	}
	for i, s := range parts {
		if f[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return 0, fmt.Errorf("ratelimit: prepaid draws: malformed field %q", v)
		}
	}
	m, mc, pm, pmc := f[0], f[1], f[2], f[3]
	if m != int64(pp.PeriodID) { // nothing drawn in this period yet
		mc, pm, pmc = 0, m, mc
	}
	drawn := mc + 999*(lines-1)
	if prev := int64(pp.PrevID); prev != 0 && pm == prev && pmc > 0 {
		drawn += max(0, pmc+999*lines-pp.ExpiringMillicents)
	}
	return drawn, nil
}
