package pages

import (
	"encoding/xml"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/usage"
)

// svgNode is a generic XML element, to walk the chart.
type svgNode struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Nodes   []svgNode  `xml:",any"`
	Text    string     `xml:",chardata"`
}

func (n svgNode) attr(name string) string {
	for _, a := range n.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func (n svgNode) walk(f func(svgNode)) {
	f(n)
	for _, c := range n.Nodes {
		c.walk(f)
	}
}

func mustChart(tb testing.TB, month time.Time, days []usage.Day) svgNode {
	tb.Helper()
	var root svgNode
	if err := xml.Unmarshal([]byte(dailyChart(month, days)), &root); err != nil {
		tb.Fatalf("the chart is not well-formed XML: %v", err)
	}
	return root
}

func TestDailyChart(t *testing.T) {
	nov := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	days := []usage.Day{
		{Date: "2026-11-01", Units: 400, Requests: 40, Rejected: 0},
		{Date: "2026-11-05", Units: 1000, Requests: 90, Rejected: 12},
		{Date: "2026-11-06", Units: 0, Requests: 0, Rejected: 3}, // only refusals
		{Date: "2026-10-31", Units: 999999, Requests: 1},         // another month: ignored
	}
	root := mustChart(t, nov, days)
	if root.XMLName.Local != "svg" || root.attr("role") != "img" || root.attr("aria-labelledby") == "" {
		t.Fatalf("root %s role %q: want an accessible svg", root.XMLName.Local, root.attr("role"))
	}
	bars := map[string]svgNode{}
	marks := map[string]svgNode{}
	var texts []string
	var desc string
	root.walk(func(n svgNode) {
		switch {
		case n.XMLName.Local == "rect" && n.attr("data-date") != "":
			bars[n.attr("data-date")] = n
		case n.XMLName.Local == "g" && n.attr("class") == "refusal":
			marks[n.attr("data-date")] = n
		case n.XMLName.Local == "text":
			texts = append(texts, strings.TrimSpace(n.Text))
		case n.XMLName.Local == "desc":
			desc = n.Text
		}
	})
	if len(bars) != 2 || bars["2026-11-01"].attr("data-units") != "400" || bars["2026-11-05"].attr("data-units") != "1000" {
		t.Fatalf("bars %v, want the two November days with units", bars)
	}
	// Bar heights are proportional to units on one scale.
	h := func(d string) float64 {
		v, _ := strconv.ParseFloat(bars[d].attr("height"), 64)
		return v
	}
	if r := h("2026-11-01") / h("2026-11-05"); r < 0.39 || r > 0.41 {
		t.Errorf("height ratio 400:1000 = %.3f, want 0.4", r)
	}
	// The later day's bar is to the right.
	x1, _ := strconv.ParseFloat(bars["2026-11-01"].attr("x"), 64)
	x5, _ := strconv.ParseFloat(bars["2026-11-05"].attr("x"), 64)
	if x5 <= x1 {
		t.Errorf("day 5 at x=%.1f is not right of day 1 at x=%.1f", x5, x1)
	}
	// Refusals: a marker with its count, also on a day with no admitted units.
	if len(marks) != 2 || marks["2026-11-05"].attr("data-rejected") != "12" || marks["2026-11-06"].attr("data-rejected") != "3" {
		t.Errorf("refusal marks %v, want days 5 (12) and 6 (3)", marks)
	}
	for _, want := range []string{"units per day", "day of November 2026 (UTC)", "admitted units", "refused requests (count above the day)", "12", "1", "30"} {
		if !contains(texts, want) {
			t.Errorf("the chart has no text %q (texts %q)", want, texts)
		}
	}
	if !strings.Contains(desc, "1,400 units") || !strings.Contains(desc, "15 refused requests on 2 days") {
		t.Errorf("desc %q, want the month's summary", desc)
	}
}

func TestDailyChartEmptyAndShortMonths(t *testing.T) {
	feb := time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC)
	root := mustChart(t, feb, nil)
	var rects, last int
	root.walk(func(n svgNode) {
		if n.XMLName.Local == "rect" && n.attr("data-date") != "" {
			rects++
		}
		if n.XMLName.Local == "text" && n.attr("class") == "tick" {
			if v, err := strconv.Atoi(strings.TrimSpace(n.Text)); err == nil && strings.Contains(n.attr("text-anchor"), "middle") {
				last = max(last, v)
			}
		}
	})
	if rects != 0 {
		t.Errorf("an empty month draws %d bars", rects)
	}
	if last != 28 {
		t.Errorf("February 2027's last day label is %d, want 28", last)
	}
}

func TestChartScale(t *testing.T) {
	for _, tc := range []struct{ peak, step, top int64 }{
		{0, 5, 20}, {1, 1, 1}, {5, 2, 6}, {40, 10, 40}, {41, 20, 60}, {999, 250, 1000}, {1_000_000, 250_000, 1_000_000}, {7, 2, 8},
	} {
		step, top := chartScale(tc.peak)
		if step != tc.step || top != tc.top {
			t.Errorf("chartScale(%d) = %d, %d; want %d, %d", tc.peak, step, top, tc.step, tc.top)
		}
		if top < tc.peak || top/step > 4 {
			t.Errorf("chartScale(%d): top %d below the peak or more than 4 steps of %d", tc.peak, top, step)
		}
	}
}

func TestFormats(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{formatNum(0), "0"}, {formatNum(999), "999"}, {formatNum(1000), "1,000"}, {formatNum(-1234567), "-1,234,567"},
		{formatMoney(0), "$0.00"}, {formatMoney(4900), "$49.00"}, {formatMoney(123456789), "$1,234,567.89"}, {formatMoney(-5), "-$0.05"},
		{formatCompact(9999), "9,999"}, {formatCompact(12_500), "12.5k"}, {formatCompact(3_000_000), "3M"},
		{formatWhen("2026-11-24T00:00:00Z"), "2026-11-24 00:00:00 UTC"}, {formatWhen("not a time"), "not a time"},
		{formatLimit(nil), "unlimited"}, {formatRate(ptrF(0.5)), "0.5"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	if p := percent(50, 0); p != 100 {
		t.Errorf("percent of a zero limit = %d, want 100", p)
	}
}

func TestSafeNext(t *testing.T) {
	for next, want := range map[string]string{
		"":                        "/dashboard",
		"/dashboard":              "/dashboard",
		"/dashboard/invoices/abc": "/dashboard/invoices/abc",
		"/dashboard?x=1":          "/dashboard?x=1",
		"/dashboard/login":        "/dashboard",
		"/dashboardX":             "/dashboard",
		"//evil.example":          "/dashboard",
		"https://evil.example":    "/dashboard",
		"/dashboard/../console":   "/dashboard",
		"/dashboard/%2e%2e/x":     "/dashboard",
		`/dashboard\..\x`:         "/dashboard",
		"/console/tiers":          "/dashboard",
	} {
		if got := safeNext(tenantArea, next); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func ptrF(f float64) *float64 { return &f }

// TestPeriodChartAcrossMonths: a billing period from the 15th to the 14th
// of the next month has a bar per local date in it, ticks by day of month,
// and names its zone; dates outside it are ignored.
func TestPeriodChartAcrossMonths(t *testing.T) {
	start := time.Date(2026, 10, 15, 0, 0, 0, 0, time.UTC)
	var dates []string
	for d := start; d.Before(time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC)); d = d.AddDate(0, 0, 1) {
		dates = append(dates, d.Format(time.DateOnly))
	}
	days := []usage.Day{
		{Date: "2026-10-15", Units: 10, Requests: 1},
		{Date: "2026-11-14", Units: 20, Requests: 2, Rejected: 1},
		{Date: "2026-11-15", Units: 999, Requests: 9}, // the next period's
	}
	var root svgNode
	if err := xml.Unmarshal([]byte(periodChart(dates, "Oct 15 – Nov 15, 2026", "America/New_York", days)), &root); err != nil {
		t.Fatalf("not well-formed: %v", err)
	}
	bars := map[string]svgNode{}
	var texts []string
	root.walk(func(n svgNode) {
		if n.XMLName.Local == "rect" && n.attr("data-date") != "" {
			bars[n.attr("data-date")] = n
		}
		if n.XMLName.Local == "text" || n.XMLName.Local == "title" {
			texts = append(texts, strings.TrimSpace(n.Text))
		}
	})
	if len(bars) != 2 || bars["2026-10-15"].attr("data-units") != "10" || bars["2026-11-14"].attr("data-units") != "20" {
		t.Fatalf("bars %v, want the period's two days", bars)
	}
	x := func(d string) float64 { v, _ := strconv.ParseFloat(bars[d].attr("x"), 64); return v }
	if !(x("2026-10-15") < x("2026-11-14")) {
		t.Fatalf("the first day is not left of the last")
	}
	all := strings.Join(texts, "|")
	for _, want := range []string{"|15|", "|14|", "(America/New_York)"} {
		if !strings.Contains("|"+all+"|", want) {
			t.Errorf("chart texts %q lack %q", all, want)
		}
	}
}
