package ratelimit

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseState reads the packed fields t, q and c of a state hash
// (lua/state.lua) into, in this order: g, b, d, du, dg, m, mu, mg, mo, gn,
// x, mn, with every time in microseconds since the epoch (g and b are
// stored from the start of day d, x in hours and mn in days; an empty g or
// b is 0). For tests and tools; the scripts alone write them.
func ParseState(t, q, c string) ([12]int64, error) {
	var v [12]int64
	parts := strings.Split(t+","+q+","+c, ",")
	if len(parts) != len(v) {
		return v, fmt.Errorf("ratelimit: state %q %q %q: %d values, want %d", t, q, c, len(parts), len(v))
	}
	for i, p := range parts {
		if p == "" && i < 2 {
			continue
		}
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return v, fmt.Errorf("ratelimit: state %q %q %q: %w", t, q, c, err)
		}
		v[i] = n
	}
	const hourUS, dayUS = int64(3600e6), int64(86400e6)
	for i := range 2 {
		if parts[i] != "" {
			v[i] += v[2] * dayUS
		}
	}
	v[10] *= hourUS
	v[11] *= dayUS
	return v, nil
}
