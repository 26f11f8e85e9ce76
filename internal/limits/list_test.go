package limits

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

func i64(v int64) *int64     { return &v }
func f64(v float64) *float64 { return &v }

// a plan with every kind: burst 10 at 100/s, a bucket of 50 refilled at
// 4/s, 1,000 a day, 50,000 a month billed at 300, a cap of 5 dollars,
// credit, meter quotas of "search" (20 a day, 500 a month billed at 250)
// and of "export" (blocked), a policy.
func fullPlan() Plan {
	return Plan{
		Limits: quota.Limits{BurstRate: f64(100), Burst: i64(10), BucketCapacity: i64(50), BucketRefillPerSec: f64(4),
			DailyQuota: i64(1000), MonthlyQuota: i64(50000), MaxOverageCents: i64(500)},
		Overage: quota.OverageBill, OveragePriceCentsPer1K: 300, Prepaid: true,
		MeterQuotas: []quota.MeterQuota{
			{Meter: "search", DailyQuota: i64(20), MonthlyQuota: i64(500), Overage: quota.OverageBill, OveragePriceCentsPer1K: 250},
			{Meter: "export", MonthlyQuota: i64(3), Overage: quota.OverageBlock}},
		Policies: []string{"sliding_window:k"},
	}
}

func TestCompile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, meter, wire string
		mut               func(*Plan)
	}{
		{"every kind, the meter's billed quota before the tier's month", "search",
			"r,10000,10;b,250000,50;q,d,,1000,-1;q,d,search,20,-1;q,m,search,500,250;q,m,,50000,300;c,500000,300;p,300;x,sliding_window:k", nil},
		{"a blocked meter quota", "export",
			"r,10000,10;b,250000,50;q,d,,1000,-1;q,m,export,3,-1;q,m,,50000,300;c,500000,300;p,300;x,sliding_window:k", nil},
		{"a meter without a quota", "other",
			"r,10000,10;b,250000,50;q,d,,1000,-1;q,m,,50000,300;c,500000,300;p,300;x,sliding_window:k", nil},
		{"a tier that blocks: no price, its cap priced 0", "other", "q,m,,7,-1;c,1000,0", func(p *Plan) {
			*p = Plan{Limits: quota.Limits{MonthlyQuota: i64(7), MaxOverageCents: i64(1)}, Overage: quota.OverageBlock, OveragePriceCentsPer1K: 5}
		}},
		{"nothing", "m", "", func(p *Plan) { *p = Plan{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := fullPlan()
			if tc.mut != nil {
				tc.mut(&p)
			}
			l, err := Compile(p, tc.meter)
			if err != nil {
				t.Fatal(err)
			}
			if l.Wire() != tc.wire {
				t.Fatalf("wire %q, want %q", l.Wire(), tc.wire)
			}
			d, err := Decode(l.Wire())
			if err != nil || !reflect.DeepEqual(d.Entries, l.Entries) {
				t.Fatalf("Decode(Wire()) = %+v, %v; want %+v", d.Entries, err, l.Entries)
			}
		})
	}
}

func TestCompileRefusesWhatRedisWouldNot(t *testing.T) {
	t.Parallel()
	for field, l := range map[string]quota.Limits{
		"burst":           {BurstRate: f64(quota.MinRate), Burst: i64(2_000_000)},
		"bucket_capacity": {BucketRefillPerSec: f64(quota.MinRate), BucketCapacity: i64(2_000_000)},
		"daily_quota":     {DailyQuota: i64(-1)},
	} {
		_, err := Compile(Plan{Limits: l}, "m")
		var e *quota.Error
		if !errors.As(err, &e) || e.Code != quota.CodeInvalid || e.Field != field {
			t.Errorf("%s: got %v, want an invalid %s", field, err, field)
		}
	}
	// the largest windows that fit
	if _, err := Compile(Plan{Limits: quota.Limits{BurstRate: f64(1), Burst: i64(quota.MaxWindowMicros / 1e6),
		BucketRefillPerSec: f64(1), BucketCapacity: i64(quota.MaxWindowMicros / 1e6)}}, "m"); err != nil {
		t.Errorf("windows of 2^50 µs: %v", err)
	}
}

func TestPlanOf(t *testing.T) {
	t.Parallel()
	req := quota.Request{Limits: quota.Limits{DailyQuota: i64(3)}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 7,
		MeterQuotas: []quota.MeterQuota{{Meter: "a"}}, Prepaid: &quota.Prepaid{}, Calendar: quota.Calendar{AnchorDay: 3}}
	p := PlanOf(req)
	if !reflect.DeepEqual(p, Plan{Limits: req.Limits, Overage: req.Overage, OveragePriceCentsPer1K: 7,
		MeterQuotas: req.MeterQuotas, Prepaid: true, Calendar: req.Calendar}) {
		t.Fatalf("PlanOf: %+v", p)
	}
	if PlanOf(quota.Request{}).Prepaid {
		t.Fatal("a postpaid request's plan is prepaid")
	}
}

func TestDecodeRefusesMalformedLists(t *testing.T) {
	t.Parallel()
	for _, wire := range []string{"r,1", "r,1,2,3", "b,x,2", "q,w,,1,2", "q,d,,1", "c,1", "c,1,2,3", "p", "p,1,2", "z,1", "rr,1,2", ";", "q,d,,1,x", "q,d,,1,-1;q,d,,1,-1;q,d,,1,-1;q,d,,1,-1;q,d,,1,-1"} {
		if l, err := Decode(wire); err == nil {
			t.Errorf("Decode(%q) = %+v, want an error", wire, l.Entries)
		}
	}
	l, err := Decode("x,a,b;p,5")
	if err != nil || len(l.Entries) != 2 || l.Entries[0].Spec != "a,b" || l.Entries[1] != (Entry{Kind: Credit, Price: 5}) {
		t.Fatalf("Decode: %+v %v", l, err)
	}
}

func TestPositions(t *testing.T) {
	t.Parallel()
	if got := Index(Functions[0].Args, "list"); got != 3 {
		t.Errorf("admit's list is ARGV[%d], want 3", got)
	}
	if got := Index(Functions[0].Args, "nope"); got != 0 {
		t.Errorf("an unknown name's index %d, want 0", got)
	}
	res := Functions[0].Results
	if len(res) != resultMeterLen || Index(res, "meter_overage") != resultMeterLen || Index(res, "monthly_reset") != resultLen {
		t.Errorf("admit's results: %d names, meter_overage %d, monthly_reset %d; want %d, %d, %d",
			len(res), Index(res, "meter_overage"), Index(res, "monthly_reset"), resultMeterLen, resultMeterLen, resultLen)
	}
	d := Decision{Allowed: true, Mask: 2, Retry: 3, Overage: 4, Now: 5, Idem: 1, MeterOverage: 9,
		Items: [nItems]Item{{true, 1, 2, 3}, {}, {true, 4, 5, 6}, {true, 7, 8, 9}, {true, 10, 11, 12}, {true, 13, 14, 15}}}
	for _, meter := range []bool{false, true} {
		f := d.Flat(meter)
		if f[Index(res, "overage")-1] != 4 || f[Index(res, "daily_limit")-1] != 4 || f[Index(res, "monthly_reset")-1] != 9 {
			t.Errorf("Flat(%t) = %v: not at the positions of Functions", meter, f)
		}
		back := decodeFlat(f)
		want := d
		if !meter {
			want.Items[ItemMeterDaily], want.Items[ItemMeterMonthly], want.MeterOverage = Item{}, Item{}, 0
		}
		if back != want {
			t.Errorf("decodeFlat(Flat(%t)) = %+v, want %+v", meter, back, want)
		}
	}
}

func TestQuotaDecision(t *testing.T) {
	t.Parallel()
	ny, err := quota.LoadZone("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	l, err := Compile(fullPlan(), "search")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2031, 3, 10, 12, 0, 0, 0, time.UTC)
	d := Decision{Allowed: false, Retry: 1500, Now: now.UnixMicro(), Overage: 2, MeterOverage: 3,
		Mask:  BitBurst | BitMonthly | BitSpendCap | BitCredit | BitMeterDaily | BitMeterMonthly | BitPolicy,
		Items: [nItems]Item{{true, 10, 1, 7}, {}, {true, 1000, 5, 8}, {}, {true, 20, 3, 9}, {}}}
	q := d.Quota(l)
	if q.Allowed || q.RetryAfter != 1500*time.Microsecond || q.OverageUnits != 2 || q.MeterOverageUnits != 3 || !q.Now.Equal(now) {
		t.Fatalf("head: %+v", q)
	}
	if want := []quota.LimitName{"burst", "monthly", "spend_cap", "credit", "search.daily", "search.monthly"}; !reflect.DeepEqual(q.Violated, want) {
		t.Errorf("violated %v, want %v", q.Violated, want)
	}
	want := []quota.LimitState{
		{Name: "burst", Limit: 10, Remaining: 1, Reset: time.UnixMicro(7).UTC(), Window: 100 * time.Millisecond},
		{Name: "daily", Limit: 1000, Remaining: 5, Reset: time.UnixMicro(8).UTC(), Window: 24 * time.Hour},
		{Name: "search.daily", Limit: 20, Remaining: 3, Reset: time.UnixMicro(9).UTC(), Window: 24 * time.Hour},
	}
	if !reflect.DeepEqual(q.Limits, want) {
		t.Errorf("limits %+v\nwant %+v", q.Limits, want)
	}
	// an admission: no retry; windows of a calendar (a 23-hour day, a
	// billing month from March 15 to April 15 in New York)
	l.Calendar = quota.Calendar{Zone: ny, AnchorDay: 15}
	d = Decision{Allowed: true, Retry: 7, Now: time.Date(2031, 3, 9, 12, 0, 0, 0, time.UTC).UnixMicro(),
		Items: [nItems]Item{{}, {true, 50, 1, 1}, {}, {true, 9, 9, 9}, {}, {true, 1, 1, 1}}}
	q = d.Quota(l)
	if q.RetryAfter != 0 || q.Violated != nil || len(q.Limits) != 3 {
		t.Fatalf("an admission: %+v", q)
	}
	if w := q.Limits[0].Window; w != 12500*time.Millisecond {
		t.Errorf("bucket window %v, want 12.5s", w)
	}
	if w := q.Limits[1].Window; q.Limits[1].Name != "monthly" || w != 28*24*time.Hour-time.Hour {
		t.Errorf("%s window %v, want the period from Feb 15 to Mar 15 (28 days less an hour)", q.Limits[1].Name, w)
	}
	if w := q.Limits[2].Window; q.Limits[2].Name != "search.monthly" || w != 28*24*time.Hour-time.Hour {
		t.Errorf("%s window %v", q.Limits[2].Name, w)
	}
	// a list without a meter quota names no meter limit
	l2, _ := Compile(Plan{Limits: quota.Limits{DailyQuota: i64(1)}}, "m")
	q = Decision{Mask: BitMeterDaily, Items: [nItems]Item{ItemDaily: {true, 1, 1, 1}}}.Quota(l2)
	if len(q.Limits) != 1 || q.Violated[0] != "" {
		t.Errorf("no meter quota: %+v", q)
	}
}
