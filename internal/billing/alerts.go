package billing

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/quota"
)

// Alert delivery: the alerts table is an outbox that the metering side fills
// in the transaction recording a threshold crossing; the Deliverer drains it
// into webhooks signed the Standard Webhooks way
// (https://www.standardwebhooks.com). Delivery is at least once: a webhook
// may arrive twice (a worker that dies between the POST and recording it),
// so receivers dedupe on webhook-id, which is the alert id on every attempt.
//
// Two workers never send the same alert at once: a worker claims due alerts
// with FOR UPDATE SKIP LOCKED in a short transaction that moves their
// next_attempt_at one Lease ahead, sends outside any transaction, then
// records the outcome only if the alert still carries its lease (so a worker
// that lost its lease cannot count an attempt twice). A worker that dies
// leaves its alerts to be claimed again once the lease has passed.

// AlertEventType is the "type" of the webhook sent for a threshold crossing.
const AlertEventType = "quota.threshold_crossed"

// CreditAlertEventType is the "type" of the webhook sent when a prepaid
// tenant's credit runs low (an alert of kind AlertKindCredit).
const CreditAlertEventType = "credit.balance_low"

// Alert kinds: a crossing of a monthly quota, or a prepaid tenant's credit
// running low (see RecordCreditAlerts).
const (
	AlertKindQuota  = "quota"
	AlertKindCredit = "credit"
)

// Alert statuses.
const (
	AlertPending   = "pending"
	AlertDelivered = "delivered"
	AlertFailed    = "failed"
	AlertSkipped   = "skipped"
)

// Defaults of the Deliverer's tunables.
const (
	DefaultAlertBatch       = 20
	DefaultAlertConcurrency = 10
	DefaultAlertMaxAttempts = 10
	DefaultAlertLease       = time.Minute
	DefaultWebhookTimeout   = 10 * time.Second
	// Backoff after the n-th failed attempt is 10 s × 2^(n-1), at most 1 h.
	alertBackoffBase = 10 * time.Second
	alertBackoffMax  = time.Hour
	maxLastError     = 500 // characters of last_error kept
	maxRedirects     = 5
)

// Deliverer sends pending alerts to their tenants' webhook URLs. Set its
// exported tunables before the first Run; the counters may be read at any
// time.
type Deliverer struct {
	db     *pgxpool.Pool
	client *http.Client
	now    func() time.Time

	// Batch is how many alerts one claim takes; Concurrency how many of them
	// are sent at once.
	Batch       int
	Concurrency int
	// MaxAttempts is the number of failed attempts after which an alert is
	// given up (status failed).
	MaxAttempts int
	// Lease is how long a claim keeps other workers off an alert; it must
	// exceed Timeout, and a claimed alert is only sent while at least Timeout
	// of its lease is left (measured on the wall clock).
	Lease time.Duration
	// Timeout bounds one POST, redirects and reading the response included.
	Timeout time.Duration
	// Jitter spreads a retry delay; nil means none. NewDeliverer sets ±20 %.
	Jitter func(time.Duration) time.Duration
	// AllowPrivate lets webhooks reach addresses that are not public (see
	// PublicAddr). Without it every address dialled, once its name is
	// resolved and again on each redirect, must be public: a tenant's
	// webhook URL must not reach into the worker's network (the cloud
	// metadata service at 169.254.169.254, an admin port on loopback), nor
	// get there later by changing what its name resolves to.
	AllowPrivate bool
	// dialAllowed replaces the rule above, for tests; nil in production.
	dialAllowed func(netip.AddrPort) bool

	// Counters since the Deliverer was made, for metrics. Delivered, Failed
	// and Skipped count alerts reaching that status; Retried counts failed
	// attempts that will be retried.
	Delivered atomic.Int64
	Failed    atomic.Int64
	Skipped   atomic.Int64
	Retried   atomic.Int64
}

// Fixed failures of a redirect, recorded as they are.
var (
	errRedirectScheme = errors.New("redirect to a URL that is not http or https refused")
	errRedirectGET    = errors.New("redirect that drops the POST body refused")
	errRedirectLoop   = fmt.Errorf("stopped after %d redirects", maxRedirects)
)

// NewDeliverer returns a Deliverer on db that posts with a copy of client
// (nil: a default client) whose redirects are limited to http and https and
// to 307/308, which keep the POST and its body. now is the clock for leases,
// retry times and webhook timestamps.
//
// The copy's transport (client's, when it is an *http.Transport) dials
// through a check of every address (AllowPrivate) and ignores the
// environment's HTTP proxy, which would be the only address checked. A
// client with another RoundTripper keeps it and answers for what it dials.
func NewDeliverer(db *pgxpool.Pool, client *http.Client, now func() time.Time) *Deliverer {
	c := &http.Client{}
	if client != nil {
		*c = *client
	}
	d := &Deliverer{
		db: db, client: c, now: now,
		Batch:       DefaultAlertBatch,
		Concurrency: DefaultAlertConcurrency,
		MaxAttempts: DefaultAlertMaxAttempts,
		Lease:       DefaultAlertLease,
		Timeout:     DefaultWebhookTimeout,
		Jitter:      jitter20,
	}
	var tr *http.Transport
	switch t := c.Transport.(type) {
	case nil:
		if dt, ok := http.DefaultTransport.(*http.Transport); ok {
			tr = dt.Clone()
		} else {
			tr = &http.Transport{}
		}
	case *http.Transport:
		tr = t.Clone()
	}
	if tr != nil {
		dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: d.checkDial}
		// DialContext wins over Dial, and DialTLSContext over DialContext
		// (for https) and over DialTLS: both dial through the check. The TLS
		// configuration is read at each dial, once the transport has added
		// its protocols (h2) to it.
		tr.Proxy, tr.DialContext = nil, dialer.DialContext
		tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			td := &tls.Dialer{NetDialer: dialer, Config: tr.TLSClientConfig}
			return td.DialContext(ctx, network, addr)
		}
		c.Transport = tr
	}
	next := c.CheckRedirect
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
			return errRedirectScheme
		}
		// 301, 302 and 303 turn the POST into a GET without the payload;
		// a 2xx to that must not count as delivered.
		if req.Method != http.MethodPost {
			return errRedirectGET
		}
		if len(via) >= maxRedirects {
			return errRedirectLoop
		}
		if next != nil {
			return next(req, via)
		}
		return nil
	}
	return d
}

// checkDial is the webhook dialer's Control: it sees the address about to
// be dialled, after name resolution, for the first request and for every
// redirect, so neither a name that resolves inside (now or after a DNS
// change) nor a redirect reaches an address that is not public.
func (d *Deliverer) checkDial(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return ErrWebhookTarget
	}
	ok := d.AllowPrivate || PublicAddr(ap.Addr())
	if d.dialAllowed != nil {
		ok = d.dialAllowed(ap)
	}
	if !ok {
		return ErrWebhookTarget
	}
	return nil
}

// ErrWebhookTarget means that a webhook's host is, or resolves to, an
// address that is not public.
var ErrWebhookTarget = errors.New("refused: the webhook host is not a public address (loopback, link-local, private or reserved)")

// nonPublic are the ranges PublicAddr refuses beyond those net/netip names.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // "this network": 0.0.0.0 reaches the local host
	netip.MustParsePrefix("100.64.0.0/10"),  // carrier-grade NAT, shared address space
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, and the broadcast address
	netip.MustParsePrefix("::/96"),          // IPv4-compatible IPv6 (deprecated)
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64
	netip.MustParsePrefix("100::/64"),       // discard-only
	netip.MustParsePrefix("2001::/32"),      // Teredo, which tunnels to IPv4 hosts
	netip.MustParsePrefix("fec0::/10"),      // site-local (deprecated)
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96") // the IPv4 address is the last 32 bits
	sixToFour = netip.MustParsePrefix("2002::/16")    // the IPv4 address is bits 16 to 48
)

// PublicAddr reports whether a webhook may reach a: not loopback,
// link-local, private (10/8, 172.16/12, 192.168/16, fc00::/7), unspecified,
// multicast, carrier-grade NAT (100.64/10) or otherwise reserved, whether
// written as IPv4, IPv4-mapped IPv6, or IPv4 inside a NAT64 or 6to4
// address.
func PublicAddr(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	if !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsUnspecified() || a.IsMulticast() ||
		a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return PublicAddr(netip.AddrFrom4([4]byte(b[12:16])))
	case sixToFour.Contains(a):
		return PublicAddr(netip.AddrFrom4([4]byte(b[2:6])))
	}
	return true
}

// CheckWebhookHost checks the host of a webhook URL without resolving it,
// to report a mistake where it is made: a literal address must be public
// (PublicAddr); names of this machine (localhost, *.localhost) are refused,
// and so are numeric forms that resolvers read as IPv4 ("127.1",
// "2130706433", "0x7f000001"). What a name resolves to is checked where it
// counts, each time it is dialled (Deliverer.AllowPrivate): it may change
// after any check made here.
func CheckWebhookHost(host string) error {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if a, err := netip.ParseAddr(h); err == nil {
		if !PublicAddr(a) {
			return ErrWebhookTarget
		}
		return nil
	}
	last := h[strings.LastIndexByte(h, '.')+1:]
	if h == "" || h == "localhost" || strings.HasSuffix(h, ".localhost") || numericLabel(last) {
		return ErrWebhookTarget
	}
	return nil
}

// numericLabel reports whether a host's last label is a number (decimal,
// or hex with 0x), which makes the WHATWG URL parser, and inet_aton, read
// the host as an IPv4 address; no public DNS name ends so.
func numericLabel(s string) bool {
	digits := "0123456789"
	if len(s) > 2 && s[0] == '0' && s[1] == 'x' {
		s, digits = s[2:], "0123456789abcdef"
	}
	if s == "" {
		return false
	}
	for _, r := range s {
		if !strings.ContainsRune(digits, r) {
			return false
		}
	}
	return true
}

// jitter20 returns d moved by a uniformly random amount within ±20 %.
func jitter20(d time.Duration) time.Duration {
	span := int64(d) / 5 * 2 // the width of the band
	if span <= 0 {
		return d
	}
	n, err := rand.Int(rand.Reader, big.NewInt(span+1))
	if err != nil { // crypto/rand does not fail on the platforms Go supports
		return d
	}
	return d - time.Duration(span/2) + time.Duration(n.Int64())
}

// backoff returns the delay before the attempt after the n-th failed one
// (n ≥ 1): 10 s, 20 s, 40 s … at most 1 h, jitter included.
func (d *Deliverer) backoff(n int) time.Duration {
	delay := alertBackoffMax
	if n < 20 { // 10 s × 2^19 is far past the cap
		delay = min(alertBackoffBase<<max(n-1, 0), alertBackoffMax)
	}
	if d.Jitter != nil {
		delay = d.Jitter(delay)
	}
	return min(max(delay, time.Second), alertBackoffMax)
}

// claimedAlert is a due alert claimed for sending, with its tenant's webhook.
type claimedAlert struct {
	ID            string    `db:"id"`
	TenantID      string    `db:"tenant_id"`
	Period        string    `db:"period"` // YYYY-MM
	Threshold     int       `db:"threshold"`
	Units         int64     `db:"units"`
	Quota         int64     `db:"quota"`
	Meter         string    `db:"meter"`
	Kind          string    `db:"kind"`
	Attempts      int       `db:"attempts"`
	CreatedAt     time.Time `db:"created_at"`
	LeaseUntil    time.Time `db:"lease_until"`
	WebhookURL    string    `db:"webhook_url"`
	WebhookSecret []byte    `db:"webhook_secret"`
}

// Run delivers the alerts due now, batch after batch, until none is due or
// ctx ends. A failed POST is an outcome recorded on the alert, not an error;
// Run returns an error only when Postgres fails or the Deliverer is
// misconfigured. Running it again, or in several workers at once, is safe.
func (d *Deliverer) Run(ctx context.Context) error {
	if d.Batch < 1 || d.Concurrency < 1 || d.MaxAttempts < 1 || d.Timeout <= 0 || d.Lease <= d.Timeout {
		return fmt.Errorf("billing: deliverer: need Batch, Concurrency, MaxAttempts ≥ 1 and Lease > Timeout > 0")
	}
	for ctx.Err() == nil {
		claimed, err := d.claim(ctx)
		if err != nil {
			return err
		}
		if err := d.sendAll(ctx, claimed); err != nil {
			return err
		}
		if len(claimed) < d.Batch {
			return nil
		}
	}
	return nil
}

// claim takes up to Batch due alerts: those of tenants without a webhook URL
// are marked skipped, the others leased and returned.
func (d *Deliverer) claim(ctx context.Context) ([]claimedAlert, error) {
	now := d.now()
	var (
		out     []claimedAlert
		skipped int
	)
	err := pgx.BeginFunc(ctx, d.db, func(tx pgx.Tx) error {
		claimed, err := claimAlertsTx(ctx, tx, now, now.Add(d.Lease), d.Batch)
		if err != nil {
			return err
		}
		var skip []string
		out, skipped = claimed[:0], 0
		for _, a := range claimed {
			if strings.TrimSpace(a.WebhookURL) == "" {
				skip = append(skip, a.ID)
			} else {
				out = append(out, a)
			}
		}
		if len(skip) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE alerts SET status = 'skipped', next_attempt_at = $2 WHERE id = ANY($1)`, skip, now); err != nil {
			return fmt.Errorf("billing: skip alerts: %w", err)
		}
		skipped = len(skip)
		return nil
	})
	if err != nil {
		return nil, err
	}
	d.Skipped.Add(int64(skipped))
	return out, nil
}

// claimAlertsTx locks up to limit alerts due at now, skipping those another
// worker holds, and leases them until leaseUntil.
func claimAlertsTx(ctx context.Context, tx pgx.Tx, now, leaseUntil time.Time, limit int) ([]claimedAlert, error) {
	rows, err := tx.Query(ctx, `
		WITH due AS (
			SELECT id FROM alerts
			WHERE status = 'pending' AND next_attempt_at <= $1
			ORDER BY next_attempt_at, id
			LIMIT $3
			FOR UPDATE SKIP LOCKED
		)
		UPDATE alerts AS a SET next_attempt_at = $2
		FROM due, tenants AS t
		WHERE a.id = due.id AND t.id = a.tenant_id
		RETURNING a.id, a.tenant_id, to_char(a.period, 'YYYY-MM') AS period, a.threshold, a.units, a.quota, a.meter, a.kind,
		          a.attempts, a.created_at, a.next_attempt_at AS lease_until, t.webhook_url, t.webhook_secret`,
		now, leaseUntil, limit)
	if err != nil {
		return nil, fmt.Errorf("billing: claim alerts: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowToStructByName[claimedAlert])
	if err != nil {
		return nil, fmt.Errorf("billing: claim alerts: %w", err)
	}
	return claimed, nil
}

// sendAll posts the claimed alerts, Concurrency at a time, and records each
// outcome. It returns the errors of recording.
func (d *Deliverer) sendAll(ctx context.Context, claimed []claimedAlert) error {
	if len(claimed) == 0 {
		return nil
	}
	start := time.Now() // wall clock: leases must outlast real sends even under a test clock
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, d.Concurrency)
	)
	for _, a := range claimed {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break // the rest keep their lease and are claimed again once it passes
		}
		if time.Since(start) > d.Lease-d.Timeout {
			<-sem
			break // too little lease left to send safely
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := d.deliver(ctx, a); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// deliver posts one alert and records the outcome.
func (d *Deliverer) deliver(ctx context.Context, a claimedAlert) error {
	sendErr := d.post(ctx, a)
	if sendErr != nil && ctx.Err() != nil {
		// Cut short by the caller (shutdown, step timeout), not the
		// receiver's fault: no attempt is counted; the lease expires and the
		// alert is sent again.
		return nil
	}
	// Record even if ctx ends now: a delivered webhook left unrecorded would
	// be sent again.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	now := d.now()
	if sendErr == nil {
		tag, err := d.db.Exec(rctx, `
			UPDATE alerts SET status = 'delivered', delivered_at = $2, attempts = attempts + 1
			WHERE id = $1 AND status = 'pending' AND attempts = $3 AND next_attempt_at = $4`,
			a.ID, now, a.Attempts, a.LeaseUntil)
		if err != nil {
			return fmt.Errorf("billing: record alert %s delivered: %w", a.ID, err)
		}
		if tag.RowsAffected() == 1 {
			d.Delivered.Add(1)
		}
		return nil
	}
	n := a.Attempts + 1
	status, next := AlertPending, now.Add(d.backoff(n))
	if n >= d.MaxAttempts {
		status, next = AlertFailed, now
	}
	tag, err := d.db.Exec(rctx, `
		UPDATE alerts SET status = $2, attempts = attempts + 1, last_error = $3, next_attempt_at = $4
		WHERE id = $1 AND status = 'pending' AND attempts = $5 AND next_attempt_at = $6`,
		a.ID, status, truncateError(sendErr.Error()), next, a.Attempts, a.LeaseUntil)
	if err != nil {
		return fmt.Errorf("billing: record alert %s attempt: %w", a.ID, err)
	}
	if tag.RowsAffected() == 1 {
		if status == AlertFailed {
			d.Failed.Add(1)
		} else {
			d.Retried.Add(1)
		}
	}
	return nil
}

// webhookPayload is the body of a threshold webhook.
type webhookPayload struct {
	Type      string      `json:"type"`
	Timestamp time.Time   `json:"timestamp"` // when the threshold was crossed, RFC 3339
	Data      webhookData `json:"data"`
}

type webhookData struct {
	TenantID  string `json:"tenant_id"`
	Period    string `json:"period"` // YYYY-MM
	Threshold int    `json:"threshold"`
	Units     int64  `json:"units"`
	Quota     int64  `json:"quota"`
	// Limit names the quota crossed: "monthly" (the tier-wide monthly
	// quota) or "<meter>.monthly" (a meter's); Meter is that meter, or "".
	Limit string `json:"limit"`
	Meter string `json:"meter"`
}

// creditWebhookData is the data of a credit.balance_low webhook: the
// credit balance (cents) the alert measured against, the cents of usage
// no invoice has drawn yet, and what is left of the one by the other.
type creditWebhookData struct {
	TenantID     string `json:"tenant_id"`
	Threshold    int    `json:"threshold"` // 80: 80 % spent; 100: nothing left
	CreditCents  int64  `json:"credit_cents"`
	SpentCents   int64  `json:"spent_cents"`
	BalanceCents int64  `json:"balance_cents"`
}

// payload is the webhook body of alert a.
func (a claimedAlert) payload() any {
	if a.Kind == AlertKindCredit {
		return struct {
			Type      string            `json:"type"`
			Timestamp time.Time         `json:"timestamp"`
			Data      creditWebhookData `json:"data"`
		}{CreditAlertEventType, a.CreatedAt.UTC(), creditWebhookData{TenantID: a.TenantID, Threshold: a.Threshold,
			CreditCents: a.Quota, SpentCents: a.Units, BalanceCents: max(0, a.Quota-a.Units)}}
	}
	return webhookPayload{
		Type:      AlertEventType,
		Timestamp: a.CreatedAt.UTC(),
		Data: webhookData{TenantID: a.TenantID, Period: a.Period, Threshold: a.Threshold,
			Units: a.Units, Quota: a.Quota, Limit: alertLimit(a.Meter), Meter: a.Meter},
	}
}

// alertLimit is the name of the limit an alert of meter ("" tier-wide) is of.
func alertLimit(meter string) string {
	if meter == "" {
		return string(quota.LimitMonthly)
	}
	return meter + "." + string(quota.LimitMonthly)
}

// post sends one signed webhook; nil means the receiver answered 2xx.
func (d *Deliverer) post(ctx context.Context, a claimedAlert) error {
	u, err := url.Parse(strings.TrimSpace(a.WebhookURL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("webhook_url is not an absolute http or https URL")
	}
	body, err := json.Marshal(a.payload())
	if err != nil {
		return fmt.Errorf("encode payload: %w", err)
	}
	ts := strconv.FormatInt(d.now().Unix(), 10)

	ctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Tollgate-Webhooks/1")
	req.Header.Set("webhook-id", a.ID)
	req.Header.Set("webhook-timestamp", ts)
	req.Header.Set("webhook-signature", signWebhook(a.WebhookSecret, a.ID, ts, body))
	resp, err := d.client.Do(req)
	if err != nil {
		return sendFailure(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errors.New("HTTP " + strconv.Itoa(resp.StatusCode))
	}
	return nil
}

// sendFailure turns the error of a POST into one of a few fixed messages
// for last_error, which admins read. What the receiver sent never gets
// there, not even the bytes of an answer that is not HTTP which Go's errors
// quote: a webhook pointed at another protocol's port would otherwise read
// that service's answer back through the admin API.
func sendFailure(err error) error {
	var (
		netErr  net.Error
		dnsErr  *net.DNSError
		opErr   *net.OpError
		certErr *tls.CertificateVerificationError
		recErr  tls.RecordHeaderError
		alert   tls.AlertError
	)
	for _, known := range []error{ErrWebhookTarget, errRedirectScheme, errRedirectGET, errRedirectLoop} {
		if errors.Is(err, known) {
			return known
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout():
		return errors.New("timed out")
	case errors.As(err, &dnsErr):
		return errors.New("the webhook host's name does not resolve")
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return errors.New("could not connect to the webhook host")
	case errors.As(err, &certErr) || errors.As(err, &recErr) || errors.As(err, &alert):
		return errors.New("TLS handshake failed")
	}
	return errors.New("no valid HTTP answer")
}

// truncateError makes s fit last_error: valid UTF-8 without NULs (Postgres
// text refuses both), at most maxLastError characters.
func truncateError(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	if r := []rune(s); len(r) > maxLastError {
		s = string(r[:maxLastError])
	}
	return s
}

// Standard Webhooks signing.

var (
	// ErrWebhookSignature means no signature in the header matches.
	ErrWebhookSignature = errors.New("webhook: no matching signature")
	// ErrWebhookTimestamp means the timestamp is malformed or outside the
	// tolerance (a replay, or a badly wrong clock).
	ErrWebhookTimestamp = errors.New("webhook: timestamp outside tolerance")
)

const whsecPrefix = "whsec_"

// WebhookSecretString returns a tenant's signing secret as shown to it:
// "whsec_" and the raw bytes in standard base64.
func WebhookSecretString(raw []byte) string {
	return whsecPrefix + base64.StdEncoding.EncodeToString(raw)
}

// ParseWebhookSecret is the inverse of WebhookSecretString; the whsec_
// prefix is optional.
func ParseWebhookSecret(s string) ([]byte, error) {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, whsecPrefix))
	if err != nil {
		return nil, fmt.Errorf("webhook: secret: %w", err)
	}
	return raw, nil
}

// signWebhook returns the webhook-signature header value for one message:
// "v1," and base64 of HMAC-SHA256(secret, id "." timestamp "." body).
func signWebhook(secret []byte, id, timestamp string, body []byte) string {
	return "v1," + base64.StdEncoding.EncodeToString(webhookMAC(secret, id, timestamp, body))
}

func webhookMAC(secret []byte, id, timestamp string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// VerifyWebhook checks a received webhook the Standard Webhooks way: id,
// timestamp and signatureHeader are the webhook-id, webhook-timestamp and
// webhook-signature headers, body the raw request body, secret the raw
// signing secret (ParseWebhookSecret of the whsec_ string). The header may
// carry several space-separated signatures (during a secret rotation); one
// matching "v1," signature suffices. The timestamp must be within tolerance
// of now either way, which bounds replays. Signatures are compared in
// constant time. It returns nil, ErrWebhookTimestamp or ErrWebhookSignature.
func VerifyWebhook(secret []byte, id, timestamp string, body []byte, signatureHeader string, now time.Time, tolerance time.Duration) error {
	sec, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return ErrWebhookTimestamp
	}
	if skew := now.Sub(time.Unix(sec, 0)); skew > tolerance || skew < -tolerance {
		return ErrWebhookTimestamp
	}
	want := webhookMAC(secret, id, timestamp, body)
	for _, sig := range strings.Fields(signatureHeader) {
		version, b64, ok := strings.Cut(sig, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			continue
		}
		if hmac.Equal(got, want) {
			return nil
		}
	}
	return ErrWebhookSignature
}

// Admin listing.

// Alert is a threshold alert as the admin API lists it.
type Alert struct {
	ID        string `json:"id" db:"id"`
	TenantID  string `json:"tenant_id" db:"tenant_id"`
	Period    string `json:"period" db:"period"` // YYYY-MM-DD, the first day of the month
	Threshold int    `json:"threshold" db:"threshold"`
	Units     int64  `json:"units" db:"units"`
	Quota     int64  `json:"quota" db:"quota"`
	Meter     string `json:"meter" db:"meter"` // "" for the tier-wide monthly quota
	// Kind is AlertKindQuota (a monthly quota's threshold) or
	// AlertKindCredit (a prepaid tenant's credit: Units the cents of usage
	// no invoice has drawn, Quota the credit balance).
	Kind          string     `json:"kind" db:"kind"`
	Status        string     `json:"status" db:"status"`
	Attempts      int        `json:"attempts" db:"attempts"`
	NextAttemptAt time.Time  `json:"next_attempt_at" db:"next_attempt_at"`
	LastError     string     `json:"last_error" db:"last_error"`
	CreatedAt     time.Time  `json:"created_at" db:"created_at"`
	DeliveredAt   *time.Time `json:"delivered_at" db:"delivered_at"`
}

// Limits of List.
const (
	DefaultAlertListLimit = 50
	MaxAlertListLimit     = 500
)

// List returns alerts newest first, only those with status unless it is "",
// at most limit (≤ 0: DefaultAlertListLimit; capped at MaxAlertListLimit),
// starting after cursor ("" for the first page). The returned cursor, nil on
// the last page, fetches the next page. An unknown status or a malformed
// cursor is a quota CodeInvalid error.
func (d *Deliverer) List(ctx context.Context, status string, limit int, cursor string) ([]Alert, *string, error) {
	switch status {
	case "", AlertPending, AlertDelivered, AlertFailed, AlertSkipped:
	default:
		return nil, nil, quota.FieldError("status", "must be one of pending, delivered, failed, skipped")
	}
	if limit <= 0 {
		limit = DefaultAlertListLimit
	}
	limit = min(limit, MaxAlertListLimit)
	var (
		afterAt *time.Time
		afterID *string
	)
	if cursor != "" {
		at, id, err := decodeAlertCursor(cursor)
		if err != nil {
			return nil, nil, quota.FieldError("cursor", "is not a cursor this listing returned")
		}
		afterAt, afterID = &at, &id
	}
	rows, err := d.db.Query(ctx, `
		SELECT id, tenant_id, to_char(period, 'YYYY-MM-DD') AS period, threshold, units, quota, meter, kind, status,
		       attempts, next_attempt_at, last_error, created_at, delivered_at
		FROM alerts
		WHERE ($1 = '' OR status = $1)
		  AND ($2::timestamptz IS NULL OR (created_at, id) < ($2::timestamptz, $3::uuid))
		ORDER BY created_at DESC, id DESC
		LIMIT $4`, status, afterAt, afterID, limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("billing: list alerts: %w", err)
	}
	alerts, err := pgx.CollectRows(rows, pgx.RowToStructByName[Alert])
	if err != nil {
		return nil, nil, fmt.Errorf("billing: list alerts: %w", err)
	}
	if len(alerts) <= limit {
		return alerts, nil, nil
	}
	alerts = alerts[:limit]
	last := alerts[limit-1]
	next := encodeAlertCursor(last.CreatedAt, last.ID)
	return alerts, &next, nil
}

// An alert cursor is the created_at (Unix µs, Postgres' precision) and id of
// the last alert of a page, base64url-encoded to keep it opaque.
func encodeAlertCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at.UnixMicro(), 10) + "_" + id))
}

func decodeAlertCursor(s string) (time.Time, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return time.Time{}, "", err
	}
	micros, id, ok := strings.Cut(string(raw), "_")
	if !ok || !quota.ValidID(id) {
		return time.Time{}, "", errors.New("malformed cursor")
	}
	n, err := strconv.ParseInt(micros, 10, 64)
	if err != nil {
		return time.Time{}, "", err
	}
	return time.UnixMicro(n).UTC(), id, nil
}
