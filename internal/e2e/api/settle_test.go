package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestSettledCost (issue 15, point 6): a route with settle: true (cost 10)
// is settled to the cost its upstream reports in Tollgate-Actual-Cost, or
// by POST /v1/settle, exactly once; a bad header leaves the route cost; a
// charge past the quota makes the next request 429; the ledger bills the
// settled units.
func TestSettledCost(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Tollgate-Request-Id") == "" {
			w.WriteHeader(http.StatusBadRequest) // the upstream learns the id to settle by
			return
		}
		if c := r.URL.Query().Get("cost"); c != "" {
			w.Header().Set("Tollgate-Actual-Cost", c)
		}
		fmt.Fprint(w, `{"ok": true}`)
	}))
	t.Cleanup(up.Close)
	s := mustStack(t)
	s.routes = filepath.Join(t.TempDir(), "routes.json")
	table := fmt.Sprintf(`{"routes": [
		{"method": "*", "path": "/api/gen/", "meter": "gen", "cost": 10, "upstream": %q, "settle": true}
	]}`, up.URL+"/v1/")
	if err := os.WriteFile(s.routes, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	tier := s.tier(17, quota.Limits{DailyQuota: quota.Ptr(int64(100))})
	tenant, key := s.tenant(tier.Slug)
	base := s.start()
	runner := quotaredis.New(testenv.Redis(t), s.prefix)
	pending := func() int64 {
		rows, err := runner.Pending(context.Background(), tenant.ID)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, r := range rows {
			n += r.Units
		}
		return n
	}
	settle := func(token, body string) reply { return do(t, "POST", base+"/v1/settle", token, body) }
	settleBody := func(id string, cost int64) string {
		return fmt.Sprintf(`{"request_id": %q, "actual_cost": %d, "tenant_id": %q}`, id, cost, tenant.ID)
	}

	// the upstream reports 3: settled by the header; the API then is 409
	r := do(t, "GET", base+"/api/gen/a?cost=3", key, "", "X-Request-ID", "client-chosen")
	id := r.header.Get("Tollgate-Request-Id")
	if r.status != 200 || id == "" || id == "client-chosen" || r.header.Get("Tollgate-Settled-Cost") != "3" || r.header.Get("Tollgate-Actual-Cost") != "" {
		t.Fatalf("settled by the header: %d %v", r.status, r.header)
	}
	if n := pending(); n != 3 {
		t.Fatalf("pending units %d, want 3", n)
	}
	if r := settle(serviceToken, settleBody(id, 5)); r.status != 409 {
		t.Fatalf("settling again: %d %s, want 409", r.status, r.body)
	}
	if r := settle(serviceToken, settleBody("client-chosen", 5)); r.status != 404 {
		t.Fatalf("settling the client's X-Request-ID: %d %s, want 404", r.status, r.body)
	}
	if n := pending(); n != 3 {
		t.Fatalf("pending units %d after a repeat, want 3", n)
	}

	// no header: the API settles it to 0 once (a refund of 10)
	r = do(t, "GET", base+"/api/gen/b", key, "")
	id = r.header.Get("Tollgate-Request-Id")
	if r.status != 200 || r.header.Get("Tollgate-Settled-Cost") != "" {
		t.Fatalf("without the header: %d %v", r.status, r.header)
	}
	if r := settle(serviceToken, settleBody(id, 0)); r.status != 200 || r.json(t)["delta"] != -10.0 || r.json(t)["settled"] != true {
		t.Fatalf("settling to 0: %d %s", r.status, r.body)
	}
	if r := settle(serviceToken, settleBody(id, 7)); r.status != 409 {
		t.Fatalf("settling twice: %d %s, want 409", r.status, r.body)
	}
	if n := pending(); n != 3 {
		t.Fatalf("pending units %d after a refund, want 3", n)
	}

	// a bad header is ignored: the route cost stands; then the API charges
	// past the quota (200 of 100) and the next request is refused
	for _, bad := range []string{"abc", "-1", "1099511627777", "2.5"} {
		r = do(t, "GET", base+"/api/gen/c?cost="+bad, key, "")
		if r.status != 200 || r.header.Get("Tollgate-Settled-Cost") != "" {
			t.Fatalf("bad header %q: %d %v", bad, r.status, r.header)
		}
		id = r.header.Get("Tollgate-Request-Id")
	}
	if n := pending(); n != 43 {
		t.Fatalf("pending units %d after 4 bad headers, want 43", n)
	}
	if r := settle(serviceToken, settleBody(id, 200)); r.status != 200 || r.json(t)["delta"] != 190.0 {
		t.Fatalf("charging: %d %s", r.status, r.body)
	}
	if n := pending(); n != 233 {
		t.Fatalf("pending units %d after the charge, want 233", n)
	}
	if r := do(t, "GET", base+"/api/gen/d?cost=1", key, ""); r.status != 429 {
		t.Fatalf("after a charge past the quota: %d, want 429", r.status)
	}

	// the ledger bills what was settled
	ctx := context.Background()
	rec := billing.NewReconciler(s.pool, runner, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var units int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(sum(units), 0) FROM usage WHERE tenant_id = $1 AND meter = 'gen'`, tenant.ID).Scan(&units); err != nil || units != 233 {
		t.Fatalf("ledger: %d units (%v), want 233", units, err)
	}

	// bad input names the field; a wrong token is 401; an unknown id 404
	for body, field := range map[string]string{
		`{}`:                 "request_id",
		`{"actual_cost": 1}`: "request_id",
		`{"request_id": "a b", "actual_cost": 1}`:           "request_id",
		`{"request_id": "x"}`:                               "actual_cost",
		`{"request_id": "x", "actual_cost": -1}`:            "actual_cost",
		`{"request_id": "x", "actual_cost": 1099511627777}`: "actual_cost",
		`{"request_id": "x", "actual_cost": "3"}`:           "actual_cost",
		`{"request_id": "x", "actual_cost": 3}`:             "tenant_id",
	} {
		if r := settle(serviceToken, body); r.status != 400 || !strings.Contains(string(r.body), field) {
			t.Errorf("%s: %d %s, want 400 naming %s", body, r.status, r.body, field)
		}
	}
	for _, tok := range []string{"", serviceToken + "x", key} {
		if r := settle(tok, settleBody(id, 1)); r.status != 401 {
			t.Errorf("token %q: %d, want 401", tok, r.status)
		}
	}
	if r := settle(serviceToken, settleBody("no-such-request", 1)); r.status != 404 {
		t.Errorf("unknown request id: %d %s, want 404", r.status, r.body)
	}
}
