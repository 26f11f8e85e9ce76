package pages

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/usage"
)

// The daily usage chart: an SVG drawn on the server, so it needs no script
// and no library. One bar per day of the billing period (the UTC month's
// days, or the local dates of the tenant's calendar) for the admitted units;
// a day with refused requests gets a triangle and the count above its bar,
// so the two series differ in shape and label, not in colour alone. Axes
// carry units: cost units on the y axis, the day of the month (UTC) on the
// x axis. Colours come from the stylesheet's classes (the page's CSP allows
// no inline style).

const (
	chartW, chartH                         = 720, 294
	chartLeft, chartRight                  = 64, 16
	chartTop, chartBottom                  = 54, 48
	chartPlotW, chartPlotH                 = chartW - chartLeft - chartRight, chartH - chartTop - chartBottom
	chartMarkerHalf, chartMarkerH, chartFS = 5, 8, 11
)

// dailyChart draws the days (the /v1/usage daily rows) of the UTC month that
// starts at month.
func dailyChart(month time.Time, days []usage.Day) template.HTML {
	n := time.Date(month.Year(), month.Month()+1, 0, 0, 0, 0, 0, time.UTC).Day()
	dates := make([]string, n)
	for i := range n {
		dates[i] = month.AddDate(0, 0, i).Format(time.DateOnly)
	}
	return periodChart(dates, month.Format("January 2006"), "UTC", days)
}

// periodChart draws the days (the /v1/usage daily rows) of a billing period
// whose local dates are dates (YYYY-MM-DD, in order), named name, in zone.
func periodChart(dates []string, name, zone string, days []usage.Day) template.HTML {
	n := len(dates)
	at := make(map[string]int, n)
	for i, d := range dates {
		at[d] = i + 1
	}
	byDay := make([]usage.Day, n+1)
	var peak, total, refused, refusedDays int64
	for _, d := range days {
		i, ok := at[d.Date]
		if !ok {
			continue
		}
		byDay[i] = d
		peak = max(peak, d.Units)
		total += d.Units
		refused += d.Rejected
		if d.Rejected > 0 {
			refusedDays++
		}
	}
	step, top := chartScale(peak)
	monthName := name

	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-labelledby="usage-chart-title usage-chart-desc" xmlns="http://www.w3.org/2000/svg">`, chartW, chartH)
	fmt.Fprintf(&b, `<title id="usage-chart-title">Units used per day, %s (%s)</title>`, html.EscapeString(monthName), html.EscapeString(zone))
	fmt.Fprintf(&b, `<desc id="usage-chart-desc">%s units in %s so far; busiest day %s units; %s refused requests on %d days.</desc>`,
		formatNum(total), html.EscapeString(monthName), formatNum(peak), formatNum(refused), refusedDays)

	// Legend, in the top margin: a filled square for units, a triangle for refusals.
	b.WriteString(`<g class="legend">`)
	fmt.Fprintf(&b, `<rect class="bar" x="%d" y="10" width="10" height="10"/>`, chartLeft)
	fmt.Fprintf(&b, `<text x="%d" y="19">admitted units</text>`, chartLeft+16)
	fmt.Fprintf(&b, `<path class="refused" d="%s"/>`, triangle(float64(chartLeft+140), 20))
	fmt.Fprintf(&b, `<text x="%d" y="19">refused requests (count above the day)</text>`, chartLeft+150)
	b.WriteString(`</g>`)

	// Y axis: gridlines and labels at each step, and its title.
	y := func(v int64) float64 { return chartTop + chartPlotH - float64(v)/float64(top)*chartPlotH }
	b.WriteString(`<g class="axis y-axis">`)
	for i := int64(0); i <= top/step; i++ {
		v := i * step
		fmt.Fprintf(&b, `<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, chartLeft, chartLeft+chartPlotW, y(v), y(v))
		fmt.Fprintf(&b, `<text class="tick" x="%d" y="%.1f" text-anchor="end">%s</text>`, chartLeft-6, y(v)+4, formatCompact(v))
	}
	fmt.Fprintf(&b, `<text class="axis-title" transform="translate(14 %d) rotate(-90)" text-anchor="middle">units per day</text>`, chartTop+chartPlotH/2)
	b.WriteString(`</g>`)

	// X axis: the baseline, a tick and label on the 1st, every 5th day and
	// the last, and its title.
	slot := float64(chartPlotW) / float64(n)
	cx := func(day int) float64 { return chartLeft + slot*(float64(day)-0.5) }
	b.WriteString(`<g class="axis x-axis">`)
	fmt.Fprintf(&b, `<line class="baseline" x1="%d" x2="%d" y1="%d" y2="%d"/>`, chartLeft, chartLeft+chartPlotW, chartTop+chartPlotH, chartTop+chartPlotH)
	for day := 1; day <= n; day++ {
		if day == 1 || day%5 == 0 && n-day >= 2 || day == n {
			fmt.Fprintf(&b, `<line class="tick-mark" x1="%.1f" x2="%.1f" y1="%d" y2="%d"/>`, cx(day), cx(day), chartTop+chartPlotH, chartTop+chartPlotH+4)
			fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%d" text-anchor="middle">%s</text>`, cx(day), chartTop+chartPlotH+16, dayOfMonth(dates[day-1]))
		}
	}
	fmt.Fprintf(&b, `<text class="axis-title" x="%d" y="%d" text-anchor="middle">day of %s (%s)</text>`, chartLeft+chartPlotW/2, chartH-8, html.EscapeString(monthName), html.EscapeString(zone))
	b.WriteString(`</g>`)

	// The bars, then the refusal markers over them.
	barW := math.Max(slot*0.7, 1)
	b.WriteString(`<g class="bars">`)
	for day := 1; day <= n; day++ {
		d := byDay[day]
		if d.Date == "" || d.Units == 0 {
			continue
		}
		h := float64(chartTop+chartPlotH) - y(d.Units)
		fmt.Fprintf(&b, `<rect class="bar" data-date="%s" data-units="%d" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s</title></rect>`,
			d.Date, d.Units, cx(day)-barW/2, y(d.Units), barW, math.Max(h, 0.5), dayLabel(d))
	}
	b.WriteString(`</g><g class="refusals">`)
	for day := 1; day <= n; day++ {
		d := byDay[day]
		if d.Rejected == 0 {
			continue
		}
		tip := y(d.Units) - 3
		fmt.Fprintf(&b, `<g class="refusal" data-date="%s" data-rejected="%d"><title>%s</title><path class="refused" d="%s"/>`,
			d.Date, d.Rejected, dayLabel(d), triangle(cx(day), tip))
		fmt.Fprintf(&b, `<text class="refused-count" x="%.1f" y="%.1f" text-anchor="middle">%s</text></g>`,
			cx(day), tip-chartMarkerH-3, formatCompact(d.Rejected))
	}
	b.WriteString(`</g></svg>`)
	return template.HTML(b.String()) // built above from numbers and escaped text only
}

// triangle is the path of an upward triangle whose base is centred at x, y.
func triangle(x, y float64) string {
	return fmt.Sprintf("M%.1f %.1fL%.1f %.1fL%.1f %.1fZ", x-chartMarkerHalf, y, x+chartMarkerHalf, y, x, y-chartMarkerH)
}

// dayOfMonth is the day of a YYYY-MM-DD date, without a leading zero.
func dayOfMonth(date string) string {
	if len(date) != len(time.DateOnly) {
		return ""
	}
	return strings.TrimPrefix(date[8:], "0")
}

func dayLabel(d usage.Day) string {
	return html.EscapeString(fmt.Sprintf("%s: %s units, %s requests, %s refused",
		d.Date, formatNum(d.Units), formatNum(d.Requests), formatNum(d.Rejected)))
}

// chartScale returns a round whole step (1, 2, 2.5 or 5 × 10^k) and the axis
// top, a multiple of it at or above peak, with at most four steps.
func chartScale(peak int64) (step, top int64) {
	if peak <= 0 {
		return 5, 20
	}
	peak = min(peak, 1<<60) // no day comes near; keeps top and the axis loop from overflowing
	raw := float64(peak) / 4
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v := m * mag; v >= raw && v == math.Trunc(v) {
			step = max(int64(v), 1)
			break
		}
	}
	top = ((peak-1)/step + 1) * step
	return step, top
}

// formatCompact writes large axis numbers short: 12,500 → "12.5k".
func formatCompact(n int64) string {
	switch {
	case n < 10_000:
		return formatNum(n)
	case n < 1_000_000:
		return trimFloat(float64(n)/1e3) + "k"
	case n < 1_000_000_000:
		return trimFloat(float64(n)/1e6) + "M"
	default:
		return trimFloat(float64(n)/1e9) + "G"
	}
}

func trimFloat(x float64) string {
	s := fmt.Sprintf("%.1f", x)
	return strings.TrimSuffix(s, ".0")
}
