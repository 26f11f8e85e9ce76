package envoy

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

func TestUnitOfAWindow(t *testing.T) {
	const day = 24 * time.Hour
	for _, tc := range []struct {
		w    time.Duration
		unit rlsv3.RateLimitResponse_RateLimit_Unit
		mult uint32
	}{
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
		{10 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 10},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE, 1},
		{90 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{2 * time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR, 2},
		{day, rlsv3.RateLimitResponse_RateLimit_DAY, 1},
		{23 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY, 1}, // a day the clock moves forward
		{25 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY, 1},
		{2 * day, rlsv3.RateLimitResponse_RateLimit_DAY, 2},
		{7 * day, rlsv3.RateLimitResponse_RateLimit_WEEK, 1},
		{14 * day, rlsv3.RateLimitResponse_RateLimit_WEEK, 2},
		{28 * day, rlsv3.RateLimitResponse_RateLimit_MONTH, 1},
		{31*day - time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH, 1},
		{31*day + time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH, 1},
		{35 * day, rlsv3.RateLimitResponse_RateLimit_WEEK, 5},
		{0, rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0},
		{-time.Second, rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0},
		{1500 * time.Millisecond, rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0},
	} {
		if unit, mult := unitOf(tc.w); unit != tc.unit || mult != tc.mult {
			t.Errorf("unitOf(%s) = %v × %d, want %v × %d", tc.w, unit, mult, tc.unit, tc.mult)
		}
	}
}

func TestClamp32(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want uint32
	}{{-1, 0}, {0, 0}, {7, 7}, {1 << 32, 1<<32 - 1}, {1 << 40, 1<<32 - 1}} {
		if got := clamp32(tc.n); got != tc.want {
			t.Errorf("clamp32(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}
