package limits

import (
	"fmt"
	"strings"
)

//go:generate go run ./gen -o positions.lua

// Positions names the arguments (ARGV), keys (KEYS) and answer items of
// one Redis function of the admission library, 1-based as Lua indexes
// them: the one description Go and Lua share. Go builds its calls and
// reads answers by these names; the library's Lua reads them from the
// table PositionsLua renders, and a test holds the rendering to the
// committed lua snippet.
type Positions struct {
	Name          string
	Keys, Args    []string
	Results       []string
	ResultsRepeat []string // items repeated after Results (per policy)
}

// Index returns the 1-based position of name in names, 0 when absent.
func Index(names []string, name string) int {
	for i, n := range names {
		if n == name {
			return i + 1
		}
	}
	return 0
}

// The answer of an admission: the head, then burst, bucket, daily and
// monthly (four items each: active, limit, remaining, reset), then with a
// meter quota or money its daily and monthly and its overage; the
// idempotency record keeps the first resultLen (Decision.Flat).
var decisionResults = []string{
	"allowed", "mask", "retry", "overage", "now", "idem",
	"burst_active", "burst_limit", "burst_remaining", "burst_reset",
	"bucket_active", "bucket_limit", "bucket_remaining", "bucket_reset",
	"daily_active", "daily_limit", "daily_remaining", "daily_reset",
	"monthly_active", "monthly_limit", "monthly_remaining", "monthly_reset",
	"meter_daily_active", "meter_daily_limit", "meter_daily_remaining", "meter_daily_reset",
	"meter_monthly_active", "meter_monthly_limit", "meter_monthly_remaining", "meter_monthly_reset",
	"meter_overage",
}

const (
	resultHead     = 6
	resultLen      = resultHead + 4*ItemMeterDaily // 22
	resultMeterLen = resultHead + 4*nItems + 1     // 31
)

// Functions are the positions of the admission library's functions.
var Functions = []Positions{
	{
		// decide a request: Request's inputs beside the list's wire form
		Name: "admit",
		Keys: []string{"state", "meters", "idem"},
		Args: []string{"now", "mode", "list", "cost", "meter", "request_id", "fingerprint", "lease",
			"calendar", "prepaid", "outside", "policies"},
		Results:       decisionResults,
		ResultsRepeat: []string{"policy_outcome", "policy_limit", "policy_remaining", "policy_reset", "policy_retry", "policy_delay", "policy_how"},
	},
	{
		// give back (refund, settle down) or charge (settle up) an
		// admission's units: Admission's fields beside the list it was
		// admitted under
		Name: "adjust",
		Keys: []string{"state", "meters", "entry"},
		Args: []string{"list", "units", "cost", "overage", "meter_overage", "day", "month", "hour", "meter"},
		// status (1 applied, 0 no entry, -1 settled before), units
		// moved, the tier's overage moved
		Results: []string{"status", "delta", "overage_delta"},
	},
	{
		Name:    "grant",
		Keys:    []string{"state"},
		Args:    []string{"now", "period", "units", "id", "period_id", "calendar"},
		Results: []string{"period_id", "used", "grant", "overage", "reset", "now", "applied"},
	},
	{
		Name:    "reset",
		Keys:    []string{"state", "meters"},
		Args:    []string{"now", "stamp", "day", "month"},
		Results: []string{"applied", "day_used", "month_used", "month_overage"},
	},
}

// PositionsLua renders Functions as a Lua table: POS.<function>.args.<name>
// is the index of ARGV of that name, .keys of KEYS, .results of the
// answer (.each the items repeated per policy, from 1).
func PositionsLua() string {
	var b strings.Builder
	b.WriteString("-- positions.lua: the KEYS, ARGV and answer positions of the admission\n" +
		"-- library's functions, generated from internal/limits (positions.go) by\n" +
		"-- go generate; do not edit. One local, so that it costs the library's\n" +
		"-- chunk one of Lua's 200.\n")
	b.WriteString("local POS = {\n")
	for _, f := range Functions {
		fmt.Fprintf(&b, "  %s = {\n", f.Name)
		for _, part := range []struct {
			name  string
			names []string
		}{{"keys", f.Keys}, {"args", f.Args}, {"results", f.Results}, {"each", f.ResultsRepeat}} {
			if len(part.names) == 0 {
				continue
			}
			fmt.Fprintf(&b, "    %s = {", part.name)
			for i, n := range part.names {
				if i > 0 {
					b.WriteString(",")
				}
				fmt.Fprintf(&b, " %s = %d", n, i+1)
			}
			b.WriteString(" },\n")
		}
		b.WriteString("  },\n")
	}
	b.WriteString("}\n")
	return b.String()
}
