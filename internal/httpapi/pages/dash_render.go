package pages

// The dashboard (tenants, under /dashboard) and the console (admins, under
// /console) are pages rendered on the server from web/templates, with the
// same functions that answer the JSON API, so a page and the JSON of the same
// tenant at the same moment show the same numbers. They work without
// JavaScript and load nothing from other origins: the strict
// Content-Security-Policy below allows only this server's stylesheet and
// script.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/web"
)

// pagePrefixes are the areas whose answers, errors included, are HTML.
var pagePrefixes = []string{"/dashboard", "/console"}

// IsPage reports whether p is a path of the pages, whose errors are
// rendered as HTML.
func IsPage(p string) bool {
	for _, pre := range pagePrefixes {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}

// contentSecurityPolicy allows this server's own stylesheet, script and
// images, forms posting back to it, and nothing else: no inline script, no
// inline style, no framing.
const contentSecurityPolicy = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// views holds the parsed page templates: each page is the layout plus the
// page's own file, which defines "content".
type views struct {
	pages map[string]*template.Template
}

var viewFuncs = template.FuncMap{
	"num":     formatNum,
	"money":   formatMoney,
	"when":    formatWhen,
	"limitOr": formatLimit,
	"rateOr":  formatRate,
	"pct":     percent,
	"sub":     func(a, b int64) int64 { return a - b },
	"share":   func(n, pct int64) int64 { return n * pct / 100 },
	"val":     func(vals map[string]string, field string) string { return vals[field] },
	"field":   newFormField,
	// label is a name to show, or fallback (an id) when the name shows
	// nothing: a name stored before names were checked may be blank, and
	// a blank link cannot be clicked.
	"label": func(name, fallback string) string {
		if quota.Visible(name) {
			return name
		}
		return fallback
	},
}

// formField is one labelled input of a form, with its hint and its error.
type formField struct {
	Name, Label, Hint, Value, Error string
	InputMode                       string // numeric, decimal, url or ""
}

// newFormField builds a field for the "field" partial from the form's
// values and errors.
func newFormField(name, label, inputMode, hint string, values map[string]string, errs formErrors) formField {
	return formField{Name: name, Label: label, Hint: hint, InputMode: inputMode, Value: values[name], Error: errs[name]}
}

// loadViews parses the templates: layout.html and partials.html are shared
// by every page; each other file is one page.
func loadViews() (*views, error) {
	base, err := template.New("layout.html").Funcs(viewFuncs).ParseFS(web.FS, "templates/layout.html", "templates/partials.html")
	if err != nil {
		return nil, fmt.Errorf("httpapi: templates: %w", err)
	}
	files, err := fs.Glob(web.FS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("httpapi: templates: %w", err)
	}
	v := &views{pages: map[string]*template.Template{}}
	for _, f := range files {
		name := strings.TrimSuffix(path.Base(f), ".html")
		if name == "layout" || name == "partials" {
			continue
		}
		t, err := template.Must(base.Clone()).ParseFS(web.FS, f)
		if err != nil {
			return nil, fmt.Errorf("httpapi: template %s: %w", f, err)
		}
		v.pages[name] = t
	}
	return v, nil
}

// view is what every page template receives.
type view struct {
	Title   string
	Area    string // "dashboard" or "console"
	Nav     string // the active navigation item
	CSRF    string // the session's CSRF token, for every form
	Who     string // who is signed in; "" on sign-in and error pages
	Flash   string // a one-line confirmation
	Now     time.Time
	Data    any
	Problem *httpx.Problem // error pages
}

// render answers status with the page name, executed into a buffer first so
// that a template error is a clean 500, not half a page.
func (s *Pages) render(c *fiber.Ctx, status int, name string, v view) error {
	t, ok := s.views.pages[name]
	if !ok {
		return fmt.Errorf("httpapi: no page %q", name)
	}
	if v.Now.IsZero() {
		v.Now = s.now().UTC()
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", v); err != nil {
		return fmt.Errorf("httpapi: render %s: %w", name, err)
	}
	pageHeaders(c)
	c.Set(fiber.HeaderContentType, fiber.MIMETextHTMLCharsetUTF8)
	return c.Status(status).Send(buf.Bytes())
}

// pageHeaders are set on every dashboard and console answer: pages show
// one tenant's or the admin's data, so no cache may keep them.
func pageHeaders(c *fiber.Ctx) {
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set(fiber.HeaderContentSecurityPolicy, contentSecurityPolicy)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	c.Set(fiber.HeaderXFrameOptions, "DENY")
	c.Set(fiber.HeaderReferrerPolicy, "same-origin")
}

// unavailable turns a failure of Redis or Postgres under a page into a 503
// page: the page cannot be drawn or the sign-in kept until they answer
// again, which is an outage to wait out, not a bug. The cause is logged here
// (the error handler logs only internal errors); a quota.Error passes as is.
func (s *Pages) unavailable(err error) error {
	if err == nil {
		return nil
	}
	var qe *quota.Error
	if errors.As(err, &qe) {
		return err
	}
	s.log.Error("page unavailable: a dependency failed", "err", err)
	return quota.Errorf(quota.CodeUnavailable, "this page is unavailable for a moment; try again shortly")
}

// ErrorPage renders a problem as an HTML page, for the page areas.
func (s *Pages) ErrorPage(c *fiber.Ctx, p httpx.Problem) error {
	area := "dashboard"
	if strings.HasPrefix(c.Path(), "/console") {
		area = "console"
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	return s.render(c, p.Status, "error", view{Title: p.Title, Area: area, Problem: &p})
}

// asset is one embedded static file, served with a strong ETag.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

func loadAssets() (map[string]asset, error) {
	out := map[string]asset{}
	err := fs.WalkDir(web.FS, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(web.FS, p)
		if err != nil {
			return err
		}
		ct := mime.TypeByExtension(path.Ext(p))
		if ct == "" {
			ct = fiber.MIMEOctetStream
		}
		sum := sha256.Sum256(b)
		out[strings.TrimPrefix(p, "static/")] = asset{body: b, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("httpapi: assets: %w", err)
	}
	return out, nil
}

// ServeAsset answers GET /assets/{file} from the embedded files.
func (s *Pages) ServeAsset(c *fiber.Ctx) error {
	return s.sendAsset(c, c.Params("file"))
}

// Robots keeps crawlers out of the dashboard and console.
func (s *Pages) Robots(c *fiber.Ctx) error {
	return s.sendAsset(c, "robots.txt")
}

func (s *Pages) sendAsset(c *fiber.Ctx, name string) error {
	a, ok := s.assets[name]
	if !ok {
		return quota.Errorf(quota.CodeNotFound, "no such file")
	}
	c.Set(fiber.HeaderETag, a.etag)
	c.Set(fiber.HeaderCacheControl, "public, max-age=3600")
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	if c.Get(fiber.HeaderIfNoneMatch) == a.etag {
		return c.SendStatus(fiber.StatusNotModified)
	}
	c.Set(fiber.HeaderContentType, a.contentType)
	return c.Send(a.body)
}

// ---- formatting, shared by the templates and the chart

// formatNum writes n with thousands separators: 1234567 → "1,234,567".
func formatNum(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// formatMoney writes integer cents as dollars: 123456 → "$1,234.56".
func formatMoney(cents int64) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	return fmt.Sprintf("%s$%s.%02d", sign, formatNum(cents/100), cents%100)
}

// formatWhen writes a time (a time.Time or an RFC 3339 string) in UTC to
// the second: "2026-11-24 00:00:00 UTC".
func formatWhen(v any) string {
	var t time.Time
	switch x := v.(type) {
	case time.Time:
		t = x
	case *time.Time:
		if x == nil {
			return "—"
		}
		t = *x
	case string:
		p, err := time.Parse(time.RFC3339, x)
		if err != nil {
			return x
		}
		t = p
	default:
		return fmt.Sprint(v)
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// formatLimit writes a nullable quantity: nil is "unlimited".
func formatLimit(p *int64) string {
	if p == nil {
		return "unlimited"
	}
	return formatNum(*p)
}

// formatRate writes a nullable rate per second without trailing zeros.
func formatRate(p *float64) string {
	if p == nil {
		return "unlimited"
	}
	return strconv.FormatFloat(*p, 'f', -1, 64)
}

// percent is used/limit in whole percent, 0 to 100 (100 for a zero limit).
func percent(used, limit int64) int64 {
	if limit <= 0 {
		return 100
	}
	p := int64(math.Round(float64(used) * 100 / float64(limit)))
	return min(max(p, 0), 100)
}
