package main

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestAuditBillingHoldsEachTenantBetweenAnsweredAndLost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		recs   []tenantRecord
		held   bool
		detail string
	}{
		{"billed as answered", []tenantRecord{{id: "a", low: 10, high: 10, billed: billed{units: 10}}}, true, "answered 2xx 10 <= billed 10"},
		{"lost answers billed", []tenantRecord{{id: "a", low: 10, high: 13, billed: billed{units: 12}}}, true, "<= answered + lost 13"},
		{"answered, not billed", []tenantRecord{{id: "a", kind: kindPost, low: 10, high: 13, billed: billed{units: 9}}}, false, "postpaid tenant a: answered 10, billed 9"},
		{"billed twice", []tenantRecord{
			{id: "a", low: 5, high: 5, billed: billed{units: 5}},
			{id: "b", kind: kindOpen, low: 10, high: 10, billed: billed{units: 11},
				meters: map[string][4]int64{"plain": {4, 5, 4, 1}, "check": {6, 6, 6, 0}}},
		}, false, "1 tenants out of bounds: fail-open tenant b: answered 10, billed 11, answered+lost 10 (plain: 4 <= 5 <= 4, 1 admitted fail-open)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := auditBilling(tc.recs)
			if v.held != tc.held || !strings.Contains(v.detail, tc.detail) {
				t.Errorf("got held %v, %q; want held %v with %q", v.held, v.detail, tc.held, tc.detail)
			}
		})
	}
}

func TestAuditLimitSkipsUncheckedAndNamesThePassed(t *testing.T) {
	quota := func(r tenantRecord) int64 { return r.quota }
	units := func(r tenantRecord) int64 { return r.billed.units }
	recs := []tenantRecord{
		{id: "a", kind: kindPost, quota: 100, billed: billed{units: 100}},
		{id: "b", kind: kindOpen, quota: -1, billed: billed{units: 1 << 40}},
	}
	if v := auditLimit("quota", "q", recs, quota, units); !v.held || !strings.Contains(v.detail, "1 tenants") || !strings.Contains(v.detail, "100%") {
		t.Errorf("at the quota: got %v", v)
	}
	recs[0].billed.units = 101
	if v := auditLimit("quota", "q", recs, quota, units); v.held || !strings.Contains(v.detail, "postpaid tenant a: 101 > 100") {
		t.Errorf("past the quota: got %v, want BROKEN naming tenant a", v)
	}
	if v := auditLimit("quota", "q", recs[1:], quota, units); v.held {
		t.Errorf("no tenant checked: got %v, want BROKEN (a promise nobody was held to did not hold)", v)
	}
}

func TestAudit5xxOnlyInsideTheFaultWindows(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	ws := []window{{from: t0.Add(10 * time.Second), to: t0.Add(20 * time.Second)}}
	in := []answer5xx{{at: t0.Add(10 * time.Second), status: 503}, {at: t0.Add(20 * time.Second), status: 503}}
	if v := audit5xx(t0, in, ws); !v.held {
		t.Errorf("5xx at a window's edges: got %v, want held", v)
	}
	out := append(in, answer5xx{at: t0.Add(21 * time.Second), status: 500, what: "postpaid /api/p/plain"})
	if v := audit5xx(t0, out, ws); v.held || !strings.Contains(v.detail, "500 to postpaid /api/p/plain at +21s") {
		t.Errorf("a 500 after the window: got %v, want BROKEN naming it", v)
	}
}

func TestFlatnessComparesFirstAndLastThirdAfterWarmUp(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	started := map[int]time.Time{7: t0}
	series := func(vals ...int64) []sample {
		var ss []sample
		for i, v := range vals {
			ss = append(ss, sample{node: 1, pid: 7, at: t0.Add(time.Duration(i+1) * 10 * time.Second), goroutines: v})
		}
		return ss
	}
	g := func(s sample) int64 { return s.goroutines }
	// The first reading (at 10s) is warm-up and left out, however high.
	if v := flatness("g", "", series(900, 40, 41, 40, 42, 40, 41), started, 15*time.Second, nil, g, 0, 1); !v.held {
		t.Errorf("flat after warm-up: got %v", v)
	}
	if v := flatness("g", "", series(40, 40, 40, 60, 80, 100, 120), started, 15*time.Second, nil, g, 0, 1); v.held {
		t.Errorf("growing: got %v, want BROKEN", v)
	}
	// A spike inside a fault window does not count.
	ws := []window{{from: t0.Add(55 * time.Second), to: t0.Add(75 * time.Second)}}
	if v := flatness("g", "", series(40, 40, 40, 40, 40, 500, 500, 40, 40, 40), started, 15*time.Second, ws, g, 0, 1); !v.held {
		t.Errorf("a spike in a fault window: got %v, want held", v)
	}
	if v := flatness("g", "", series(40, 40, 40), started, 15*time.Second, nil, g, 0, 1); v.held {
		t.Errorf("too few readings: got %v, want BROKEN", v)
	}
}

func TestAuditCoverageNamesTheKindsNeverSeen(t *testing.T) {
	counts := map[string]int64{"admitted": 5, "refused 429": 1, "refused 402": 1, "refunded by route": 1,
		"refunded by api": 1, "settled by header": 1, "settled by api": 1, "replayed": 1}
	if v := auditCoverage(counts); !v.held {
		t.Errorf("every kind seen: got %v", v)
	}
	delete(counts, "replayed")
	if v := auditCoverage(counts); v.held || !strings.HasSuffix(v.detail, "none: replayed") {
		t.Errorf("no replay: got %v, want BROKEN naming replayed", v)
	}
}

func TestBoundsOfAnAnswer(t *testing.T) {
	up := http.Header{"X-Soak-Upstream": {"1"}}
	for _, tc := range []struct {
		name      string
		r         reply
		low, high int64
	}{
		{"admitted", reply{status: 200}, 5, 5},
		{"refused", reply{status: 429}, 0, 0},
		{"no credit", reply{status: 402}, 0, 0},
		{"lost", reply{lost: true}, 0, 5},
		{"never sent", reply{refused: true}, 0, 0},
		{"the api's 503", reply{status: 503, header: http.Header{}}, 0, 5},
		{"the upstream's 503", reply{status: 503, header: up}, 0, 0},
	} {
		if low, high := bounds(tc.r, 5); low != tc.low || high != tc.high {
			t.Errorf("%s: got (%d, %d), want (%d, %d)", tc.name, low, high, tc.low, tc.high)
		}
	}
}

func TestSettingsFromTheEnvironment(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	s, err := load(env(nil))
	if err != nil || s.duration != 10*time.Minute || s.dir != ".data/soak" {
		t.Fatalf("defaults: got %+v, %v", s, err)
	}
	s, err = load(env(map[string]string{"SOAK_DURATION": "60s", "SOAK_RATE": "40"}))
	if err != nil || s.duration != time.Minute || s.rate != 40 {
		t.Fatalf("SOAK_DURATION=60s SOAK_RATE=40: got %+v, %v", s, err)
	}
	for _, bad := range []map[string]string{{"SOAK_DURATION": "1s"}, {"SOAK_DURATION": "ten"}, {"SOAK_RATE": "0"}, {"SOAK_TENANTS": "3"}} {
		if _, err := load(env(bad)); err == nil {
			t.Errorf("%v: got no error", bad)
		}
	}
}

func TestAuditOddForgivesOnlyInsideTheWindows(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	ws := []window{{from: t0.Add(10 * time.Second), to: t0.Add(20 * time.Second)}}
	inside := []oddity{{at: t0.Add(15 * time.Second), what: "settle kept the route cost"}}
	if v := auditOdd(t0, inside, ws); !v.held || !strings.Contains(v.detail, "0 answers outside the contract outside the fail-closed windows, 1 inside") {
		t.Errorf("inside a window: got %v, want held, counting it", v)
	}
	outside := append(inside, oddity{at: t0.Add(30 * time.Second), what: "a 404 to a refund"})
	if v := auditOdd(t0, outside, ws); v.held || !strings.Contains(v.detail, ": a 404 to a refund at +30s") {
		t.Errorf("outside a window: got %v, want BROKEN naming it", v)
	}
}
