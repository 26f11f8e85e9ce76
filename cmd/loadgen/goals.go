package main

import (
	"fmt"
	"io"
	"math"
	"time"
)

// The goals of the admission core, on the machine the bench runs on: each
// a ratio of two rows of one run, or an absolute Redis figure.
const (
	goalHotVsRedisRate  = 1.5 // admitted req/s, one hot tenant ≥ this × redis_rate's on one key
	goalManyVsRedisRate = 1.0 // admitted req/s, many tenants in turn ≥ this × redis_rate's on as many keys
	goalHotMicros       = 4   // Redis µs per admission, one hot tenant ≤ this
	goalManyMicros      = 12  // Redis µs per admission, many tenants ≤ this
	goalRefusedVsBare   = 0.8 // refused (deny cache) req/s ≥ this × bare Fiber's
	goalTenantBytes     = 256 // bytes a tenant keeps in Redis ≤ this
	goalP99Overhead     = time.Millisecond
)

// figures are what the goals are judged on.
type figures struct {
	hotVsRedisRate, manyVsRedisRate, refusedVsBare float64
	hotMicros, manyMicros                          float64 // Redis µs per admission; NaN: nothing admitted
	tenantBytes                                    int64   // the most a measured tenant keeps in Redis; < 0: no keys found
	p99Overhead                                    time.Duration
	openLoop                                       bool // p99Overhead was measured
	tenants                                        int  // of the many-tenant rows
}

// goal is one line of the goals table.
type goal struct {
	pass      bool
	what, got string
}

// evaluate judges f against every goal, in the order they are printed.
// A figure that was not measured fails its goal.
func evaluate(f figures) []goal {
	micros := func(v float64) string {
		if math.IsNaN(v) {
			return "nothing admitted"
		}
		return fmt.Sprintf("%.2f", v)
	}
	bytes, overhead := "no keys found", "not measured"
	if f.tenantBytes >= 0 {
		bytes = fmt.Sprint(f.tenantBytes)
	}
	if f.openLoop {
		overhead = fmtDur(f.p99Overhead)
	}
	return []goal{
		{f.hotVsRedisRate >= goalHotVsRedisRate,
			fmt.Sprintf("admitted, 1 tenant ≥ %.1f× redis_rate, 1 key", goalHotVsRedisRate), fmt.Sprintf("%.2f×", f.hotVsRedisRate)},
		{f.manyVsRedisRate >= goalManyVsRedisRate,
			fmt.Sprintf("admitted, %d tenants ≥ %.1f× redis_rate, %d keys", f.tenants, goalManyVsRedisRate, f.tenants), fmt.Sprintf("%.2f×", f.manyVsRedisRate)},
		{f.hotMicros <= goalHotMicros, // false for NaN
			fmt.Sprintf("Redis µs per admission, 1 tenant ≤ %d", goalHotMicros), micros(f.hotMicros)},
		{f.manyMicros <= goalManyMicros,
			fmt.Sprintf("Redis µs per admission, %d tenants ≤ %d", f.tenants, goalManyMicros), micros(f.manyMicros)},
		{f.refusedVsBare >= goalRefusedVsBare,
			fmt.Sprintf("refused (deny cache) ≥ %.1f× bare Fiber", goalRefusedVsBare), fmt.Sprintf("%.2f×", f.refusedVsBare)},
		{f.tenantBytes >= 0 && f.tenantBytes <= goalTenantBytes,
			fmt.Sprintf("bytes of Redis per tenant ≤ %d", goalTenantBytes), bytes},
		{f.openLoop && f.p99Overhead <= goalP99Overhead,
			fmt.Sprintf("p99 at half load ≤ bare Fiber's + %s", fmtDur(goalP99Overhead)), overhead},
	}
}

// printGoals prints one line per goal: PASS or FAIL, the goal, the figure.
func printGoals(out io.Writer, goals []goal) {
	passed := 0
	for _, g := range goals {
		verdict := "FAIL"
		if g.pass {
			verdict, passed = "PASS", passed+1
		}
		fmt.Fprintf(out, "  %s  %-52s got %s\n", verdict, g.what, g.got)
	}
	fmt.Fprintf(out, "  %d of %d goals met\n", passed, len(goals))
}
