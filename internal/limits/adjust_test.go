package limits

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// TestSpend: the meters' spend of a month moves where it is held; a
// charge of a month neither field holds takes an earlier one's place; a
// later month's total is never written over.
func TestSpend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		spent, before Spend
		month, dmc    int64
		wantS, wantB  Spend
	}{
		{"this month", Spend{5, 100}, Spend{4, 50}, 5, -30, Spend{5, 70}, Spend{4, 50}},
		{"never below 0", Spend{5, 100}, Spend{}, 5, -300, Spend{5, 0}, Spend{}},
		{"the month before", Spend{5, 100}, Spend{4, 50}, 4, 20, Spend{5, 100}, Spend{4, 70}},
		{"a later month: the spend moves to before", Spend{5, 100}, Spend{4, 50}, 6, 20, Spend{6, 20}, Spend{5, 100}},
		{"a later month, none before", Spend{}, Spend{}, 6, 20, Spend{6, 20}, Spend{}},
		{"a later month, only a month before", Spend{}, Spend{4, 50}, 6, 20, Spend{6, 20}, Spend{4, 50}},
		{"a later month than a later month before", Spend{3, 5}, Spend{4, 50}, 6, 20, Spend{6, 20}, Spend{3, 5}},
		{"the month before's, later than the spend's", Spend{3, 5}, Spend{6, 50}, 6, -20, Spend{3, 5}, Spend{6, 30}},
		{"between: before's place", Spend{7, 100}, Spend{4, 50}, 5, 20, Spend{7, 100}, Spend{5, 20}},
		{"between, no before", Spend{7, 100}, Spend{}, 5, 20, Spend{7, 100}, Spend{5, 20}},
		{"earlier than both", Spend{7, 100}, Spend{6, 50}, 5, 20, Spend{7, 100}, Spend{6, 50}},
		{"a give-back of a month not held", Spend{7, 100}, Spend{}, 6, -20, Spend{7, 100}, Spend{}},
		{"nothing", Spend{7, 100}, Spend{6, 1}, 7, 0, Spend{7, 100}, Spend{6, 1}},
		{"the same month in both: the spend", Spend{7, 100}, Spend{7, 5}, 7, 1, Spend{7, 101}, Spend{7, 5}},
	} {
		s := State{Spent: tc.spent, SpentBefore: tc.before}
		s.spend(tc.month, tc.dmc)
		if s.Spent != tc.wantS || s.SpentBefore != tc.wantB {
			t.Errorf("%s: %+v %+v, want %+v %+v", tc.name, s.Spent, s.SpentBefore, tc.wantS, tc.wantB)
		}
	}
	s := State{Spent: Spend{7, 100}, SpentBefore: Spend{6, 50}}
	if a, b, c := s.spentIn(7), s.spentIn(6), s.spentIn(5); a != 100 || b != 50 || c != 0 {
		t.Errorf("spentIn: %d %d %d", a, b, c)
	}
}

// TestDraw: a prepaid tenant's draws move in their period; a charge of a
// period later than the field's starts it, one between the two takes the
// earlier one's place.
func TestDraw(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		d          Draws
		month, dmc int64
		want       Draws
	}{
		{"this period", Draws{5, 100, 4, 50}, 5, -30, Draws{5, 70, 4, 50}},
		{"the period before", Draws{5, 100, 4, 50}, 4, -60, Draws{5, 100, 4, 0}},
		{"a later period", Draws{5, 100, 4, 50}, 6, 10, Draws{6, 10, 5, 100}},
		{"the first", Draws{}, 6, 10, Draws{6, 10, -1, 0}},
		{"between", Draws{7, 100, 4, 50}, 5, 10, Draws{7, 100, 5, 10}},
		{"earlier than both", Draws{7, 100, 6, 50}, 5, 10, Draws{7, 100, 6, 50}},
		{"a give-back of a period not held", Draws{7, 100, 6, 50}, 8, -10, Draws{7, 100, 6, 50}},
		{"nothing", Draws{}, 8, 0, Draws{}},
		{"nothing of this period", Draws{8, 5, 7, 1}, 8, 0, Draws{8, 5, 7, 1}},
		{"a give-back below 0", Draws{8, 5, 7, 1}, 7, -9, Draws{8, 5, 7, 0}},
	} {
		s := State{Draws: tc.d}
		s.draw(tc.month, tc.dmc)
		if s.Draws != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, s.Draws, tc.want)
		}
	}
}

func TestAdmissionOf(t *testing.T) {
	t.Parallel()
	at := time.Date(2031, 3, 15, 3, 59, 0, 0, time.UTC)
	d := quota.Decision{Now: at, OverageUnits: 2, MeterOverageUnits: 3}
	req := quota.Request{Meter: "m", Cost: 9}
	if a := AdmissionOf(req, d); a != (Admission{Meter: "m", Cost: 9, Overage: 2, MeterOverage: 3, Day: 22353, Month: 203103,
		HourStart: at.Truncate(time.Hour).Unix()}) {
		t.Errorf("UTC: %+v", a)
	}
	ny, err := quota.LoadZone("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	req.Calendar = quota.Calendar{Zone: ny, AnchorDay: 15}
	if a := AdmissionOf(req, d); a.Day != 22352 || a.Month != 203102 {
		t.Errorf("New York, anchor 15, before its midnight: day %d month %d, want 22352 (March 14) and 203102", a.Day, a.Month)
	}
}

// TestGiveBackAndCharge: the money of an admission's units, given back
// or charged in its month.
func TestGiveBackAndCharge(t *testing.T) {
	t.Parallel()
	l := mustCompile(t, Plan{Limits: quota.Limits{MonthlyQuota: i64(10), MaxOverageCents: i64(6)}, Overage: quota.OverageBill,
		OveragePriceCentsPer1K: 1000, Prepaid: true,
		MeterQuotas: []quota.MeterQuota{{Meter: "m", MonthlyQuota: i64(4), Overage: quota.OverageBill, OveragePriceCentsPer1K: 2000}}}, "m")
	pp := &quota.Prepaid{BalanceMillicents: 1 << 40, PeriodID: 203103}
	var s State
	d, _ := l.Decide(&s, Request{Now: t0, Cost: 5, Meter: "m", Prepaid: pp}) // 1 of the meter's overage
	a := Admission{Meter: "m", Cost: 5, Overage: d.Overage, MeterOverage: d.MeterOverage, Day: t0 / dayUS, Month: 203103, HourStart: 1930903200}
	if d.MeterOverage != 1 || s.Spent != (Spend{203103, 2000}) || s.Draws.Millicents != 2000 {
		t.Fatalf("admission: %+v %+v %+v", d, s.Spent, s.Draws)
	}
	// charged 6 more: 6 past the meter's quota, of which the cap's room
	// (4 cents) bills 2 at 2,000, the rest unbilled; the tier's quota (11
	// of 10) claims 1, which the meter's claim covers
	if delta, over := l.Settle(&s, a, 11); delta != 6 || over != 0 {
		t.Fatalf("settle up: %d %d", delta, over)
	}
	if m := s.Meters["m"]; m.Used != 11 || m.Over != 3 || s.Spent.Millicents != 6000 || s.Draws.Millicents != 6000 || s.MonthUsed != 11 {
		t.Fatalf("after the charge: %+v spent %+v draws %+v month %d", m, s.Spent, s.Draws, s.MonthUsed)
	}
	if s.Counts["p1930903200|m|u"] != 6 || s.Counts["p1930903200|m|m"] != 1+2 {
		t.Fatalf("pending: %v", s.Counts)
	}
	// given back: its last units first, the meter's overage (1 it took)
	if over := l.GiveBack(&s, a, 5); over != 0 || s.Meters["m"].Over != 2 || s.Spent.Millicents != 4000 || s.Draws.Millicents != 4000 {
		t.Fatalf("give back: %d %+v %+v %+v", over, s.Meters["m"], s.Spent, s.Draws)
	}
	if delta, over := l.Settle(&s, a, 5); delta != 0 || over != 0 {
		t.Fatalf("settled to its cost: %d %d", delta, over)
	}
}

// TestGrantAndReset: a grant with an id is applied once, in its period
// only; its mark goes with the month (and the count with every mark at a
// roll, as the scripts keep it); a reset applies once per stamp.
func TestGrantAndReset(t *testing.T) {
	t.Parallel()
	var s State
	march := int64(203103)
	if n := Grant(&s, quota.Calendar{}, t0, true, 5, "g1", 203102); n != -1 || s.Exists {
		t.Fatalf("a grant of February in March: %d %+v", n, s)
	}
	if n := Grant(&s, quota.Calendar{}, t0, true, 5, "g1", march); n != 1 || s.MonthGrant != 5 || s.Marks != 1 || s.Grants["g1"] != 5 {
		t.Fatalf("a grant: %d %+v", n, s)
	}
	if n := Grant(&s, quota.Calendar{}, t0, true, 5, "g1", march); n != 0 || s.MonthGrant != 5 {
		t.Fatalf("the same grant again: %d %+v", n, s)
	}
	if n := Grant(&s, quota.Calendar{}, t0, false, 2, "", 0); n != 1 || s.DayGrant != 2 || s.Marks != 1 {
		t.Fatalf("a day's grant without an id: %d %+v", n, s)
	}
	april := time.Date(2031, 4, 2, 0, 0, 0, 0, time.UTC).UnixMicro()
	if n := Grant(&s, quota.Calendar{}, april, true, 3, "g2", 0); n != 1 || s.MonthGrant != 3 || s.Marks != 0 ||
		len(s.Grants) != 1 || s.Grants["g2"] != 3 || s.Before.Grant != 5 {
		t.Fatalf("April's grant: %d %+v", n, s)
	}
	if n := Reset(&State{}, 1, 1, 1, t0); n != -1 {
		t.Fatalf("a reset of nothing: %d", n)
	}
	s.MonthUsed, s.DayUsed, s.MonthOver = 7, 4, 2
	s.Meters = map[string]MeterCount{"m": {s.Day, 3, s.Month, 6, 1}, "old": {1, 2, 3, 4, 5}}
	if n := Reset(&s, 10, s.Day, s.Month, t0); n != 1 || s.MonthUsed != 0 || s.DayUsed != 0 || s.MonthOver != 2 ||
		s.Meters["m"] != (MeterCount{s.Day, 0, s.Month, 0, 1}) || s.Meters["old"] != (MeterCount{1, 2, 3, 4, 5}) || s.ResetStamp != 10 {
		t.Fatalf("a reset: %d %+v", n, s)
	}
	s.MonthUsed = 1
	if n := Reset(&s, 10, s.Day, s.Month, t0); n != 0 || s.MonthUsed != 1 {
		t.Fatalf("the same reset again: %d %+v", n, s)
	}
	if n := Reset(&s, 11, s.Day-1, s.Month-1, t0); n != -1 || s.ResetStamp != 10 {
		t.Fatalf("a reset of periods before the state's: %d %+v", n, s)
	}
	if n := Reset(&s, 12, s.Day-1, s.Month, t0); n != 1 || s.MonthUsed != 0 {
		t.Fatalf("a reset of the month only: %d %+v", n, s)
	}
}
