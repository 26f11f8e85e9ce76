package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// metGoals are figures that meet every goal exactly at its bound.
func metGoals() figures {
	return figures{hotVsRedisRate: 1.5, manyVsRedisRate: 1.0, refusedVsBare: 0.8, hotMicros: 4, manyMicros: 12,
		tenantBytes: 256, p99Overhead: time.Millisecond, openLoop: true, tenants: 400}
}

func TestEvaluateGoals(t *testing.T) {
	goals := evaluate(metGoals())
	if len(goals) != 7 {
		t.Fatalf("got %d goals, want 7", len(goals))
	}
	for _, g := range goals {
		if !g.pass {
			t.Errorf("at its bound, %q fails with %s", g.what, g.got)
		}
	}
	for i, tc := range []struct {
		name   string
		change func(*figures)
		got    string
	}{
		{"hot tenant below 1.5×", func(f *figures) { f.hotVsRedisRate = 1.49 }, "1.49×"},
		{"400 tenants below 1.0×", func(f *figures) { f.manyVsRedisRate = 0.99 }, "0.99×"},
		{"hot tenant's Redis µs above 4", func(f *figures) { f.hotMicros = 4.01 }, "4.01"},
		{"400 tenants' Redis µs above 12", func(f *figures) { f.manyMicros = 12.01 }, "12.01"},
		{"refused below 0.8× bare", func(f *figures) { f.refusedVsBare = 0.79 }, "0.79×"},
		{"a tenant above 256 bytes", func(f *figures) { f.tenantBytes = 257 }, "257"},
		{"p99 overhead above 1ms", func(f *figures) { f.p99Overhead = time.Millisecond + time.Microsecond }, "1.001ms"},
	} {
		f := metGoals()
		tc.change(&f)
		for j, g := range evaluate(f) {
			if g.pass == (i == j) {
				t.Errorf("%s: goal %q pass=%t, want %t", tc.name, g.what, g.pass, i != j)
			}
			if i == j && g.got != tc.got {
				t.Errorf("%s: got %q, want %q", tc.name, g.got, tc.got)
			}
		}
	}
	// What was not measured fails, and says so.
	f := metGoals()
	f.hotMicros, f.manyMicros, f.tenantBytes, f.openLoop = math.NaN(), math.NaN(), -1, false
	for _, g := range evaluate(f)[2:] {
		if g.what[0] == 'r' { // the refused row was measured
			continue
		}
		if g.pass || (g.got != "nothing admitted" && g.got != "no keys found" && g.got != "not measured") {
			t.Errorf("unmeasured: %q pass=%t got %q, want a FAIL saying what is missing", g.what, g.pass, g.got)
		}
	}
}

func TestPrintGoals(t *testing.T) {
	f := metGoals()
	f.hotVsRedisRate = 0.72
	var b strings.Builder
	printGoals(&b, evaluate(f))
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 8 {
		t.Fatalf("got %d lines, want 7 goals and a count:\n%s", len(lines), b.String())
	}
	for i, want := range []string{
		"FAIL  admitted, 1 tenant ≥ 1.5× redis_rate, 1 key",
		"PASS  admitted, 400 tenants ≥ 1.0× redis_rate, 400 keys",
		"PASS  Redis µs per admission, 1 tenant ≤ 4",
		"PASS  Redis µs per admission, 400 tenants ≤ 12",
		"PASS  refused (deny cache) ≥ 0.8× bare Fiber",
		"PASS  bytes of Redis per tenant ≤ 256",
		"PASS  p99 at half load ≤ bare Fiber's + 1.000ms",
	} {
		if got := strings.TrimSpace(lines[i]); !strings.HasPrefix(got, want) {
			t.Errorf("line %d = %q, want it to start with %q", i, got, want)
		}
	}
	if !strings.HasSuffix(lines[0], "got 0.72×") {
		t.Errorf("line 0 = %q, want it to end with the figure, got 0.72×", lines[0])
	}
	if got := strings.TrimSpace(lines[7]); got != "6 of 7 goals met" {
		t.Errorf("last line = %q, want 6 of 7 goals met", got)
	}
	if strings.Contains(strings.ToLower(b.String()), "issue") {
		t.Errorf("the goals name an issue:\n%s", b.String())
	}
}
