package ratelimit

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseState reads the packed fields t, q and c of a v2 state hash
// (lua/state.lua), joined by ',' in this order: g, b, d, du, dg, m, mu, mg,
// mo, gn, x, mn (x and mn in unix seconds). For tests and tools; the
// scripts alone write them.
func ParseState(t, q, c string) ([12]int64, error) {
	var v [12]int64
	s := t + "," + q + "," + c
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
