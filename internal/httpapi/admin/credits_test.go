package admin_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/httpapi"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

const creditsToken = "credits-admin-token"

var creditsNov = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

// creditsClock is the clock the test moves by hand.
type creditsClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *creditsClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *creditsClock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

// creditsRig is the HTTP layer as internal/app builds it, on a database of the
// test's own, with a tenant on Pro since November 1.
type creditsRig struct {
	db     *pgxpool.Pool
	srv    *httpapi.Server
	clock  *creditsClock
	tenant string
}

func mustCreditsRig(tb testing.TB) *creditsRig {
	tb.Helper()
	ctx := context.Background()
	db := testenv.Postgres(tb)
	store := catalogdb.NewStore(db)
	tenant, err := store.CreateTenant(ctx, "test", "Acme", "pro")
	if err != nil {
		tb.Fatal(err)
	}
	for _, sql := range []string{`UPDATE tenants SET created_at = $2 WHERE id = $1`, `UPDATE tenant_tier_history SET valid_from = $2 WHERE tenant_id = $1`} {
		if _, err := db.Exec(ctx, sql, tenant.ID, creditsNov); err != nil {
			tb.Fatal(err)
		}
	}
	rdb := testenv.Redis(tb)
	clock := &creditsClock{t: time.Date(2026, 11, 10, 9, 0, 0, 0, time.UTC)}
	log, prefix := slog.New(slog.NewJSONHandler(io.Discard, nil)), testenv.Prefix(tb, rdb)
	srv, err := httpapi.New(httpapi.Deps{
		Log: log, Sessions: redisdb.NewSessions(rdb, prefix),
		// (a credit grant tells the nodes' catalogs: the tenant has room)
		Catalog: catalog.New(store, rdb, prefix, log, clock.Now),
		Store:   store, Ledger: billing.NewLedger(db), Now: clock.Now,
	}, httpapi.Options{BodyLimit: 64 << 10, AdminToken: creditsToken})
	if err != nil {
		tb.Fatal(err)
	}
	return &creditsRig{db: db, srv: srv, clock: clock, tenant: tenant.ID}
}

type creditsReply struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// do sends a request with the admin token (unless token is ""), a JSON body
// when body is not "", and the headers given as name, value pairs.
func (r *creditsRig) do(tb testing.TB, method, path, token, body string, headers ...string) creditsReply {
	tb.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := r.srv.App().Test(req, 10_000)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := creditsReply{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if err := json.Unmarshal(raw, &out.body); err != nil {
		tb.Fatalf("%s %s: %d %q is not a JSON object: %v", method, path, resp.StatusCode, raw, err)
	}
	return out
}

func (r *creditsRig) url(tenant string) string { return "/admin/v1/tenants/" + tenant + "/credits" }

// list returns the ledger page of the tenant, failing unless it is a 200.
func (r *creditsRig) list(tb testing.TB, query string) ([]map[string]any, any, float64) {
	tb.Helper()
	got := r.do(tb, "GET", r.url(r.tenant)+query, creditsToken, "")
	if got.status != 200 {
		tb.Fatalf("GET credits%s: %d %s", query, got.status, got.raw)
	}
	var items []map[string]any
	for _, it := range got.body["items"].([]any) {
		items = append(items, it.(map[string]any))
	}
	return items, got.body["next_cursor"], got.body["balance_cents"].(float64)
}

// TestCreditsAPI creates credits, lists them with the balance as time
// passes, replays an Idempotency-Key, reads the audit log, and lists the
// draw November's final invoice makes.
func TestCreditsAPI(t *testing.T) {
	t.Parallel()
	r := mustCreditsRig(t)

	welcome := r.do(t, "POST", r.url(r.tenant), creditsToken, `{"amount_cents": 2500, "reason": "Welcome credit"}`)
	if welcome.status != 201 {
		t.Fatalf("create: %d %s, want 201", welcome.status, welcome.raw)
	}
	want := map[string]any{"id": welcome.body["id"], "tenant_id": r.tenant, "kind": "grant", "amount_cents": 2500.0,
		"reason": "Welcome credit", "expires_at": nil, "created_at": "2026-11-10T09:00:00Z", "credit_id": nil,
		"invoice_id": nil, "remaining_cents": 2500.0}
	if !jsonEqual(welcome.body, want) {
		t.Errorf("create:\n got %v\nwant %v", welcome.body, want)
	}

	r.clock.Set(r.clock.Now().Add(time.Minute))
	body := `{"amount_cents": 1000, "reason": "Black Friday", "expires_at": "2026-11-20T00:00:00Z"}`
	promo := r.do(t, "POST", r.url(r.tenant), creditsToken, body, "Idempotency-Key", "ticket-7")
	if promo.status != 201 || promo.body["expires_at"] != "2026-11-20T00:00:00Z" {
		t.Fatalf("create with an expiry: %d %s, want 201 expiring 2026-11-20T00:00:00Z", promo.status, promo.raw)
	}
	again := r.do(t, "POST", r.url(r.tenant), creditsToken, body, "Idempotency-Key", "ticket-7")
	if again.status != 200 || again.header.Get("Idempotent-Replayed") != "true" || again.body["id"] != promo.body["id"] {
		t.Errorf("replay: %d %s (replayed %q), want 200 with credit %v", again.status, again.raw, again.header.Get("Idempotent-Replayed"), promo.body["id"])
	}
	if other := r.do(t, "POST", r.url(r.tenant), creditsToken, `{"amount_cents": 1001, "reason": "Black Friday", "expires_at": "2026-11-20T00:00:00Z"}`,
		"Idempotency-Key", "ticket-7"); other.status != 422 || other.body["field"] != "Idempotency-Key" {
		t.Errorf("the key with another amount: %d %s, want 422 naming Idempotency-Key", other.status, other.raw)
	}

	items, next, balance := r.list(t, "")
	if len(items) != 2 || items[0]["id"] != promo.body["id"] || items[1]["id"] != welcome.body["id"] || next != nil || balance != 3500 {
		t.Fatalf("list: %v, next %v, balance %v; want the two credits newest first, no next page, 3500", items, next, balance)
	}
	first, next, _ := r.list(t, "?limit=1")
	if len(first) != 1 || first[0]["id"] != promo.body["id"] || next == nil {
		t.Fatalf("first page of one: %v, next %v", first, next)
	}
	second, next, _ := r.list(t, "?limit=1&cursor="+next.(string))
	if len(second) != 1 || second[0]["id"] != welcome.body["id"] || next != nil {
		t.Fatalf("second page of one: %v, next %v", second, next)
	}

	audit := r.do(t, "GET", "/admin/v1/audit?entity=credit&entity_id="+welcome.body["id"].(string), creditsToken, "")
	entries, _ := audit.body["items"].([]any)
	if audit.status != 200 || len(entries) != 1 {
		t.Fatalf("audit of the credit: %d %s, want one entry", audit.status, audit.raw)
	}
	if e := entries[0].(map[string]any); e["action"] != "create" || e["actor"] != "admin" || e["before"] != nil ||
		e["after"].(map[string]any)["amount_cents"] != 2500.0 || e["after"].(map[string]any)["reason"] != "Welcome credit" {
		t.Errorf("audit entry: %v, want create by admin with the credit after", e)
	}
	if n := len(r.do(t, "GET", "/admin/v1/audit?entity=credit", creditsToken, "").body["items"].([]any)); n != 2 {
		t.Errorf("credit audit entries: %d, want 2 (a replay records nothing)", n)
	}

	// Black Friday expires: out of the balance, still in the ledger.
	r.clock.Set(time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC))
	if items, _, balance := r.list(t, ""); len(items) != 2 || balance != 2500 {
		t.Errorf("after an expiry: %d items, balance %v; want 2 and 2500", len(items), balance)
	}

	// November's final invoice draws the welcome credit; the expired one stays.
	r.clock.Set(creditsNov.AddDate(0, 1, 0).Add(2 * time.Hour))
	if err := billing.NewInvoicer(r.db, r.clock.Now, time.Hour).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	var invoiceID string
	var total int64
	if err := r.db.QueryRow(context.Background(), `SELECT id::text, total_cents FROM invoices WHERE tenant_id = $1 AND period = $2 AND status = 'final'`,
		r.tenant, creditsNov).Scan(&invoiceID, &total); err != nil {
		t.Fatal(err)
	}
	if total != 4900-2500 {
		t.Errorf("November's total: %d, want %d", total, 4900-2500)
	}
	items, _, balance = r.list(t, "")
	if len(items) != 3 || balance != 0 {
		t.Fatalf("after November: %v, balance %v; want a draw and the two credits, 0", items, balance)
	}
	wantDraw := map[string]any{"id": items[0]["id"], "tenant_id": r.tenant, "kind": "draw", "amount_cents": -2500.0,
		"reason": "Welcome credit", "expires_at": nil, "created_at": "2026-12-01T02:00:00Z", "credit_id": welcome.body["id"],
		"invoice_id": invoiceID, "remaining_cents": nil}
	if !jsonEqual(items[0], wantDraw) {
		t.Errorf("the draw:\n got %v\nwant %v", items[0], wantDraw)
	}
	if items[2]["remaining_cents"] != 0.0 || items[1]["remaining_cents"] != 1000.0 {
		t.Errorf("remaining: welcome %v, Black Friday %v; want 0 and 1000", items[2]["remaining_cents"], items[1]["remaining_cents"])
	}
}

func jsonEqual(a, b map[string]any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// TestCreditsAPIRefuses checks bad input (400 naming the field), unknown
// tenants (404) and missing credentials (401): none of them records
// anything.
func TestCreditsAPIRefuses(t *testing.T) {
	t.Parallel()
	r := mustCreditsRig(t)
	long := strings.Repeat("é", 201)
	for _, tc := range []struct{ name, body, field string }{
		{"empty object", `{}`, "amount_cents"},
		{"no amount", `{"reason": "x"}`, "amount_cents"},
		{"zero", `{"amount_cents": 0, "reason": "x"}`, "amount_cents"},
		{"negative", `{"amount_cents": -5, "reason": "x"}`, "amount_cents"},
		{"above 2^40", `{"amount_cents": 1099511627777, "reason": "x"}`, "amount_cents"},
		{"a fraction", `{"amount_cents": 1.5, "reason": "x"}`, "amount_cents"},
		{"a string", `{"amount_cents": "100", "reason": "x"}`, "amount_cents"},
		{"null", `{"amount_cents": null, "reason": "x"}`, "amount_cents"},
		{"no reason", `{"amount_cents": 100}`, "reason"},
		{"empty reason", `{"amount_cents": 100, "reason": ""}`, "reason"},
		{"blank reason", `{"amount_cents": 100, "reason": "   "}`, "reason"},
		{"201 characters", `{"amount_cents": 100, "reason": "` + long + `"}`, "reason"},
		{"a control character", `{"amount_cents": 100, "reason": "a\tb"}`, "reason"},
		{"a NUL", `{"amount_cents": 100, "reason": "a\u0000b"}`, "reason"},
		{"a reason that is no string", `{"amount_cents": 100, "reason": 7}`, "reason"},
		{"not a time", `{"amount_cents": 100, "reason": "x", "expires_at": "next week"}`, "expires_at"},
		{"a date only", `{"amount_cents": 100, "reason": "x", "expires_at": "2027-01-01"}`, "expires_at"},
		{"a number", `{"amount_cents": 100, "reason": "x", "expires_at": 1800000000}`, "expires_at"},
		{"in the past", `{"amount_cents": 100, "reason": "x", "expires_at": "2026-11-01T00:00:00Z"}`, "expires_at"},
		{"now", `{"amount_cents": 100, "reason": "x", "expires_at": "2026-11-10T09:00:00Z"}`, "expires_at"},
		{"an unknown field", `{"amount": 100, "reason": "x"}`, "amount"},
	} {
		got := r.do(t, "POST", r.url(r.tenant), creditsToken, tc.body)
		if got.status != 400 || got.body["field"] != tc.field || got.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s, want a 400 problem naming %s", tc.name, got.status, got.raw, tc.field)
		}
	}
	if got := r.do(t, "POST", r.url(r.tenant), creditsToken, `{"amount_cents": 100, "reason": "x"}`, "Idempotency-Key", "two words"); got.status != 400 || got.body["field"] != "Idempotency-Key" {
		t.Errorf("a bad Idempotency-Key: %d %s, want 400 naming Idempotency-Key", got.status, got.raw)
	}
	if got := r.do(t, "GET", r.url(r.tenant)+"?limit=0", creditsToken, ""); got.status != 400 || got.body["field"] != "limit" {
		t.Errorf("limit=0: %d %s, want 400 naming limit", got.status, got.raw)
	}
	if got := r.do(t, "GET", r.url(r.tenant)+"?cursor=nope", creditsToken, ""); got.status != 400 || got.body["field"] != "cursor" {
		t.Errorf("a bad cursor: %d %s, want 400 naming cursor", got.status, got.raw)
	}
	for _, tenant := range []string{"0b4e8d1a-57c6-4b5f-9a4e-5bb1a3f1c2d7", "acme"} {
		if got := r.do(t, "POST", r.url(tenant), creditsToken, `{"amount_cents": 100, "reason": "x"}`); got.status != 404 {
			t.Errorf("POST for tenant %s: %d %s, want 404", tenant, got.status, got.raw)
		}
		if got := r.do(t, "GET", r.url(tenant), creditsToken, ""); got.status != 404 {
			t.Errorf("GET for tenant %s: %d %s, want 404", tenant, got.status, got.raw)
		}
	}
	for _, token := range []string{"", "wrong"} {
		if got := r.do(t, "POST", r.url(r.tenant), token, `{"amount_cents": 100, "reason": "x"}`); got.status != 401 {
			t.Errorf("POST with token %q: %d, want 401", token, got.status)
		}
	}

	if items, _, balance := r.list(t, ""); len(items) != 0 || balance != 0 {
		t.Errorf("after refusals: %v, balance %v; want nothing", items, balance)
	}
	var audits int
	if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM audit_log WHERE entity = 'credit'`).Scan(&audits); err != nil || audits != 0 {
		t.Errorf("audit entries after refusals: %d (%v), want 0", audits, err)
	}
	// The largest amount and the longest reason are fine.
	ok := r.do(t, "POST", r.url(r.tenant), creditsToken, `{"amount_cents": 1099511627776, "reason": "`+long[2:]+`", "expires_at": null}`)
	if ok.status != 201 || ok.body["amount_cents"] != float64(1<<40) {
		t.Errorf("2^40 cents, 200 characters: %d %s, want 201", ok.status, ok.raw)
	}
}
