package api

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// checkDo posts body to /v1/check with the service token.
func checkDo(t *testing.T, base, body string) map[string]any {
	t.Helper()
	r := do(t, "POST", base+"/v1/check", serviceToken, body)
	if r.status != 200 {
		t.Fatalf("check %s: %d %s", body, r.status, r.body)
	}
	return r.json(t)
}

// dailyLeft is the remaining room of the "daily" limit a check answered.
func dailyLeft(t *testing.T, m map[string]any) float64 {
	t.Helper()
	for _, l := range m["limits"].([]any) {
		if l := l.(map[string]any); l["name"] == "daily" {
			return l["remaining"].(float64)
		}
	}
	t.Fatalf("no daily limit in %v", m)
	return 0
}

var requestIDForm = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestCheckRequestIDSettlesAndRefundsOnce: a counted check answers a
// request id that /v1/settle and /v1/refund accept, each once; a repeat,
// another tenant or an unknown id changes nothing.
func TestCheckRequestIDSettlesAndRefundsOnce(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(18, quota.Limits{DailyQuota: quota.Ptr(int64(10))})
	tenant, key := s.tenant(tier.Slug)
	other, _ := s.tenant(tier.Slug)
	post := func(path, body string) reply { return do(t, "POST", base+path, serviceToken, body) }

	dry := checkDo(t, base, `{"api_key": "`+key+`", "meter": "m", "cost": 4, "dry_run": true}`)
	if dry["request_id"] != nil {
		t.Fatalf("a dry run answered request_id %v, want null", dry["request_id"])
	}
	first := checkDo(t, base, `{"api_key": "`+key+`", "meter": "m", "cost": 4}`)
	second := checkDo(t, base, `{"tenant_id": "`+tenant.ID+`", "meter": "m", "cost": 4}`)
	id1, _ := first["request_id"].(string)
	id2, _ := second["request_id"].(string)
	if !requestIDForm.MatchString(id1) || !requestIDForm.MatchString(id2) || id1 == id2 {
		t.Fatalf("request ids %q and %q: want two different 32-hex-digit ids", id1, id2)
	}
	if first["status"] != 200.0 || first["problem"] != nil {
		t.Fatalf("an admitted check: status %v problem %v, want 200 and null", first["status"], first["problem"])
	}
	if left := dailyLeft(t, second); left != 2 {
		t.Fatalf("after 4 + 4 of 10: %v left, want 2", left)
	}

	// Another tenant's id, an unknown id: 404, nothing changes.
	if r := post("/v1/refund", `{"tenant_id": "`+other.ID+`", "request_id": "`+id1+`"}`); r.status != 404 {
		t.Fatalf("refund under another tenant: %d %s, want 404", r.status, r.body)
	}
	if r := post("/v1/refund", `{"tenant_id": "`+tenant.ID+`", "request_id": "0123456789abcdef0123456789abcdef"}`); r.status != 404 {
		t.Fatalf("refund of an unknown id: %d %s, want 404", r.status, r.body)
	}

	// The first is refunded whole, once.
	r := post("/v1/refund", `{"tenant_id": "`+tenant.ID+`", "request_id": "`+id1+`"}`)
	if r.status != 200 {
		t.Fatalf("refund: %d %s", r.status, r.body)
	}
	if m := r.json(t); m["refunded"] != true || m["delta"] != -4.0 || m["request_id"] != id1 {
		t.Fatalf("refund answered %v, want refunded, delta -4", m)
	}
	for _, again := range []struct{ path, body string }{
		{"/v1/refund", `{"tenant_id": "` + tenant.ID + `", "request_id": "` + id1 + `"}`},
		{"/v1/settle", `{"tenant_id": "` + tenant.ID + `", "request_id": "` + id1 + `", "actual_cost": 1}`},
	} {
		if r := post(again.path, again.body); r.status != 409 || !strings.Contains(string(r.body), "refunded before") {
			t.Fatalf("%s after the refund: %d %s, want 409 refunded before", again.path, r.status, r.body)
		}
	}
	// The second is settled to 1, then cannot be refunded.
	if r := post("/v1/settle", `{"tenant_id": "`+tenant.ID+`", "request_id": "`+id2+`", "actual_cost": 1}`); r.status != 200 {
		t.Fatalf("settle: %d %s", r.status, r.body)
	}
	if r := post("/v1/refund", `{"tenant_id": "`+tenant.ID+`", "request_id": "`+id2+`"}`); r.status != 409 || !strings.Contains(string(r.body), "settled before") {
		t.Fatalf("refund after the settle: %d %s, want 409 settled before", r.status, r.body)
	}
	// 10 - 0 (refunded) - 1 (settled) = 9, less the dry run's own 1.
	after := checkDo(t, base, `{"api_key": "`+key+`", "meter": "m", "cost": 1, "dry_run": true}`)
	if left := dailyLeft(t, after); left != 8 {
		t.Fatalf("after the refund and the settle: %v left after a dry run of 1, want 8", left)
	}

	// Bad input changes nothing and names the field.
	for _, tc := range []struct{ path, body, field string }{
		{"/v1/refund", `{"tenant_id": "` + tenant.ID + `"}`, "request_id"},
		{"/v1/refund", `{"request_id": "` + id2 + `"}`, "tenant_id"},
		{"/v1/refund", `{"tenant_id": "` + tenant.ID + `", "request_id": "a b"}`, "request_id"},
		{"/v1/refund", `{"tenant_id": "` + tenant.ID + `", "request_id": "` + id2 + `", "cost": 1}`, "cost"},
		{"/v1/release", `{"tenant_id": "x", "request_id": "` + id2 + `"}`, "tenant_id"},
		{"/v1/release", `{"tenant_id": "` + tenant.ID + `", "request_id": "` + strings.Repeat("a", 129) + `"}`, "request_id"},
		{"/v1/release", `[1]`, ""},
	} {
		r := post(tc.path, tc.body)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s: %d %q, want 400 problem+json", tc.path, tc.body, r.status, r.header.Get("Content-Type"))
			continue
		}
		if p := r.json(t); tc.field != "" && p["field"] != tc.field {
			t.Errorf("%s %s: field %v, want %q", tc.path, tc.body, p["field"], tc.field)
		}
	}
	for _, path := range []string{"/v1/refund", "/v1/release"} {
		if r := do(t, "POST", base+path, key, `{"tenant_id": "`+tenant.ID+`", "request_id": "`+id2+`"}`); r.status != 401 {
			t.Errorf("%s with a tenant key as service token: %d, want 401", path, r.status)
		}
	}
	final := checkDo(t, base, `{"api_key": "`+key+`", "meter": "m", "cost": 1, "dry_run": true}`)
	if left := dailyLeft(t, final); left != 8 {
		t.Fatalf("bad requests changed the state: %v left, want 8", left)
	}

	// A repeat of an idempotency key answers the first check's id, which
	// refunds once.
	idem := `{"api_key": "` + key + `", "meter": "m", "cost": 3, "idempotency_key": "job-7"}`
	one, two := checkDo(t, base, idem), checkDo(t, base, idem)
	if one["request_id"] == nil || two["request_id"] != one["request_id"] || two["replayed"] != true {
		t.Fatalf("a repeated key answered request_id %v (replayed %v), the first %v: want the first's", two["request_id"], two["replayed"], one["request_id"])
	}
	if r := post("/v1/refund", `{"tenant_id": "`+tenant.ID+`", "request_id": "`+two["request_id"].(string)+`"}`); r.status != 200 {
		t.Fatalf("refund of the repeated key's id: %d %s", r.status, r.body)
	}
	if left := dailyLeft(t, checkDo(t, base, `{"api_key": "`+key+`", "meter": "m", "cost": 1, "dry_run": true}`)); left != 8 {
		t.Fatalf("after the idempotent check and its refund: %v left, want 8", left)
	}
}

// relayed are the headers a check's answer relays, as the metered route
// answers them.
var relayed = []string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Retry-After", "Content-Type"}

// TestRefusedCheckRelaysTheMeteredAnswer: a refused check answers the
// status, headers and problem body a metered route of its meter answers
// for the same state, byte for byte.
func TestRefusedCheckRelaysTheMeteredAnswer(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(119, quota.Limits{DailyQuota: quota.Ptr(int64(2))})
	s.tier(120, quota.Limits{DailyQuota: quota.Ptr(int64(200))})
	_, key := s.tenant(tier.Slug)
	for range 2 {
		if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
			t.Fatalf("echo: %d %s", r.status, r.body)
		}
	}
	// The reset times count whole seconds: the two answers are compared
	// when both came within one second (a few tries at most).
	for try := 0; ; try++ {
		metered := do(t, "GET", base+"/api/demo/echo", key, "")
		checked := checkDo(t, base, `{"api_key": "`+key+`", "meter": "demo", "path": "/api/demo/echo"}`)
		again := do(t, "GET", base+"/api/demo/echo", key, "")
		if metered.status != 429 {
			t.Fatalf("metered: %d %s, want 429", metered.status, metered.body)
		}
		if metered.header.Get("Ratelimit") != again.header.Get("Ratelimit") && try < 5 {
			continue
		}
		if checked["allowed"] != false || checked["status"] != 429.0 || checked["request_id"] != nil {
			t.Fatalf("check: allowed %v status %v request_id %v, want false, 429, null", checked["allowed"], checked["status"], checked["request_id"])
		}
		problem, err := json.Marshal(checked["problem"])
		if err != nil {
			t.Fatal(err)
		}
		var want any
		if err := json.Unmarshal(metered.body, &want); err != nil {
			t.Fatal(err)
		}
		wantJSON, _ := json.Marshal(want)
		if string(problem) != string(wantJSON) {
			t.Fatalf("check's problem\n%s\nmetered route's body\n%s", problem, wantJSON)
		}
		headers, _ := checked["headers"].(map[string]any)
		got := http.Header{}
		for k, v := range headers {
			got.Set(k, v.(string))
		}
		for _, h := range relayed {
			if got.Get(h) != metered.header.Get(h) {
				t.Errorf("header %s: check relays %q, the metered route answered %q", h, got.Get(h), metered.header.Get(h))
			}
		}
		if got.Get("Retry-After") == "" || !strings.Contains(string(problem), `"upgrade":{`) {
			t.Fatalf("the refusal relays no Retry-After or no upgrade hint: %v %s", headers, problem)
		}
		return
	}
}

// TestCheckHoldsConcurrencyUntilReleased: a check with hold takes the
// tenant's concurrency lease until /v1/release or /v1/refund names it; a
// check without hold takes none.
func TestCheckHoldsConcurrencyUntilReleased(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	tier := s.tier(21, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	tenant, key := s.tenant(tier.Slug)
	mustPolicy(t, base, `{"name": "one-job", "algorithm": "concurrency", "limit": 1, "lease_seconds": 60}`)
	hold := `{"api_key": "` + key + `", "meter": "m", "hold": true}`
	var first map[string]any
	deadline := time.Now().Add(2 * time.Second) // a policy applies within 1 s
	for {
		first = checkDo(t, base, hold)
		if strings.Contains(first["headers"].(map[string]any)["Ratelimit-Policy"].(string), "one-job") {
			break
		}
		if first["request_id"] != nil {
			do(t, "POST", base+"/v1/refund", serviceToken, `{"tenant_id": "`+tenant.ID+`", "request_id": "`+first["request_id"].(string)+`"}`)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy does not apply to checks: %v", first)
		}
		time.Sleep(50 * time.Millisecond)
	}
	id, _ := first["request_id"].(string)
	if first["allowed"] != true || id == "" {
		t.Fatalf("first held check: %v", first)
	}
	busy := checkDo(t, base, hold)
	if busy["allowed"] != false || !strings.Contains(busy["headers"].(map[string]any)["Ratelimit"].(string), `"one-job"`) {
		t.Fatalf("second held check while the first holds the lease: %v, want refused by one-job", busy)
	}
	if free := checkDo(t, base, `{"api_key": "`+key+`", "meter": "m"}`); free["allowed"] != true {
		t.Fatalf("a check without hold: %v, want allowed (it takes no lease)", free)
	}
	rel := `{"tenant_id": "` + tenant.ID + `", "request_id": "` + id + `"}`
	r := do(t, "POST", base+"/v1/release", serviceToken, rel)
	if m := r.json(t); r.status != 200 || m["released_leases"] != 1.0 {
		t.Fatalf("release: %d %s, want 200 with 1 lease", r.status, r.body)
	}
	if r := do(t, "POST", base+"/v1/release", serviceToken, rel); r.status != 404 {
		t.Fatalf("second release: %d %s, want 404", r.status, r.body)
	}
	next := checkDo(t, base, hold)
	nextID, _ := next["request_id"].(string)
	if next["allowed"] != true || nextID == "" {
		t.Fatalf("held check after the release: %v, want allowed", next)
	}
	// A refund ends the lease too.
	r = do(t, "POST", base+"/v1/refund", serviceToken, `{"tenant_id": "`+tenant.ID+`", "request_id": "`+nextID+`"}`)
	if m := r.json(t); r.status != 200 || m["released_leases"] != 1.0 {
		t.Fatalf("refund of a held check: %d %s, want 200 with 1 lease released", r.status, r.body)
	}
	if last := checkDo(t, base, hold); last["allowed"] != true {
		t.Fatalf("held check after the refund: %v, want allowed", last)
	}
}

// TestRefusedCheckRelaysTheCreditRefusal: a prepaid tenant's check past
// its credit relays the metered route's 402, its headers and its problem
// (the top-up URL), without Retry-After.
func TestRefusedCheckRelaysTheCreditRefusal(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.start()
	slug := "pp-" + testenv.RandomHex(3)
	if r := admin(t, "POST", base+"/admin/v1/tiers", prepaidTier(slug, 100_000+rand.IntN(800_000))); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	_, key := s.tenant(slug)
	for i := range 10 {
		if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
			t.Fatalf("included unit %d: %d %s", i+1, r.status, r.body)
		}
	}
	metered := do(t, "GET", base+"/api/demo/echo", key, "")
	checked := checkDo(t, base, `{"api_key": "`+key+`", "meter": "demo", "path": "/api/demo/echo"}`)
	if metered.status != 402 || checked["status"] != 402.0 || checked["request_id"] != nil {
		t.Fatalf("metered %d, check status %v request_id %v: want 402, 402, null", metered.status, checked["status"], checked["request_id"])
	}
	var want any
	if err := json.Unmarshal(metered.body, &want); err != nil {
		t.Fatal(err)
	}
	wantJSON, _ := json.Marshal(want)
	gotJSON, _ := json.Marshal(checked["problem"])
	if string(gotJSON) != string(wantJSON) || !strings.Contains(string(gotJSON), topUpURL) {
		t.Fatalf("check's problem\n%s\nmetered route's body\n%s", gotJSON, wantJSON)
	}
	headers, _ := checked["headers"].(map[string]any)
	if headers["Retry-After"] != nil || headers["Content-Type"] != "application/problem+json" {
		t.Fatalf("relayed headers %v: want problem+json and no Retry-After", headers)
	}
}
