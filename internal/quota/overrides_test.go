package quota

import (
	"encoding/json"
	"testing"
)

func TestOverridesJSONTellsAbsentFromNull(t *testing.T) {
	var o Overrides
	if err := json.Unmarshal([]byte(`{"daily_quota": 5000, "burst_rate": null, "burst": null, "max_overage_cents": 250}`), &o); err != nil {
		t.Fatal(err)
	}
	tier := Limits{BurstRate: Ptr(5.0), Burst: Ptr(int64(10)), DailyQuota: Ptr(int64(1000)), MonthlyQuota: Ptr(int64(9000)),
		MaxOverageCents: Ptr(int64(100))}
	got := o.Apply(tier)
	if got.MaxOverageCents == nil || *got.MaxOverageCents != 250 {
		t.Errorf("max_overage_cents = %v, want the override's 250", got.MaxOverageCents)
	}
	if got.BurstRate != nil || got.Burst != nil {
		t.Errorf("burst = %v/%v, want unlimited (null override)", got.BurstRate, got.Burst)
	}
	if got.DailyQuota == nil || *got.DailyQuota != 5000 {
		t.Errorf("daily_quota = %v, want 5000", got.DailyQuota)
	}
	if got.MonthlyQuota == nil || *got.MonthlyQuota != 9000 {
		t.Errorf("monthly_quota = %v, want the tier's 9000 (absent override)", got.MonthlyQuota)
	}
	out, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"burst_rate":null,"burst":null,"daily_quota":5000,"max_overage_cents":250}`; string(out) != want {
		t.Errorf("Marshal = %s, want %s", out, want)
	}
}
