package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/routes"
)

func TestAppendJSONString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{"plain text", `"plain text"`},
		{`say "hi"`, `"say \"hi\""`},
		{`back\slash`, `"back\\slash"`},
		{"\b\f\n\r\t", `"\b\f\n\r\t"`},
		{"\x00\x01\x1f\x7f", `"\u0000\u0001\u001f` + "\x7f" + `"`},
		{"<a href='x'>&</a>", `"\u003ca href='x'\u003e\u0026\u003c/a\u003e"`},
		{"héllo, 世界 🙂", `"héllo, 世界 🙂"`},
		{"bad \xff byte", `"bad \ufffd byte"`},
		{"\xe4\xb8", `"\ufffd\ufffd"`},           // a truncated 3-byte sequence: one per byte
		{"\xed\xa0\x80", `"\ufffd\ufffd\ufffd"`}, // a UTF-16 surrogate is not UTF-8
		{"a\u2028b\u2029c", `"a\u2028b\u2029c"`},
	} {
		if got := string(httpx.AppendJSONString(nil, tc.in)); got != tc.want {
			t.Errorf("httpx.AppendJSONString(%q) = %s, want %s", tc.in, got, tc.want)
		}
		if got := string(httpx.AppendJSONString([]byte("x"), []byte(tc.in))); got != "x"+tc.want {
			t.Errorf("httpx.AppendJSONString(x, []byte(%q)) = %s, want x%s", tc.in, got, tc.want)
		}
		if std, _ := json.Marshal(tc.in); string(std) != tc.want {
			t.Errorf("encoding/json writes %q as %s, the test wants %s", tc.in, std, tc.want)
		}
	}
}

// FuzzAppendJSONString holds httpx.AppendJSONString to encoding/json's output.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "a\"b\\c", "\x00\x1f<>&", "\xff\xfe", "\u2028\u2029", "世\xe4\xb8界", "\xf0\x9f\x99"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := httpx.AppendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("httpx.AppendJSONString(%q) = %s, want %s", s, got, want)
		}
		if got := httpx.AppendJSONString(nil, []byte(s)); !bytes.Equal(got, want) {
			t.Errorf("httpx.AppendJSONString([]byte(%q)) = %s, want %s", s, got, want)
		}
	})
}

func TestAppendSFString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"daily", `"daily"`},
		{`a"b\c`, `"a\"b\\c"`},
		{"tab\there é", `"tab?here ??"`},
	} {
		if got := string(appendSFString(nil, tc.in)); got != tc.want {
			t.Errorf("appendSFString(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// The oracles below are the encodings the typed bodies replaced: maps
// through encoding/json. The new ones must write the same bytes.

func oracleRefusal(d quota.Decision, upgrade *quota.Upgrade, instance string) []byte {
	names := make([]string, len(d.Violated))
	for i, v := range d.Violated {
		names[i] = string(v)
	}
	body := map[string]any{"type": ProblemQuotaExceeded, "title": "Quota exceeded", "status": 429,
		"violated-policies": names, "upgrade": upgrade}
	detail := fmt.Sprintf("the %s limit is exhausted", strings.Join(names, " and "))
	if l, ok := tightest(d); ok {
		body["limit"], body["remaining"] = l.Limit, l.Remaining
		body["reset"] = quota.ResetTime(l.Reset).Format(time.RFC3339)
	}
	if d.RetryAfter >= 0 {
		secs := max(1, quota.CeilSeconds(d.RetryAfter))
		body["retry_after"] = secs
		detail += fmt.Sprintf("; retry in %d s", secs)
	} else {
		body["retry_after"] = nil
		detail += "; this request costs more than the limit allows at all"
	}
	if upgrade != nil {
		detail += fmt.Sprintf(", or upgrade to %s", upgrade.Name)
	}
	body["detail"] = detail
	if instance != "" {
		body["instance"] = instance
	}
	b, _ := json.Marshal(body)
	return b
}

func TestRefusalBodyIsWhatEncodingJSONWrote(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	limits := []quota.LimitState{
		{Name: quota.LimitBurst, Limit: 20, Remaining: 0, Reset: now.Add(1500 * time.Millisecond), Window: 2 * time.Second},
		{Name: quota.LimitDaily, Limit: 1000, Remaining: 0, Reset: now.Add(12 * time.Hour), Window: 24 * time.Hour},
	}
	full := &quota.Upgrade{Tier: "pro", Name: `Pro <"best"> & more`, PriceCents: 4900, DailyQuota: quota.Ptr(int64(10_000)),
		URL: "https://example.test/up?a=1&b=2"}
	for _, tc := range []struct {
		name     string
		d        quota.Decision
		up       *quota.Upgrade
		instance string
	}{
		{"one limit", quota.Decision{Now: now, Violated: []quota.LimitName{quota.LimitDaily}, RetryAfter: 3 * time.Hour, Limits: limits},
			full, "/api/demo/echo"},
		{"two limits, no upgrade", quota.Decision{Now: now, Violated: []quota.LimitName{quota.LimitBurst, quota.LimitDaily},
			RetryAfter: 1500 * time.Millisecond, Limits: limits}, nil, "/api/a\"b"},
		{"never passes", quota.Decision{Now: now, Violated: []quota.LimitName{quota.LimitBucket}, RetryAfter: -1,
			Limits: []quota.LimitState{{Name: quota.LimitBucket, Limit: 5, Remaining: 5, Reset: now, Window: time.Second}}},
			&quota.Upgrade{Tier: "x", Name: "X"}, ""},
		{"no limits", quota.Decision{Now: now, RetryAfter: 10 * time.Millisecond}, nil, "/api/x"},
	} {
		want := oracleRefusal(tc.d, tc.up, tc.instance)
		if got := refusalProblem(tc.d, tc.up, tc.instance).appendJSON(nil); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, want)
		}
	}
}

func TestProblemBodyIsWhatEncodingJSONWrote(t *testing.T) {
	for _, p := range []httpx.Problem{
		{Type: "about:blank", Title: "Not Found", Status: 404, Detail: "no metered route for GET /api/<x>", Instance: "/api/<x>"},
		{Type: "about:blank", Title: "Bad Request", Status: 400, Detail: "bad \"input\"\n", Field: "Idempotency-Key"},
		{Type: "about:blank", Title: "Internal Server Error", Status: 500, Detail: "internal error"},
	} {
		body := map[string]any{"type": p.Type, "title": p.Title, "status": p.Status, "detail": p.Detail}
		if p.Instance != "" {
			body["instance"] = p.Instance
		}
		if p.Field != "" {
			body["field"] = p.Field
		}
		want, _ := json.Marshal(body)
		if got := p.AppendJSON(nil); !bytes.Equal(got, want) {
			t.Errorf("\n got %s\nwant %s", got, want)
		}
	}
}

func TestBuiltinBodiesAreWhatEncodingJSONWrote(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 123456789, time.FixedZone("x", 3600))
	e := echoBody{tenantID: "ten_1", tier: "pro", method: "GET", path: "/api/demo/echo", query: []byte("a=1&b=<%22>"),
		meter: "demo", cost: 3, time: now}
	want, _ := json.Marshal(fiber.Map{
		"tenant_id": e.tenantID, "tier": e.tier, "method": e.method, "path": e.path,
		"query": string(e.query), "meter": e.meter, "cost": e.cost, "time": now.UTC().Format(time.RFC3339Nano),
	})
	if got := e.appendJSON(nil); !bytes.Equal(got, want) {
		t.Errorf("echo:\n got %s\nwant %s", got, want)
	}

	tenantID := "ten_12345"
	rows := make([]fiber.Map, 0, 3)
	for i, name := range []string{"requests", "errors", "latency_p99_ms"} {
		rows = append(rows, fiber.Map{"metric": name, "value": (len(tenantID) + i*7) % 100})
	}
	want, _ = json.Marshal(fiber.Map{
		"report_id": fmt.Sprintf("rpt_%s_%d", now.UTC().Format("2006-01-02"), now.UnixMicro()), "tenant_id": tenantID,
		"generated_at": now.UTC().Format(time.RFC3339), "rows": rows,
	})
	if got := (reportBody{tenantID: tenantID, now: now}).appendJSON(nil); !bytes.Equal(got, want) {
		t.Errorf("report:\n got %s\nwant %s", got, want)
	}
}

// TestHotPathRenderingAllocatesNothing pins the point of the encoders: a
// metered answer's headers and body, and a refusal's, cost no allocation.
func TestHotPathRenderingAllocatesNothing(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	d := quota.Decision{Now: now, Violated: []quota.LimitName{quota.LimitDaily}, RetryAfter: 3 * time.Hour,
		Limits: []quota.LimitState{
			{Name: quota.LimitBurst, Limit: 20, Remaining: 19, Reset: now.Add(time.Second), Window: 2 * time.Second},
			{Name: quota.LimitDaily, Limit: 1000, Remaining: 0, Reset: now.Add(12 * time.Hour), Window: 24 * time.Hour},
		}}
	up := &quota.Upgrade{Tier: "pro", Name: "Pro", PriceCents: 4900}
	route := &routes.Route{Method: "GET", Path: "/api/demo/echo", Meter: "demo", Cost: 1, Handler: routes.HandlerEcho}
	s := &Server{}
	app := fiber.New()
	fctx := &fasthttp.RequestCtx{}
	fctx.Request.SetRequestURI("/api/demo/echo?x=1")
	c := app.AcquireCtx(fctx)
	defer app.ReleaseCtx(c)
	m := NewMetrics()
	for name, f := range map[string]func(){
		"refusal": func() {
			setRateLimitHeaders(c, d)
			_ = writeRefusal(c, refusalProblem(d, up, c.Path()))
		},
		"echo": func() {
			a := d
			a.Allowed = true
			_ = s.builtin(c, route, "ten_1", "pro", a)
			setRateLimitHeaders(c, a)
		},
		"problem": func() {
			_ = httpx.WriteProblem(c, httpx.Problem{Status: http.StatusNotFound, Detail: "no metered route", Instance: c.Path()})
		},
		"request id": func() { httpx.SetRequestID(c) },
		"counter":    func() { m.request("demo", "allowed", "pro").Inc() },
	} {
		f() // the response's buffers grow once
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations, want 0", name, n)
		}
	}
	if got := string(c.Response().Header.Peek(fiber.HeaderXRequestID)); !strings.HasPrefix(got, httpx.ProcessID()+"-") {
		t.Errorf("X-Request-ID = %q, want it to start with the process's %s-", got, httpx.ProcessID())
	}
}

func TestRequestCounterIsTheVecsChild(t *testing.T) {
	m := NewMetrics()
	for range 3 {
		m.request("demo", "allowed", "pro").Inc()
	}
	m.request("demo", "refused", "pro").Inc()
	if got, want := m.request("demo", "allowed", "pro"), m.Requests.WithLabelValues("demo", "allowed", "pro"); got != want {
		t.Fatalf("request returned %v, want the vec's child %v", got, want)
	}
	if n := len(*m.requests.Load()); n != 2 {
		t.Errorf("%d cached counters, want 2", n)
	}
}

// BenchmarkAnswerBodies is why the hot path's bodies are written by hand
// (httpx's JSON append functions) rather than by encoding/json: each
// sub-benchmark renders the same bytes both ways (the tests above hold
// them equal), typed and through the map encoding/json would be given.
// `make bench` runs it; the typed rows must stay the faster and allocate
// nothing, else the hand encoders no longer pay and should go.
func BenchmarkAnswerBodies(b *testing.B) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	d := quota.Decision{Now: now, Violated: []quota.LimitName{quota.LimitDaily}, RetryAfter: 3 * time.Hour,
		Limits: []quota.LimitState{{Name: quota.LimitDaily, Limit: 1000, Remaining: 0, Reset: now.Add(12 * time.Hour), Window: 24 * time.Hour}}}
	up := &quota.Upgrade{Tier: "pro", Name: "Pro", PriceCents: 4900, URL: "https://example.test/up"}
	e := echoBody{tenantID: "ten_1", tier: "pro", method: "GET", path: "/api/demo/echo", query: []byte("a=1"),
		meter: "demo", cost: 3, time: now}
	buf := make([]byte, 0, 1024)
	b.Run("refusal/typed", func(b *testing.B) {
		for b.Loop() {
			buf = refusalProblem(d, up, "/api/demo/echo").appendJSON(buf[:0])
		}
	})
	b.Run("refusal/encoding-json", func(b *testing.B) {
		for b.Loop() {
			buf = oracleRefusal(d, up, "/api/demo/echo")
		}
	})
	b.Run("echo/typed", func(b *testing.B) {
		for b.Loop() {
			buf = e.appendJSON(buf[:0])
		}
	})
	b.Run("echo/encoding-json", func(b *testing.B) {
		for b.Loop() {
			buf, _ = json.Marshal(fiber.Map{"tenant_id": e.tenantID, "tier": e.tier, "method": e.method, "path": e.path,
				"query": string(e.query), "meter": e.meter, "cost": e.cost, "time": e.time.UTC().Format(time.RFC3339Nano)})
		}
	})
}
