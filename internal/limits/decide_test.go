package limits

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

var t0 = time.Date(2031, 3, 10, 10, 30, 0, 0, time.UTC).UnixMicro() // its hour starts at 1930903200 s

func mustCompile(tb testing.TB, p Plan, meter string) *List {
	tb.Helper()
	l, err := Compile(p, meter)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// TestPolicyVerdicts: an enforced policy's refusal refuses (its wait
// folded in), a degrade policy's makes the request degraded only when
// nothing else refuses, a shadow policy's is counted; each refusal is
// counted in the hour's pending usage, nothing consumed.
func TestPolicyVerdicts(t *testing.T) {
	t.Parallel()
	l := mustCompile(t, Plan{Limits: quota.Limits{DailyQuota: i64(1)}}, "m")
	for _, tc := range []struct {
		name   string
		pv     PolicyVerdict
		cost   int64
		mask   int64
		retry  int64
		counts map[string]int64
	}{
		{"refused", PolicyVerdict{Refused: true, Wait: 5}, 1, BitPolicy, 5, map[string]int64{"p1930903200|m|x": 1}},
		{"refused for good", PolicyVerdict{Refused: true, Wait: -1, Degraded: true}, 1, BitPolicy, -1, map[string]int64{"p1930903200|m|x": 1}},
		{"degraded", PolicyVerdict{Degraded: true}, 1, BitDegraded, 0, map[string]int64{"p1930903200|m|d": 1}},
		{"degraded, but the quota refuses", PolicyVerdict{Degraded: true}, 2, BitDaily, -1, map[string]int64{"p1930903200|m|x": 1}},
		{"shadowed", PolicyVerdict{Shadowed: true}, 1, 0, 0, map[string]int64{"p1930903200|m|s": 1}},
	} {
		var s State
		d, err := l.Decide(&s, Request{Now: t0, Cost: tc.cost, Meter: "m", Policies: tc.pv})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (tc.mask == 0) || d.Mask != tc.mask || d.Retry != tc.retry {
			t.Errorf("%s: %+v, want mask %d retry %d", tc.name, d, tc.mask, tc.retry)
		}
		if !reflect.DeepEqual(s.Counts, tc.counts) || s.Exists != (tc.mask == 0) {
			t.Errorf("%s: counts %v exists %t, want %v", tc.name, s.Counts, s.Exists, tc.counts)
		}
	}
}

// TestCredit: a prepaid tenant's balance of another period is an error
// that changes nothing; without a balance the credit is not checked.
func TestCredit(t *testing.T) {
	t.Parallel()
	l := mustCompile(t, Plan{Limits: quota.Limits{MonthlyQuota: i64(0)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000, Prepaid: true}, "m")
	var s State
	_, err := l.Decide(&s, Request{Now: t0, Cost: 1, Meter: "m", Prepaid: &quota.Prepaid{BalanceMillicents: 5000, PeriodID: 203102}})
	var stale *quota.PrepaidStaleError
	if !errors.As(err, &stale) || stale.Now.UnixMicro() != t0 || s.Exists {
		t.Fatalf("a balance of February in March: %v, %+v", err, s)
	}
	d, err := l.Decide(&s, Request{Now: t0, Cost: 6, Meter: "m"})
	if err != nil || !d.Allowed || d.Overage != 6 || s.Draws != (Draws{}) {
		t.Fatalf("no balance given: %+v %v draws %+v", d, err, s.Draws)
	}
	pp := &quota.Prepaid{BalanceMillicents: 6000 + 999, Lines: 2, PeriodID: 203103}
	// the first draw counts the 6 units already billed (at 1,000 each),
	// and 999 are held for the second line: 1 more unit needs 7,999
	d, err = l.Decide(&s, Request{Now: t0, Cost: 1, Meter: "m", Prepaid: pp})
	if err != nil || d.Allowed || d.Mask != BitCredit || d.Retry != -1 {
		t.Fatalf("past the balance: %+v %v", d, err)
	}
	pp.BalanceMillicents += 1000
	if d, _ = l.Decide(&s, Request{Now: t0, Cost: 1, Meter: "m", Prepaid: pp}); !d.Allowed || s.Draws != (Draws{203103, 7000, -1, 0}) {
		t.Fatalf("within it: %+v draws %+v", d, s.Draws)
	}
	// the previous period while its invoice is open: its draws past what
	// it may draw (pexp) count too
	s.Draws = Draws{203103, 0, 203102, 3000}
	pp = &quota.Prepaid{BalanceMillicents: 1000, Lines: 1, PeriodID: 203103, PrevID: 203102, ExpiringMillicents: 3499}
	if d, _ = l.Decide(&s, Request{Now: t0, Cost: 1, Meter: "m", Prepaid: pp}); d.Allowed {
		t.Fatalf("with 500 of the previous period's past what it may draw: %+v", d)
	}
	pp.ExpiringMillicents = 3999 // (its draws and the 999 its line may round up)
	if d, _ = l.Decide(&s, Request{Now: t0, Cost: 1, Meter: "m", Prepaid: pp}); !d.Allowed {
		t.Fatalf("with none past it: %+v", d)
	}
	pp.PrevID = 0
	s.Draws = Draws{203103, 0, 203102, 3000}
	if d, _ = l.Decide(&s, Request{Now: t0, Cost: 1, Meter: "m", Prepaid: &quota.Prepaid{BalanceMillicents: 1000, PeriodID: 203103}}); !d.Allowed {
		t.Fatalf("the previous period's invoice final: %+v", d)
	}
}

// TestIdempotency: a record decides for 24 hours: another fingerprint is a
// mismatch, a record in flight (before its lease) is in flight; a dry run
// ignores it; a replay answers the first decision.
func TestIdempotency(t *testing.T) {
	t.Parallel()
	l := mustCompile(t, Plan{Limits: quota.Limits{MonthlyQuota: i64(10)}}, "m")
	var s State
	first, _ := l.Decide(&s, Request{Now: t0, Cost: 3, Meter: "m", IdemKey: "k", Fingerprint: "a", Lease: 60e6})
	for _, tc := range []struct {
		name string
		r    Request
		want quota.IdemOutcome
	}{
		{"another fingerprint", Request{Now: t0 + 1, Cost: 3, IdemKey: "k", Fingerprint: "b"}, quota.IdemMismatch},
		{"in flight", Request{Now: t0 + 60e6 - 1, Cost: 3, IdemKey: "k", Fingerprint: "a"}, quota.IdemInFlight},
		{"past its lease: a new attempt", Request{Now: t0 + 60e6, Cost: 3, IdemKey: "k", Fingerprint: "a"}, quota.IdemNone},
	} {
		c := State{Counters: s.Counters, Idem: map[string]IdemRecord{"k": s.Idem["k"]}}
		d, _ := l.Decide(&c, tc.r)
		if d.Idem != tc.want {
			t.Errorf("%s: %+v, want idem %d", tc.name, d, tc.want)
		}
		if tc.want != quota.IdemNone && (d.Allowed || d.Items != [nItems]Item{} || c.Counters != s.Counters) {
			t.Errorf("%s: decided something: %+v", tc.name, d)
		}
	}
	s.StoreAnswer("k", "a")
	d, _ := l.Decide(&s, Request{Now: t0 + 5, Cost: 3, Meter: "m", IdemKey: "k", Fingerprint: "a", Mode: Dry})
	if d.Idem != quota.IdemNone || d.Items[ItemMonthly].Remaining != 4 {
		t.Errorf("a dry run with the key: %+v", d)
	}
	d, _ = l.Decide(&s, Request{Now: t0 + 5, Cost: 3, Meter: "m", IdemKey: "k", Fingerprint: "a"})
	first.Idem, first.Now = quota.IdemReplayed, t0+5
	if d != first || s.MonthUsed != 3 {
		t.Errorf("a replay: %+v\nwant %+v (month used %d)", d, first, s.MonthUsed)
	}
	d, _ = l.Decide(&s, Request{Now: t0 + idemUS, Cost: 3, Meter: "m", IdemKey: "k", Fingerprint: "a"})
	if d.Idem != quota.IdemNone || s.MonthUsed != 6 || s.Idem["k"].At != t0+idemUS {
		t.Errorf("after 24 hours: %+v (month used %d)", d, s.MonthUsed)
	}
}

// TestReport: the limits as they stand, one more unit judged.
func TestReport(t *testing.T) {
	t.Parallel()
	l := mustCompile(t, Plan{Limits: quota.Limits{BurstRate: f64(1), Burst: i64(2), DailyQuota: i64(1)}}, "m")
	var s State
	if d := l.Report(&s, t0); !d.Allowed || d.Items[ItemBurst] != (Item{true, 2, 2, t0}) || d.Items[ItemDaily].Remaining != 1 || s.Exists {
		t.Fatalf("report of nothing: %+v", d)
	}
	if _, err := l.Decide(&s, Request{Now: t0, Cost: 1, Meter: "m"}); err != nil {
		t.Fatal(err)
	}
	if d := l.Report(&s, t0); d.Allowed || d.Mask != BitDaily || d.Items[ItemBurst] != (Item{true, 2, 1, t0 + 1e6}) {
		t.Fatalf("report after one: %+v", d)
	}
}
