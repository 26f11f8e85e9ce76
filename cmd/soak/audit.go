package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// verdict is one promise's line of the report.
type verdict struct {
	name   string
	held   bool
	detail string
}

func (v verdict) String() string {
	word := "held"
	if !v.held {
		word = "BROKEN"
	}
	return fmt.Sprintf("promise %-22s %-6s %s", v.name+":", word, v.detail)
}

// billed is what Postgres holds of one tenant after the final flush.
type billed struct {
	units, overage int64
}

// tenantRecord is what the audit reads of a tenant: the client's bounds and
// limits, and the ledger's figures.
type tenantRecord struct {
	id, kind        string
	low, high       int64
	quota, capUnits int64 // -1: not checked
	billed          billed
	// meters: per meter, answered, billed, answered + lost, and the
	// admissions a node's fail-open limiter answered.
	meters map[string][4]int64
}

// examples joins at most three of items, saying how many there were.
func examples(items []string) string {
	if len(items) <= 3 {
		return strings.Join(items, "; ")
	}
	return strings.Join(items[:3], "; ") + fmt.Sprintf("; and %d more", len(items)-3)
}

// auditBilling holds every tenant to answered ≤ billed ≤ answered + lost.
func auditBilling(ts []tenantRecord) verdict {
	var low, high, got int64
	var bad []string
	for _, t := range ts {
		low += t.low
		high += t.high
		got += t.billed.units
		if t.billed.units < t.low || t.billed.units > t.high {
			bad = append(bad, fmt.Sprintf("%s tenant %s: answered %d, billed %d, answered+lost %d (%s)",
				t.kind, t.id, t.low, t.billed.units, t.high, byMeter(t.meters)))
		}
	}
	v := verdict{name: "billed-as-answered", held: len(bad) == 0,
		detail: fmt.Sprintf("%d tenants: units answered 2xx %d <= billed %d <= answered + lost %d", len(ts), low, got, high)}
	if !v.held {
		v.detail += fmt.Sprintf("; %d tenants out of bounds: %s", len(bad), examples(bad))
	}
	return v
}

// auditLimit holds the tenants whose limit() is not -1 to used() ≤ limit().
func auditLimit(name, what string, ts []tenantRecord, limit, used func(tenantRecord) int64) verdict {
	var n int
	var most float64
	var bad []string
	for _, t := range ts {
		l := limit(t)
		if l < 0 {
			continue
		}
		n++
		u := used(t)
		if l > 0 {
			most = max(most, float64(u)/float64(l))
		} else if u > 0 {
			most = max(most, float64(u))
		}
		if u > l {
			bad = append(bad, fmt.Sprintf("%s tenant %s: %d > %d", t.kind, t.id, u, l))
		}
	}
	v := verdict{name: name, held: len(bad) == 0 && n > 0,
		detail: fmt.Sprintf("%d tenants: %s; the fullest used %.0f%%", n, what, 100*most)}
	if n == 0 {
		v.detail = "no tenant to check"
	}
	if len(bad) > 0 {
		v.detail += fmt.Sprintf("; passed by %d: %s", len(bad), examples(bad))
	}
	return v
}

// window is a stretch of the run in which the soak made Redis unavailable,
// so that fail-closed answers (503) are expected.
type window struct {
	from, to time.Time
	what     string
}

func inWindow(at time.Time, ws []window) bool {
	for _, w := range ws {
		if !at.Before(w.from) && !at.After(w.to) {
			return true
		}
	}
	return false
}

// audit5xx holds the api's own 5xx answers to the fault windows.
func audit5xx(start time.Time, all []answer5xx, ws []window) verdict {
	var in int
	var bad []string
	for _, a := range all {
		if inWindow(a.at, ws) {
			in++
			continue
		}
		bad = append(bad, fmt.Sprintf("%d to %s at +%s", a.status, a.what, a.at.Sub(start).Round(100*time.Millisecond)))
	}
	v := verdict{name: "no-5xx-outside-faults", held: len(bad) == 0,
		detail: fmt.Sprintf("%d 5xx of the api inside %d fail-closed windows, %d outside", in, len(ws), len(bad))}
	if len(bad) > 0 {
		v.detail += ": " + examples(bad)
	}
	return v
}

// sample is one reading of an api process.
type sample struct {
	node       int
	pid        int
	at         time.Time
	rss        int64 // bytes
	goroutines int64
}

// flatness compares, per api process that lived long enough, the median of
// the first third of its readings after warm-up with that of the last
// third: flat when last ≤ first × 1.25 + slack. Readings inside a fault
// window are left out (a paused Redis holds requests, and their goroutines,
// for seconds).
func flatness(name, unit string, ss []sample, started map[int]time.Time, warmup time.Duration, ws []window,
	value func(sample) int64, slack int64, scale float64) verdict {
	byPID := map[int][]sample{}
	var pids []int
	for _, s := range ss {
		if s.at.Before(started[s.pid].Add(warmup)) || inWindow(s.at, ws) {
			continue
		}
		if _, ok := byPID[s.pid]; !ok {
			pids = append(pids, s.pid)
		}
		byPID[s.pid] = append(byPID[s.pid], s)
	}
	var parts, bad []string
	checked := 0
	for _, pid := range pids {
		run := byPID[pid]
		if len(run) < 6 {
			continue
		}
		checked++
		third := len(run) / 3
		first, last := median(run[:third], value), median(run[len(run)-third:], value)
		limit := int64(float64(first)*1.25) + slack
		part := fmt.Sprintf("node %d pid %d: %s -> %s (%d readings)", run[0].node, pid,
			fmtUnit(first, scale, unit), fmtUnit(last, scale, unit), len(run))
		parts = append(parts, part)
		if last > limit {
			bad = append(bad, part+fmt.Sprintf(", over %s", fmtUnit(limit, scale, unit)))
		}
	}
	v := verdict{name: name, held: checked > 0 && len(bad) == 0,
		detail: fmt.Sprintf("after %s of warm-up, first third -> last third: %s", warmup, strings.Join(parts, "; "))}
	if checked == 0 {
		v.detail = "no api process had 6 readings after warm-up"
	}
	if len(bad) > 0 {
		v.detail += "; grew: " + strings.Join(bad, "; ")
	}
	return v
}

func median(ss []sample, value func(sample) int64) int64 {
	vs := make([]int64, len(ss))
	for i, s := range ss {
		vs[i] = value(s)
	}
	slices.Sort(vs)
	return vs[len(vs)/2]
}

func fmtUnit(v int64, scale float64, unit string) string {
	if scale == 1 {
		return fmt.Sprintf("%d%s", v, unit)
	}
	return fmt.Sprintf("%.1f%s", float64(v)/scale, unit)
}

// auditCoverage holds the run to having sent every kind of request the
// soak is about, each answered at least once.
func auditCoverage(counts map[string]int64) verdict {
	kinds := []string{"admitted", "refused 429", "refused 402", "refunded by route", "refunded by api",
		"settled by header", "settled by api", "replayed"}
	var parts, missing []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
		if counts[k] == 0 {
			missing = append(missing, k)
		}
	}
	for _, k := range []string{"admitted fail-open", "lost", "connection refused", "api 5xx", "skipped"} {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	v := verdict{name: "traffic-covered", held: len(missing) == 0, detail: strings.Join(parts, ", ")}
	if len(missing) > 0 {
		v.detail += "; none: " + strings.Join(missing, ", ")
	}
	return v
}

// auditOdd holds the run to no answer outside the contract outside the
// fault windows; those inside are counted, not held against it (a settle
// whose Redis went away keeps the route cost, for one).
func auditOdd(start time.Time, odd []oddity, ws []window) verdict {
	var in []string
	var bad []string
	for _, o := range odd {
		s := fmt.Sprintf("%s at +%s", o.what, o.at.Sub(start).Round(100*time.Millisecond))
		if inWindow(o.at, ws) {
			in = append(in, s)
		} else {
			bad = append(bad, s)
		}
	}
	v := verdict{name: "answers-as-documented", held: len(bad) == 0,
		detail: fmt.Sprintf("%d answers outside the contract outside the fail-closed windows, %d inside", len(bad), len(in))}
	if len(bad) > 0 {
		v.detail += ": " + examples(bad)
	}
	if len(in) > 0 {
		v.detail += "; inside: " + examples(in)
	}
	return v
}

// byMeter shows the meters out of their bounds: "meter: low <= billed <=
// high, n admitted fail-open".
func byMeter(ms map[string][4]int64) string {
	var out []string
	for _, m := range slices.Sorted(maps.Keys(ms)) {
		b := ms[m]
		if b[1] < b[0] || b[1] > b[2] {
			out = append(out, fmt.Sprintf("%s: %d <= %d <= %d, %d admitted fail-open", m, b[0], b[1], b[2], b[3]))
		}
	}
	if len(out) == 0 {
		return "every meter within its bounds"
	}
	return strings.Join(out, ", ")
}
