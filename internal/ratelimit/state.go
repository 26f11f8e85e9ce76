package ratelimit

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseState reads the packed field s of a v2 state hash (lua/state.lua):
// x, g, b, d, du, dg, m, mu, mg, mo, ms, mn, gn, in this order. For tests
// and tools; the scripts alone write it.
func ParseState(s string) ([13]int64, error) {
	var v [13]int64
	parts := strings.Split(s, ",")
	if len(parts) != len(v) {
		return v, fmt.Errorf("ratelimit: state %q: %d values, want %d", s, len(parts), len(v))
	}
	for i, p := range parts {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return v, fmt.Errorf("ratelimit: state %q: %w", s, err)
		}
		v[i] = n
	}
	return v, nil
}
