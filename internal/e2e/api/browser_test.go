package api

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/tollgate/tollgate/internal/testenv"
)

// Helpers of the browser tests: real Chromium (headless) against a real api
// (run on port 0) with real Redis and Postgres.

const (
	desktopW, desktopH = 1280, 900
	phoneW, phoneH     = 390, 844
)

// visit navigates to base+path and returns the HTTP status of the page it
// lands on (after redirects).
func visit(tb testing.TB, ctx context.Context, base, path string) int64 {
	tb.Helper()
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(base+path))
	if err != nil {
		tb.Fatalf("navigate %s: %v", path, err)
	}
	return resp.Status
}

// submit clicks the element sel (a form's button) and returns the status of
// the page the form's answer leads to.
func submit(tb testing.TB, ctx context.Context, sel string) int64 {
	tb.Helper()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(sel)))
	if err != nil {
		tb.Fatalf("click %s: %v", sel, err)
	}
	return resp.Status
}

// fill replaces the value of the field with id by typing v.
func fill(tb testing.TB, ctx context.Context, id, v string) {
	tb.Helper()
	empty := chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.getElementById(%q).value = ""`, id))
	if err := chromedp.Do(ctx, empty, chromedp.SendKeys(chromedp.ID(id), v)); err != nil {
		tb.Fatalf("fill #%s: %v", id, err)
	}
}

// signIn signs in to area ("dashboard" or "console") through its form.
func signIn(tb testing.TB, ctx context.Context, base, area, secret string) int64 {
	tb.Helper()
	field := "api_key"
	if area == "console" {
		field = "token"
	}
	if st := visit(tb, ctx, base, "/"+area+"/login"); st != 200 {
		tb.Fatalf("GET /%s/login: status %d, want 200", area, st)
	}
	fill(tb, ctx, field, secret)
	return submit(tb, ctx, "main form button[type=submit]")
}

// location is the path (and query) of the page the browser shows.
func location(tb testing.TB, ctx context.Context) string {
	tb.Helper()
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		tb.Fatal(err)
	}
	u, err := url.Parse(loc)
	if err != nil {
		tb.Fatal(err)
	}
	return u.RequestURI()
}

// text is the trimmed text of the first element matching sel.
func text(tb testing.TB, ctx context.Context, sel string) string {
	tb.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(
		`(() => { const e = document.querySelector(%q); return e ? e.textContent.trim().replace(/\s+/g, " ") : "<none>"; })()`, sel)))
	if err != nil {
		tb.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// evalJS evaluates js in the page into a T.
func evalJS[T any](tb testing.TB, ctx context.Context, js string) T {
	tb.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		tb.Fatalf("evaluate: %v", err)
	}
	return v
}

// cookies returns the browser's cookies for base, by name.
func cookies(tb testing.TB, ctx context.Context, base string) map[string]*network.Cookie {
	tb.Helper()
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{
		base + "/dashboard", base + "/dashboard/login", base + "/console", base + "/console/login"}})
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]*network.Cookie{}
	for _, c := range res.Cookies {
		out[c.Name] = c
	}
	return out
}

// checkPage asserts what every page must hold: the page fits the window
// (no sideways scrolling of the page itself), every visible form control
// has a label, and every form that posts carries a CSRF token.
func checkPage(tb testing.TB, ctx context.Context) {
	tb.Helper()
	type report struct {
		Overflow   int      `json:"overflow"`
		Unlabelled []string `json:"unlabelled"`
		NoToken    []string `json:"no_token"`
	}
	r := evalJS[report](tb, ctx, `(() => {
		const out = {overflow: document.documentElement.scrollWidth - window.innerWidth, unlabelled: [], no_token: []};
		for (const el of document.querySelectorAll("input, select, textarea")) {
			if (el.type === "hidden") continue;
			const named = (el.labels && el.labels.length > 0) || el.getAttribute("aria-label") || el.getAttribute("aria-labelledby");
			if (!named) out.unlabelled.push(el.outerHTML.slice(0, 80));
		}
		for (const f of document.querySelectorAll("form")) {
			if ((f.getAttribute("method") || "get").toLowerCase() !== "post") continue;
			const t = f.querySelector("input[type=hidden][name=_csrf]");
			if (!t || t.value.length < 32) out.no_token.push(f.getAttribute("action"));
		}
		return out;
	})()`)
	if r.Overflow > 0 {
		tb.Errorf("%s: the page is %d px wider than the window", location(tb, ctx), r.Overflow)
	}
	for _, u := range r.Unlabelled {
		tb.Errorf("%s: form control without a label: %s", location(tb, ctx), u)
	}
	for _, a := range r.NoToken {
		tb.Errorf("%s: POST form to %s has no CSRF token", location(tb, ctx), a)
	}
}

// commas writes n as the pages do: 1234567 → "1,234,567".
func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	if n < 0 {
		return "-" + commas(-n)
	}
	var b strings.Builder
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// dollars writes cents as the pages do: 4900 → "$49.00".
func dollars(c int64) string { return fmt.Sprintf("$%s.%02d", commas(c/100), c%100) }

// browser starts the test's own Chromium.
func browser(tb testing.TB, w, h int) context.Context {
	tb.Helper()
	return testenv.Browser(tb, w, h)
}
