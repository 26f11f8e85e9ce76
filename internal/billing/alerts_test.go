package billing_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// t0 is the tests' "now": alerts are created an hour before and due since a
// minute before.
var t0 = time.Date(2026, 3, 15, 12, 0, 0, 0, time.UTC)

// fakeClock is an injected clock that only moves when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// received is one POST as the receiver saw it.
type received struct {
	ID, Timestamp, Signature, ContentType string
	Body                                  []byte
}

// receiver is a loopback webhook endpoint that checks every request with
// billing.VerifyWebhook and answers with status(n), n counting that webhook-id's
// requests from 1. Besides /hook it serves redirects: /ftp (307 to ftp://),
// /found (302 to /hook) and /temp (307 to /hook).
type receiver struct {
	URL    string
	clock  *fakeClock
	status func(n int) int
	delay  time.Duration

	mu     sync.Mutex
	secret []byte
	reqs   []received
	counts map[string]int
	bad    []string // why requests failed verification
}

func mustReceiver(tb testing.TB, clock *fakeClock, status func(n int) int) *receiver {
	tb.Helper()
	r := &receiver{clock: clock, status: status, counts: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/hook", r.hook)
	mux.HandleFunc("/ftp", func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, "ftp://127.0.0.1/hook", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/found", func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, "/hook", http.StatusFound)
	})
	mux.HandleFunc("/temp", func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, "/hook", http.StatusTemporaryRedirect)
	})
	srv := httptest.NewServer(mux) // listens on 127.0.0.1 only
	tb.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (r *receiver) setSecret(secret []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.secret = secret
}

func (r *receiver) hook(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	got := received{
		ID: req.Header.Get("webhook-id"), Timestamp: req.Header.Get("webhook-timestamp"),
		Signature: req.Header.Get("webhook-signature"), ContentType: req.Header.Get("Content-Type"), Body: body,
	}
	if r.delay > 0 {
		time.Sleep(r.delay)
	}
	r.mu.Lock()
	err := billing.VerifyWebhook(r.secret, got.ID, got.Timestamp, body, got.Signature, r.clock.Now(), 5*time.Minute)
	if req.Method != http.MethodPost {
		err = fmt.Errorf("method %s", req.Method)
	}
	if err != nil {
		r.bad = append(r.bad, fmt.Sprintf("%s: %v", got.ID, err))
	}
	r.reqs = append(r.reqs, got)
	r.counts[got.ID]++
	n := r.counts[got.ID]
	r.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	code := http.StatusNoContent
	if r.status != nil {
		code = r.status(n)
	}
	w.WriteHeader(code)
	if code >= 300 {
		_, _ = io.WriteString(w, "receiver says no")
	}
}

func (r *receiver) requests() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.reqs...)
}

func (r *receiver) verifyErrors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}

// mustTenant creates a tenant with webhookURL and returns its id and raw
// signing secret.
func mustTenant(tb testing.TB, db *pgxpool.Pool, webhookURL string) (string, []byte) {
	tb.Helper()
	ctx := context.Background()
	tn, err := catalogdb.NewStore(db).CreateTenantWith(ctx, "test",
		quota.Tenant{Name: "acme " + testenv.RandomHex(3), Tier: "free", WebhookURL: webhookURL})
	if err != nil {
		tb.Fatalf("create tenant: %v", err)
	}
	var secret []byte
	if err := db.QueryRow(ctx, `SELECT webhook_secret FROM tenants WHERE id = $1`, tn.ID).Scan(&secret); err != nil {
		tb.Fatalf("read secret: %v", err)
	}
	return tn.ID, secret
}

// alertRow is an alert as the tests insert it.
type alertRow struct {
	TenantID  string
	Period    string // YYYY-MM-DD; default 2026-03-01
	Threshold int    // default 80
	Status    string // default pending
	Attempts  int
	CreatedAt time.Time // default t0 - 1h
	NextAt    time.Time // default t0 - 1m
	Meter     string    // "" for the tier-wide monthly quota
}

func mustAlert(tb testing.TB, db *pgxpool.Pool, a alertRow) string {
	tb.Helper()
	if a.Period == "" {
		a.Period = "2026-03-01"
	}
	if a.Threshold == 0 {
		a.Threshold = 80
	}
	if a.Status == "" {
		a.Status = billing.AlertPending
	}
	if a.CreatedAt.IsZero() {
		a.CreatedAt = t0.Add(-time.Hour)
	}
	if a.NextAt.IsZero() {
		a.NextAt = t0.Add(-time.Minute)
	}
	var delivered *time.Time
	if a.Status == billing.AlertDelivered {
		delivered = &a.CreatedAt
	}
	var id string
	err := db.QueryRow(context.Background(), `
		INSERT INTO alerts (tenant_id, period, threshold, units, quota, status, attempts, next_attempt_at, created_at, delivered_at, meter)
		VALUES ($1, $2::date, $3, $4, 10000, $5, $6, $7, $8, $9, $10) RETURNING id`,
		a.TenantID, a.Period, a.Threshold, int64(a.Threshold)*100, a.Status, a.Attempts, a.NextAt, a.CreatedAt, delivered, a.Meter).Scan(&id)
	if err != nil {
		tb.Fatalf("insert alert: %v", err)
	}
	return id
}

func mustReadAlert(tb testing.TB, db *pgxpool.Pool, id string) billing.Alert {
	tb.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT id, tenant_id, to_char(period, 'YYYY-MM-DD') AS period, threshold, units, quota, meter, kind, status,
		       attempts, next_attempt_at, last_error, created_at, delivered_at
		FROM alerts WHERE id = $1`, id)
	if err != nil {
		tb.Fatalf("read alert: %v", err)
	}
	a, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[billing.Alert])
	if err != nil {
		tb.Fatalf("read alert %s: %v", id, err)
	}
	return a
}

func mustRun(tb testing.TB, d *billing.Deliverer) {
	tb.Helper()
	if err := d.Run(context.Background()); err != nil {
		tb.Fatalf("Run: %v", err)
	}
}

// newTestDeliverer returns a Deliverer for the tests' loopback receivers:
// AllowPrivate, no jitter.
func newTestDeliverer(db *pgxpool.Pool, clock *fakeClock) *billing.Deliverer {
	d := billing.NewDeliverer(db, nil, clock.Now)
	d.AllowPrivate = true
	d.Jitter = nil
	d.Timeout = 5 * time.Second
	return d
}

// TestDelivererOutcomes runs one step over one alert and checks what the
// receiver got and what was recorded.
func TestDelivererOutcomes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		path      string // appended to the receiver's URL; "-" for no URL, "!" for a non-http URL
		status    func(n int) int
		attempts  int // before the run
		wantPosts int // requests reaching /hook
		want      billing.Alert
		wantErr   string // in last_error
		wantNext  time.Duration
	}{
		{name: "delivered", path: "/hook", wantPosts: 1,
			want: billing.Alert{Status: billing.AlertDelivered, Attempts: 1}, wantNext: time.Minute /* the lease */},
		{name: "no webhook url is skipped", path: "-",
			want: billing.Alert{Status: billing.AlertSkipped}, wantNext: 0},
		{name: "receiver error is retried", path: "/hook", status: func(int) int { return 503 }, wantPosts: 1,
			want: billing.Alert{Status: billing.AlertPending, Attempts: 1}, wantErr: "HTTP 503", wantNext: 10 * time.Second},
		{name: "fifth failure waits 160s", path: "/hook", status: func(int) int { return 500 }, attempts: 4, wantPosts: 1,
			want: billing.Alert{Status: billing.AlertPending, Attempts: 5}, wantErr: "HTTP 500", wantNext: 160 * time.Second},
		{name: "last attempt fails", path: "/hook", status: func(int) int { return 500 }, attempts: 9, wantPosts: 1,
			want: billing.Alert{Status: billing.AlertFailed, Attempts: 10}, wantErr: "HTTP 500", wantNext: 0},
		{name: "not an http url", path: "!",
			want: billing.Alert{Status: billing.AlertPending, Attempts: 1}, wantErr: "not an absolute http or https URL", wantNext: 10 * time.Second},
		{name: "redirect to ftp refused", path: "/ftp",
			want: billing.Alert{Status: billing.AlertPending, Attempts: 1}, wantErr: "redirect to a URL that is not http or https refused", wantNext: 10 * time.Second},
		{name: "302 that drops the body refused", path: "/found",
			want: billing.Alert{Status: billing.AlertPending, Attempts: 1}, wantErr: "drops the POST body", wantNext: 10 * time.Second},
		{name: "307 followed", path: "/temp", wantPosts: 1,
			want: billing.Alert{Status: billing.AlertDelivered, Attempts: 1}, wantNext: time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testenv.Postgres(t)
			clock := newClock(t0)
			rcv := mustReceiver(t, clock, tt.status)
			u := rcv.URL + tt.path
			switch tt.path {
			case "-":
				u = ""
			case "!":
				u = "ftp://" + strings.TrimPrefix(rcv.URL, "http://") + "/hook"
			}
			tenantID, secret := mustTenant(t, db, u)
			rcv.setSecret(secret)
			id := mustAlert(t, db, alertRow{TenantID: tenantID, Attempts: tt.attempts})

			d := newTestDeliverer(db, clock)
			mustRun(t, d)

			reqs := rcv.requests()
			if got := len(reqs); got != tt.wantPosts {
				t.Fatalf("got %d POSTs, want %d", got, tt.wantPosts)
			}
			if bad := rcv.verifyErrors(); len(bad) > 0 {
				t.Errorf("receiver rejected requests: %v", bad)
			}
			got := mustReadAlert(t, db, id)
			if got.Status != tt.want.Status || got.Attempts != tt.want.Attempts {
				t.Errorf("got status %s attempts %d, want %s %d", got.Status, got.Attempts, tt.want.Status, tt.want.Attempts)
			}
			if !strings.Contains(got.LastError, tt.wantErr) || (tt.wantErr == "") != (got.LastError == "") {
				t.Errorf("got last_error %q, want it to contain %q", got.LastError, tt.wantErr)
			}
			if want := t0.Add(tt.wantNext); !got.NextAttemptAt.Equal(want) {
				t.Errorf("got next_attempt_at %s, want %s", got.NextAttemptAt.UTC(), want)
			}
			if (got.Status == billing.AlertDelivered) != (got.DeliveredAt != nil) {
				t.Errorf("got delivered_at %v with status %s", got.DeliveredAt, got.Status)
			} else if got.DeliveredAt != nil && !got.DeliveredAt.Equal(t0) {
				t.Errorf("got delivered_at %s, want %s", got.DeliveredAt.UTC(), t0)
			}
			if tt.want.Status == billing.AlertDelivered {
				checkRequest(t, reqs[0], secret, id, tenantID)
			}
			wantCounts := map[string]int64{tt.want.Status: 1}
			if tt.want.Status == billing.AlertPending {
				wantCounts = map[string]int64{"retried": 1}
			}
			for name, c := range map[string]int64{billing.AlertDelivered: d.Delivered.Load(), billing.AlertFailed: d.Failed.Load(),
				billing.AlertSkipped: d.Skipped.Load(), "retried": d.Retried.Load()} {
				if c != wantCounts[name] {
					t.Errorf("got counter %s = %d, want %d", name, c, wantCounts[name])
				}
			}
		})
	}
}

// checkRequest checks the headers and body of a threshold webhook.
func checkRequest(tb testing.TB, r received, secret []byte, alertID, tenantID string) {
	tb.Helper()
	checkRequestOf(tb, r, secret, alertID, tenantID, "")
}

// checkRequestOf checks a webhook of an alert of meter ("" tier-wide).
func checkRequestOf(tb testing.TB, r received, secret []byte, alertID, tenantID, meter string) {
	tb.Helper()
	if r.ID != alertID {
		tb.Errorf("got webhook-id %q, want %q", r.ID, alertID)
	}
	if want := fmt.Sprint(t0.Unix()); r.Timestamp != want {
		tb.Errorf("got webhook-timestamp %q, want %q", r.Timestamp, want)
	}
	if want := sign(secret, r.ID, r.Timestamp, r.Body); r.Signature != want {
		tb.Errorf("got webhook-signature %q, want %q", r.Signature, want)
	}
	if r.ContentType != "application/json" {
		tb.Errorf("got Content-Type %q, want application/json", r.ContentType)
	}
	var got map[string]any
	if err := json.Unmarshal(r.Body, &got); err != nil {
		tb.Fatalf("body %s: %v", r.Body, err)
	}
	want := map[string]any{
		"type":      "quota.threshold_crossed",
		"timestamp": "2026-03-15T11:00:00Z",
		"data": map[string]any{"tenant_id": tenantID, "period": "2026-03", "threshold": 80.0,
			"units": 8000.0, "quota": 10000.0, "limit": "monthly", "meter": ""},
	}
	if meter != "" {
		want["data"].(map[string]any)["limit"], want["data"].(map[string]any)["meter"] = meter+".monthly", meter
	}
	if g, w := fmt.Sprint(got), fmt.Sprint(want); g != w {
		tb.Errorf("got body %s, want %s", g, w)
	}
}

// TestDelivererSendsMeterAlerts: an alert of a meter quota names the meter
// and its limit in the signed payload.
func TestDelivererSendsMeterAlerts(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	rcv := mustReceiver(t, clock, nil)
	tenantID, secret := mustTenant(t, db, rcv.URL+"/hook")
	rcv.setSecret(secret)
	id := mustAlert(t, db, alertRow{TenantID: tenantID, Meter: "search"})
	mustRun(t, newTestDeliverer(db, clock))
	reqs := rcv.requests()
	if len(reqs) != 1 {
		t.Fatalf("got %d POSTs, want 1", len(reqs))
	}
	checkRequestOf(t, reqs[0], secret, id, tenantID, "search")
	if got := mustReadAlert(t, db, id); got.Meter != "search" || got.Status != billing.AlertDelivered {
		t.Fatalf("alert %+v", got)
	}
}

// TestDelivererRetriesUntilReceiverRecovers: a 500 leaves the alert pending
// for 10 s; once the clock has passed that, the same webhook-id is sent again
// and delivered.
func TestDelivererRetriesUntilReceiverRecovers(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	rcv := mustReceiver(t, clock, func(n int) int {
		if n == 1 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	tenantID, secret := mustTenant(t, db, rcv.URL+"/hook")
	rcv.setSecret(secret)
	id := mustAlert(t, db, alertRow{TenantID: tenantID})
	d := newTestDeliverer(db, clock)

	mustRun(t, d)
	a := mustReadAlert(t, db, id)
	if a.Status != billing.AlertPending || a.Attempts != 1 || !strings.HasPrefix(a.LastError, "HTTP 500") {
		t.Fatalf("after a 500: got status %s attempts %d last_error %q, want pending 1 \"HTTP 500...\"", a.Status, a.Attempts, a.LastError)
	}
	if want := t0.Add(10 * time.Second); !a.NextAttemptAt.Equal(want) {
		t.Fatalf("got next_attempt_at %s, want %s", a.NextAttemptAt.UTC(), want)
	}

	clock.Advance(9 * time.Second)
	mustRun(t, d)
	if got := len(rcv.requests()); got != 1 {
		t.Fatalf("before the retry time: got %d POSTs, want 1", got)
	}

	clock.Advance(time.Second)
	mustRun(t, d)
	reqs := rcv.requests()
	if got := len(reqs); got != 2 {
		t.Fatalf("after the retry time: got %d POSTs, want 2", got)
	}
	if reqs[0].ID != id || reqs[1].ID != id {
		t.Errorf("got webhook-ids %q, %q, want %q both times", reqs[0].ID, reqs[1].ID, id)
	}
	if string(reqs[0].Body) != string(reqs[1].Body) {
		t.Errorf("got bodies %s and %s, want the same", reqs[0].Body, reqs[1].Body)
	}
	if want := fmt.Sprint(t0.Add(10 * time.Second).Unix()); reqs[1].Timestamp != want {
		t.Errorf("got retry webhook-timestamp %s, want %s", reqs[1].Timestamp, want)
	}
	if bad := rcv.verifyErrors(); len(bad) > 0 {
		t.Errorf("receiver rejected requests: %v", bad)
	}
	a = mustReadAlert(t, db, id)
	if a.Status != billing.AlertDelivered || a.Attempts != 2 || a.DeliveredAt == nil || !a.DeliveredAt.Equal(t0.Add(10*time.Second)) {
		t.Errorf("got status %s attempts %d delivered_at %v, want delivered 2 %s", a.Status, a.Attempts, a.DeliveredAt, t0.Add(10*time.Second))
	}
	if got, want := d.Delivered.Load(), int64(1); got != want {
		t.Errorf("got Delivered %d, want %d", got, want)
	}
}

// TestDelivererGivesUp follows the backoff schedule to the last attempt.
func TestDelivererGivesUp(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	rcv := mustReceiver(t, clock, func(int) int { return http.StatusBadGateway })
	tenantID, secret := mustTenant(t, db, rcv.URL+"/hook")
	rcv.setSecret(secret)
	id := mustAlert(t, db, alertRow{TenantID: tenantID})
	d := newTestDeliverer(db, clock)
	d.MaxAttempts = 4

	for i, wait := range []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second} {
		mustRun(t, d)
		a := mustReadAlert(t, db, id)
		if want := clock.Now().Add(wait); a.Status != billing.AlertPending || a.Attempts != i+1 || !a.NextAttemptAt.Equal(want) {
			t.Fatalf("after attempt %d: got %s attempts %d next %s, want pending %d %s",
				i+1, a.Status, a.Attempts, a.NextAttemptAt.UTC(), i+1, want)
		}
		clock.Advance(wait)
	}
	mustRun(t, d)
	a := mustReadAlert(t, db, id)
	if a.Status != billing.AlertFailed || a.Attempts != 4 || !strings.Contains(a.LastError, "502") {
		t.Fatalf("after the last attempt: got %s attempts %d last_error %q, want failed 4 HTTP 502", a.Status, a.Attempts, a.LastError)
	}
	clock.Advance(24 * time.Hour)
	mustRun(t, d)
	if got := len(rcv.requests()); got != 4 {
		t.Errorf("got %d POSTs, want 4", got)
	}
	if got, want := d.Failed.Load(), int64(1); got != want {
		t.Errorf("got Failed %d, want %d", got, want)
	}
	if got, want := d.Retried.Load(), int64(3); got != want {
		t.Errorf("got Retried %d, want %d", got, want)
	}
}

// TestDelivererLastErrorHasNoBody: what a receiver answers never reaches
// last_error, which admins read: a body is not stored, nor the bytes of an
// answer that is not HTTP at all (a webhook pointed at another protocol's
// port would otherwise echo what that service said).
func TestDelivererLastErrorHasNoBody(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, "secret-of-the-receiver "+strings.Repeat("é\x00", 2000))
	}))
	t.Cleanup(srv.Close)
	notHTTP := mustTCPServer(t, "-ERR secret-of-the-receiver\r\n")
	for _, tc := range []struct{ url, want string }{
		{srv.URL, "HTTP 400"},
		{"http://" + notHTTP + "/hook", "no valid HTTP answer"},
	} {
		tenantID, _ := mustTenant(t, db, tc.url)
		id := mustAlert(t, db, alertRow{TenantID: tenantID})
		mustRun(t, newTestDeliverer(db, clock))
		a := mustReadAlert(t, db, id)
		if a.Status != billing.AlertPending || a.LastError != tc.want {
			t.Errorf("%s: got %s last_error %q, want pending %q", tc.url, a.Status, a.LastError, tc.want)
		}
	}
}

// mustTCPServer listens on loopback and answers every connection with
// answer, then closes it; it returns its host:port.
func mustTCPServer(tb testing.TB, answer string) string {
	tb.Helper()
	return testenv.ServeConns(tb, func(c net.Conn) { _, _ = io.WriteString(c, answer) })
}

// TestDelivererRefusesPrivateTargets: a webhook URL stored before it was
// checked (or a name that resolves inside) is refused when dialled, unless
// AllowPrivate is set: the receiver on loopback sees nothing.
func TestDelivererRefusesPrivateTargets(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	rcv := mustReceiver(t, clock, nil)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(rcv.URL, "http://"))
	for _, u := range []string{rcv.URL + "/hook", "http://localhost:" + port + "/hook", "http://[::ffff:127.0.0.1]:" + port + "/hook"} {
		tenantID, _ := mustTenant(t, db, u)
		id := mustAlert(t, db, alertRow{TenantID: tenantID})
		d := billing.NewDeliverer(db, nil, clock.Now)
		d.Jitter = nil
		mustRun(t, d)
		a := mustReadAlert(t, db, id)
		if a.Status != billing.AlertPending || a.Attempts != 1 || !strings.Contains(a.LastError, "not a public address") {
			t.Errorf("%s: got %s attempts %d last_error %q, want pending 1 \"...not a public address\"", u, a.Status, a.Attempts, a.LastError)
		}
	}
	if got := len(rcv.requests()); got != 0 {
		t.Fatalf("the loopback receiver got %d requests, want none", got)
	}
}

// TestDelivererChecksRedirectTargets: a redirect is dialled through the same
// check as the first request. Both receivers are on loopback, so the test
// lets the Deliverer dial the first one only, as if it were public.
func TestDelivererChecksRedirectTargets(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	inside := mustReceiver(t, clock, nil)
	outside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, inside.URL+"/hook", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(outside.Close)
	public := netip.MustParseAddrPort(strings.TrimPrefix(outside.URL, "http://"))
	tenantID, secret := mustTenant(t, db, outside.URL+"/hook")
	inside.setSecret(secret)
	id := mustAlert(t, db, alertRow{TenantID: tenantID})
	d := newTestDeliverer(db, clock)
	billing.SetDialAllowed(d, func(ap netip.AddrPort) bool { return ap == public })
	mustRun(t, d)
	if got := len(inside.requests()); got != 0 {
		t.Fatalf("the redirect's target got %d requests, want none", got)
	}
	if a := mustReadAlert(t, db, id); a.Status != billing.AlertPending || a.LastError != billing.ErrWebhookTarget.Error() {
		t.Errorf("got %s last_error %q, want pending %q", a.Status, a.LastError, billing.ErrWebhookTarget)
	}
}

// TestDelivererDialsHTTPSThroughTheCheck: a client's own *http.Transport
// (here one that trusts the test's TLS receiver) keeps its TLS
// configuration, and its https dials go through the address check as the
// http ones do: refused on loopback, delivered once AllowPrivate is set.
func TestDelivererDialsHTTPSThroughTheCheck(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	rcv := &receiver{clock: clock, counts: map[string]int{}}
	srv := httptest.NewTLSServer(http.HandlerFunc(rcv.hook))
	t.Cleanup(srv.Close)
	for _, allowPrivate := range []bool{false, true} {
		tenantID, secret := mustTenant(t, db, srv.URL+"/hook")
		rcv.setSecret(secret)
		id := mustAlert(t, db, alertRow{TenantID: tenantID})
		d := billing.NewDeliverer(db, srv.Client(), clock.Now)
		d.AllowPrivate, d.Jitter, d.Timeout = allowPrivate, nil, 5*time.Second
		mustRun(t, d)
		a := mustReadAlert(t, db, id)
		if allowPrivate && (a.Status != billing.AlertDelivered || a.Attempts != 1) {
			t.Errorf("AllowPrivate: got %s attempts %d last_error %q, want delivered 1", a.Status, a.Attempts, a.LastError)
		}
		if !allowPrivate && (a.Status != billing.AlertPending || !strings.Contains(a.LastError, "not a public address")) {
			t.Errorf("got %s last_error %q, want pending \"...not a public address\"", a.Status, a.LastError)
		}
	}
	if got := len(rcv.requests()); got != 1 {
		t.Errorf("the TLS receiver got %d requests, want 1 (the allowed delivery)", got)
	}
	if bad := rcv.verifyErrors(); len(bad) > 0 {
		t.Errorf("receiver rejected requests: %v", bad)
	}
}

func TestPublicAddr(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr   string
		public bool
	}{
		{"8.8.8.8", true}, {"2606:4700::1111", true}, {"::ffff:8.8.8.8", true}, {"64:ff9b::808:808", true}, {"2002:808:808::1", true},
		{"127.0.0.1", false}, {"127.255.0.9", false}, {"::1", false}, {"169.254.169.254", false}, {"fe80::1", false},
		{"fe80::1%eth0", false}, {"10.0.0.1", false}, {"172.16.0.1", false}, {"172.31.255.255", false}, {"192.168.0.1", false},
		{"fc00::1", false}, {"fd12:3456::1", false}, {"0.0.0.0", false}, {"::", false}, {"224.0.0.1", false},
		{"ff02::1", false}, {"100.64.0.1", false}, {"100.127.255.255", false}, {"255.255.255.255", false},
		{"::ffff:127.0.0.1", false}, {"::ffff:169.254.169.254", false}, {"::ffff:10.0.0.1", false}, {"::127.0.0.1", false},
		{"64:ff9b::7f00:1", false}, {"64:ff9b::a9fe:a9fe", false}, {"2002:7f00:1::1", false}, {"2002:c0a8:101::", false},
	} {
		if got := billing.PublicAddr(netip.MustParseAddr(tc.addr)); got != tc.public {
			t.Errorf("PublicAddr(%s) = %t, want %t", tc.addr, got, tc.public)
		}
	}
	for _, tc := range []struct {
		host string
		ok   bool
	}{
		{"hooks.example.com", true}, {"8.8.8.8", true}, {"2606:4700::1111", true}, {"1.example", true}, {"0xdead.example", true},
		{"localhost", false}, {"LocalHost.", false}, {"a.b.localhost", false}, {"127.1", false}, {"2130706433", false},
		{"0x7f000001", false}, {"0177.0.0.1", false}, {"example.123", false}, {"", false}, {"169.254.169.254", false},
	} {
		if err := billing.CheckWebhookHost(tc.host); (err == nil) != tc.ok {
			t.Errorf("CheckWebhookHost(%q) = %v, want ok %t", tc.host, err, tc.ok)
		}
	}
}

// TestDelivererLease: while a worker holds an alert (its POST hanging), no
// other worker sends it; once the lease has passed another one does, and the
// first worker's late outcome is not recorded over it.
func TestDelivererLease(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	release := make(chan struct{})
	rcv := mustReceiver(t, clock, func(n int) int {
		if n == 1 {
			<-release
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	tenantID, secret := mustTenant(t, db, rcv.URL+"/hook")
	rcv.setSecret(secret)
	id := mustAlert(t, db, alertRow{TenantID: tenantID})
	slow, other := newTestDeliverer(db, clock), newTestDeliverer(db, clock)

	slowDone := make(chan error, 1)
	go func() { slowDone <- slow.Run(context.Background()) }()
	for deadline := time.Now().Add(5 * time.Second); len(rcv.requests()) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slow worker sent nothing")
		}
	}
	mustRun(t, other)
	if got := len(rcv.requests()); got != 1 {
		t.Fatalf("during the lease: got %d POSTs, want 1", got)
	}
	clock.Advance(slow.Lease)
	mustRun(t, other)
	if got := len(rcv.requests()); got != 2 {
		t.Fatalf("after the lease: got %d POSTs, want 2", got)
	}
	unblock()
	if err := <-slowDone; err != nil {
		t.Fatalf("slow Run: %v", err)
	}
	a := mustReadAlert(t, db, id)
	if a.Status != billing.AlertDelivered || a.Attempts != 1 || a.LastError != "" {
		t.Errorf("got status %s attempts %d last_error %q, want delivered 1 \"\"", a.Status, a.Attempts, a.LastError)
	}
	if got := slow.Retried.Load() + slow.Failed.Load() + slow.Delivered.Load(); got != 0 {
		t.Errorf("got %d outcomes counted by the worker that lost its lease, want 0", got)
	}
	if got, want := other.Delivered.Load(), int64(1); got != want {
		t.Errorf("got Delivered %d, want %d", got, want)
	}
}

// TestDeliverersConcurrent: two workers draining the same 50 alerts at once
// send each exactly once.
func TestDeliverersConcurrent(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	rcv := mustReceiver(t, clock, nil)
	rcv.delay = 2 * time.Millisecond
	tenantID, secret := mustTenant(t, db, rcv.URL+"/hook")
	rcv.setSecret(secret)
	ids := map[string]bool{}
	for i := range 50 {
		p := time.Date(2020, time.Month(1+i/2), 1, 0, 0, 0, 0, time.UTC).Format(time.DateOnly)
		ids[mustAlert(t, db, alertRow{TenantID: tenantID, Period: p, Threshold: []int{80, 100}[i%2]})] = true
	}
	workers := []*billing.Deliverer{newTestDeliverer(db, clock), newTestDeliverer(db, clock)}
	var wg sync.WaitGroup
	errs := make([]error, len(workers))
	for i, d := range workers {
		d.Batch, d.Concurrency = 4, 3
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.Run(context.Background())
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Run: %v", err)
	}

	counts := map[string]int{}
	for _, r := range rcv.requests() {
		counts[r.ID]++
	}
	for id := range ids {
		if counts[id] != 1 {
			t.Errorf("alert %s: got %d POSTs, want 1", id, counts[id])
		}
	}
	if got, want := len(counts), len(ids); got != want {
		t.Errorf("got POSTs for %d webhook-ids, want %d", got, want)
	}
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM alerts WHERE status = 'delivered' AND attempts = 1`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 50 {
		t.Errorf("got %d alerts delivered at the first attempt, want 50", n)
	}
	d0, d1 := workers[0].Delivered.Load(), workers[1].Delivered.Load()
	if d0+d1 != 50 {
		t.Errorf("got Delivered %d + %d, want 50 in all", d0, d1)
	}
	t.Logf("split between workers: %d / %d", d0, d1)
	if bad := rcv.verifyErrors(); len(bad) > 0 {
		t.Errorf("receiver rejected requests: %v", bad)
	}
}

// TestDelivererStopsWhenCancelled: a step cut short records no attempt.
func TestDelivererStopsWhenCancelled(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(block) })
	tenantID, _ := mustTenant(t, db, srv.URL)
	id := mustAlert(t, db, alertRow{TenantID: tenantID})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := newTestDeliverer(db, clock).Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	a := mustReadAlert(t, db, id)
	if want := t0.Add(billing.DefaultAlertLease); a.Status != billing.AlertPending || a.Attempts != 0 || !a.NextAttemptAt.Equal(want) {
		t.Errorf("got %s attempts %d next %s, want pending 0 %s (leased)", a.Status, a.Attempts, a.NextAttemptAt.UTC(), want)
	}
}

// TestDelivererBackoff checks retry times: 10 s doubling per failure, at
// most 1 h, jitter included.
func TestDelivererBackoff(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := newClock(t0)
	rcv := mustReceiver(t, clock, func(int) int { return http.StatusTooManyRequests })
	tenantID, secret := mustTenant(t, db, rcv.URL+"/hook")
	rcv.setSecret(secret)
	double := func(d time.Duration) time.Duration { return 2 * d }
	tests := []struct {
		name             string
		attempts         int // before
		jitter           func(time.Duration) time.Duration
		defaultJitter    bool
		wantMin, wantMax time.Duration
	}{
		{name: "first", attempts: 0, wantMin: 10 * time.Second, wantMax: 10 * time.Second},
		{name: "second", attempts: 1, wantMin: 20 * time.Second, wantMax: 20 * time.Second},
		{name: "ninth", attempts: 8, wantMin: 2560 * time.Second, wantMax: 2560 * time.Second},
		{name: "tenth is capped", attempts: 9, wantMin: time.Hour, wantMax: time.Hour},
		{name: "hundredth", attempts: 99, wantMin: time.Hour, wantMax: time.Hour},
		{name: "jitter is capped too", attempts: 8, jitter: double, wantMin: time.Hour, wantMax: time.Hour},
		{name: "default jitter", attempts: 0, defaultJitter: true, wantMin: 8 * time.Second, wantMax: 12 * time.Second},
		{name: "default jitter at the cap", attempts: 20, defaultJitter: true, wantMin: 48 * time.Minute, wantMax: time.Hour},
	}
	for i, tt := range tests {
		// Each alert is the only one due: the earlier ones wait for retry.
		p := time.Date(2020, time.Month(1+i), 1, 0, 0, 0, 0, time.UTC).Format(time.DateOnly)
		id := mustAlert(t, db, alertRow{TenantID: tenantID, Period: p, Attempts: tt.attempts})
		d := newTestDeliverer(db, clock)
		d.MaxAttempts = 1000
		if !tt.defaultJitter {
			d.Jitter = tt.jitter
		}
		mustRun(t, d)
		a := mustReadAlert(t, db, id)
		if got := a.NextAttemptAt.Sub(t0); a.Attempts != tt.attempts+1 || got < tt.wantMin || got > tt.wantMax {
			t.Errorf("%s: got attempts %d, retry after %s, want %d, within %s..%s",
				tt.name, a.Attempts, got, tt.attempts+1, tt.wantMin, tt.wantMax)
		}
	}
}

func TestVerifyWebhook(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_773_576_000, 0)
	const id = "4f8d2a0e-8b7c-4c1e-9d3a-2b1f0e9c8d7a"
	ts := fmt.Sprint(now.Unix())
	body := []byte(`{"type":"quota.threshold_crossed"}`)
	good := sign(secret, id, ts, body)
	specSecret, err := billing.ParseWebhookSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		secret    []byte
		id, ts    string
		body      string
		signature string
		want      error
	}{
		{"valid", secret, id, ts, string(body), good, nil},
		{"one of several", secret, id, ts, string(body), "v1,bm9wZQ== v1a,xyz " + good, nil},
		{"tampered body", secret, id, ts, `{"type":"quota.threshold_crossed","x":1}`, good, billing.ErrWebhookSignature},
		{"other id", secret, "msg_other", ts, string(body), good, billing.ErrWebhookSignature},
		{"wrong secret", []byte("another secret of 32 bytes......"), id, ts, string(body), good, billing.ErrWebhookSignature},
		{"wrong version", secret, id, ts, string(body), "v2," + strings.TrimPrefix(good, "v1,"), billing.ErrWebhookSignature},
		{"no signature", secret, id, ts, string(body), "", billing.ErrWebhookSignature},
		{"old timestamp", secret, id, fmt.Sprint(now.Add(-6 * time.Minute).Unix()), string(body),
			sign(secret, id, fmt.Sprint(now.Add(-6*time.Minute).Unix()), body), billing.ErrWebhookTimestamp},
		{"future timestamp", secret, id, fmt.Sprint(now.Add(6 * time.Minute).Unix()), string(body),
			sign(secret, id, fmt.Sprint(now.Add(6*time.Minute).Unix()), body), billing.ErrWebhookTimestamp},
		{"timestamp not a number", secret, id, "yesterday", string(body), good, billing.ErrWebhookTimestamp},
		{"the specification's example", specSecret, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", `{"test": 2432232314}`,
			"v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", nil},
	}
	for _, tt := range tests {
		now := now
		if tt.ts == "1614265330" {
			now = time.Unix(1614265330, 0)
		}
		err := billing.VerifyWebhook(tt.secret, tt.id, tt.ts, []byte(tt.body), tt.signature, now, 5*time.Minute)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, err, tt.want)
		}
	}
}

func TestWebhookSecretString(t *testing.T) {
	t.Parallel()
	raw := []byte{0xfb, 0xff, 0x00, 0x01}
	s := billing.WebhookSecretString(raw)
	if want := "whsec_+/8AAQ=="; s != want {
		t.Errorf("got %q, want %q", s, want)
	}
	back, err := billing.ParseWebhookSecret(s)
	if err != nil || string(back) != string(raw) {
		t.Errorf("ParseWebhookSecret(%q): got %x, %v, want %x", s, back, err, raw)
	}
}

func TestAlertList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	tenantID, _ := mustTenant(t, db, "")
	// Six alerts an hour apart; two share a created_at, so the id breaks the tie.
	type row struct {
		id, status string
		at         time.Time
	}
	var rows []row
	for i, s := range []string{billing.AlertDelivered, billing.AlertPending, billing.AlertFailed, billing.AlertPending, billing.AlertSkipped, billing.AlertPending} {
		at := t0.Add(time.Duration(min(i, 4)) * time.Hour) // alerts 4 and 5 share a time
		p := time.Date(2026, time.Month(1+i), 1, 0, 0, 0, 0, time.UTC).Format(time.DateOnly)
		rows = append(rows, row{mustAlert(t, db, alertRow{TenantID: tenantID, Period: p, Status: s, CreatedAt: at}), s, at})
	}
	slices.SortFunc(rows, func(a, b row) int { // newest first, then larger id first
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		return strings.Compare(b.id, a.id)
	})
	wantPages := func(status string, limit int) [][]string {
		var ids []string
		for _, r := range rows {
			if status == "" || r.status == status {
				ids = append(ids, r.id)
			}
		}
		return slices.Collect(slices.Chunk(ids, limit))
	}
	d := billing.NewDeliverer(db, nil, newClock(t0).Now)

	tests := []struct {
		status     string
		limit      int
		wantLimit  int // page size expected when limit is defaulted
		wantNPages int
	}{
		{"", 0, billing.DefaultAlertListLimit, 1},
		{"", 1, 1, 6},
		{"", 2, 2, 3},
		{"", 4, 4, 2},
		{"", 6, 6, 1},
		{billing.AlertPending, 2, 2, 2},
		{billing.AlertDelivered, 10, 10, 1},
		{billing.AlertFailed, 1, 1, 1},
		{billing.AlertSkipped, -5, billing.DefaultAlertListLimit, 1},
	}
	for _, tt := range tests {
		var got [][]string
		cursor := ""
		for len(got) < 10 {
			alerts, next, err := d.List(ctx, tt.status, tt.limit, cursor)
			if err != nil {
				t.Fatalf("List(%q, %d, %q): %v", tt.status, tt.limit, cursor, err)
			}
			var ids []string
			for _, a := range alerts {
				ids = append(ids, a.ID)
			}
			got = append(got, ids)
			if next == nil {
				break
			}
			cursor = *next
		}
		want := wantPages(tt.status, tt.wantLimit)
		if fmt.Sprint(got) != fmt.Sprint(want) || len(got) != tt.wantNPages {
			t.Errorf("List(%q, %d): got pages %v, want %v (%d pages)", tt.status, tt.limit, got, want, tt.wantNPages)
		}
	}

	alerts, _, err := d.List(ctx, billing.AlertDelivered, 1, "")
	if err != nil || len(alerts) != 1 {
		t.Fatalf("List(delivered): got %d alerts, %v, want 1", len(alerts), err)
	}
	a := alerts[0]
	if a.Period != "2026-01-01" || a.TenantID != tenantID || a.Threshold != 80 || a.Units != 8000 || a.Quota != 10000 ||
		a.DeliveredAt == nil || !a.CreatedAt.Equal(t0) {
		t.Errorf("got %+v, want the alert of 2026-01-01", a)
	}
	b, _ := json.Marshal(a)
	for _, key := range []string{`"id"`, `"tenant_id"`, `"period":"2026-01-01"`, `"threshold":80`, `"units":8000`,
		`"quota":10000`, `"status":"delivered"`, `"attempts":0`, `"next_attempt_at"`, `"last_error":""`, `"created_at"`,
		`"delivered_at"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("got JSON %s, want it to contain %s", b, key)
		}
	}

	for _, bad := range []struct{ status, cursor, field string }{
		{"sent", "", "status"},
		{"PENDING", "", "status"},
		{"", "not a cursor", "cursor"},
		{"", base64.RawURLEncoding.EncodeToString([]byte("123_nope")), "cursor"},
		{"", base64.RawURLEncoding.EncodeToString([]byte("x_" + rows[0].id)), "cursor"},
	} {
		_, _, err := d.List(ctx, bad.status, 10, bad.cursor)
		var e *quota.Error
		if !errors.As(err, &e) || e.Code != quota.CodeInvalid || e.Field != bad.field {
			t.Errorf("List(%q, cursor %q): got %v, want an invalid %s error", bad.status, bad.cursor, err, bad.field)
		}
	}
}

// sign is the signature as the Standard Webhooks specification defines it,
// written independently of the package's.
func sign(secret []byte, id, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(id + "." + timestamp + "." + string(body)))
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// ExampleVerifyWebhook checks a webhook as a receiver would, with the
// headers and raw body of the request and the secret shown as whsec_....
func ExampleVerifyWebhook() {
	secret, _ := billing.ParseWebhookSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	id := "msg_p5jXN8AQM9LWM0D4loKWxJek"                           // webhook-id
	timestamp := "1614265330"                                      // webhook-timestamp
	signature := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" // webhook-signature
	body := []byte(`{"test": 2432232314}`)
	now := time.Unix(1614265330, 0).Add(time.Minute)

	fmt.Println(billing.VerifyWebhook(secret, id, timestamp, body, signature, now, 5*time.Minute))
	fmt.Println(billing.VerifyWebhook(secret, id, timestamp, []byte(`{"test": 1}`), signature, now, 5*time.Minute))
	fmt.Println(billing.VerifyWebhook(secret, id, timestamp, body, signature, now.Add(time.Hour), 5*time.Minute))
	// Output:
	// <nil>
	// webhook: no matching signature
	// webhook: timestamp outside tolerance
}
