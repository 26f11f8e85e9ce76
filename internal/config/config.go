// Package config loads Tollgate's settings from the environment, in one place,
// with a default for every variable and an error that names the variable at
// fault.
//
// It opens no connection and reads no file; the other packages get their
// settings from a Config, never from TOLLGATE_ variables of their own
// (telemetry reads the standard OTEL_ ones).
package config

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisdb"
)

// Config holds the settings of both binaries; each reads what it needs.
type Config struct {
	RedisURL          string                  // REDIS_URL
	Redis             *redis.UniversalOptions // parsed from RedisURL
	RedisPrefix       string                  // TOLLGATE_REDIS_PREFIX
	DatabaseURL       string                  // DATABASE_URL
	Addr              string                  // TOLLGATE_ADDR
	OpsAddr           string                  // TOLLGATE_OPS_ADDR; empty: operations on Addr
	AdminToken        string                  // TOLLGATE_ADMIN_TOKEN
	ServiceToken      string                  // TOLLGATE_SERVICE_TOKEN
	ReconcileInterval time.Duration           // TOLLGATE_RECONCILE_INTERVAL
	RoutesFile        string                  // TOLLGATE_ROUTES
	LogLevel          slog.Level              // TOLLGATE_LOG_LEVEL
	LogFormat         string                  // TOLLGATE_LOG_FORMAT
	ShutdownTimeout   time.Duration           // TOLLGATE_SHUTDOWN_TIMEOUT
	BodyLimit         int                     // TOLLGATE_BODY_LIMIT
	InvoiceGrace      time.Duration           // TOLLGATE_INVOICE_GRACE
	WorkerMetricsAddr string                  // TOLLGATE_WORKER_METRICS_ADDR
	SessionTTL        time.Duration           // TOLLGATE_SESSION_TTL
	// TrustedProxies are the proxies whose X-Forwarded-For is believed
	// (TOLLGATE_TRUSTED_PROXIES); a single address is a /32 or /128.
	TrustedProxies      []netip.Prefix
	WebhookAllowPrivate bool // TOLLGATE_WEBHOOK_ALLOW_PRIVATE
	// ProxyMaxResponseBytes is the largest upstream answer body the proxy
	// passes on (TOLLGATE_PROXY_MAX_RESPONSE_BYTES); 0: no maximum.
	ProxyMaxResponseBytes int64
	// IdempotencyLimits bound each tenant's idempotency records
	// (TOLLGATE_IDEMPOTENCY_MAX_ANSWERS, TOLLGATE_IDEMPOTENCY_MAX_BYTES).
	IdempotencyLimits quota.AnswerLimits
	// QueueWaiters bound the requests of one api node waiting in policy
	// queues: in all (TOLLGATE_QUEUE_WAITERS), per tenant
	// (TOLLGATE_QUEUE_WAITERS_PER_TENANT), per policy
	// (TOLLGATE_QUEUE_WAITERS_PER_POLICY).
	QueueWaiters, QueueWaitersPerTenant, QueueWaitersPerPolicy int
	// MaxConns caps the client connections the api holds open at once
	// (TOLLGATE_MAX_CONNS); 0: connlimit.DefaultMax.
	MaxConns int
	// MaxConnsPerIP caps them per client address
	// (TOLLGATE_MAX_CONNS_PER_IP); 0: no cap.
	MaxConnsPerIP int
	ReadTimeout   time.Duration // TOLLGATE_READ_TIMEOUT
	IdleTimeout   time.Duration // TOLLGATE_IDLE_TIMEOUT
	// ProxyMaxResponseHeaderBytes is the largest header block of an
	// upstream's answer the proxy reads
	// (TOLLGATE_PROXY_MAX_RESPONSE_HEADER_BYTES).
	ProxyMaxResponseHeaderBytes int
	// StripeKey is the Stripe secret key the worker exports final invoices
	// with (TOLLGATE_STRIPE_KEY); empty: no export.
	StripeKey string
	// StripeURL is the Stripe API's base URL (TOLLGATE_STRIPE_URL).
	StripeURL string
	// GRPCAddr is the listen address of the gRPC services for Envoy, the
	// rate limit service and ext_authz (TOLLGATE_GRPC_ADDR); empty: off.
	GRPCAddr string
	// UsageRetentionMonths is how many months of hourly usage detail the
	// worker keeps before the current month (TOLLGATE_USAGE_RETENTION);
	// older months are rolled up into monthly totals. 0: kept for ever.
	UsageRetentionMonths int
}

// Var documents one environment variable.
type Var struct {
	Name, Default, Meaning string
}

// Vars lists every variable Load reads, with its default; the table of
// docs/operations/configuration.md is this list.
var Vars = []Var{
	{"REDIS_URL", "redis://127.0.0.1:6379/0", "Redis; several comma-separated addresses mean a Redis Cluster"},
	{"DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tollgate?sslmode=disable", "Postgres"},
	{"TOLLGATE_ADDR", "127.0.0.1:8080", "the api's listen address (host:port; port 0 picks a free one)"},
	{"TOLLGATE_OPS_ADDR", "", "the api's operations listen address (host:port) for /metrics and /readyz with its checks; the public one then answers /metrics 404 and /readyz without checks; unset: both on TOLLGATE_ADDR"},
	{"TOLLGATE_ADMIN_TOKEN", "", "admin bearer token, at least 16 characters; unset: admin routes refuse everything"},
	{"TOLLGATE_SERVICE_TOKEN", "", "bearer token for POST /v1/check, at least 16 characters; unset: the route refuses everything"},
	{"TOLLGATE_RECONCILE_INTERVAL", "10s", "worker cycle, Go duration, 100ms to 1h"},
	{"TOLLGATE_ROUTES", "", "path of the route table file; unset: the built-in demo routes"},
	{"TOLLGATE_REDIS_PREFIX", "tg", "prefix of every Redis key (letters, digits, - and _)"},
	{"TOLLGATE_LOG_LEVEL", "info", "debug, info, warn or error"},
	{"TOLLGATE_LOG_FORMAT", "json", "json or text"},
	{"TOLLGATE_SHUTDOWN_TIMEOUT", "10s", "how long graceful shutdown waits for in-flight work"},
	{"TOLLGATE_BODY_LIMIT", "1048576", "largest accepted request body, in bytes"},
	{"TOLLGATE_INVOICE_GRACE", "48h", "how long after a month ends late usage is still accepted before its invoices are final"},
	{"TOLLGATE_WORKER_METRICS_ADDR", "127.0.0.1:9091", "the worker's /metrics listen address (host:port; port 0 picks a free one)"},
	{"TOLLGATE_SESSION_TTL", "8h", "lifetime of a dashboard or console sign-in, Go duration, 5m to 720h"},
	{"TOLLGATE_TRUSTED_PROXIES", "", "comma-separated addresses or CIDRs of the proxies in front of the api whose X-Forwarded-For, X-Forwarded-Host and X-Forwarded-Proto are believed; unset: the client is the connection's address, host and scheme"},
	{"TOLLGATE_WEBHOOK_ALLOW_PRIVATE", "false", "true lets webhook URLs reach loopback, link-local and private addresses (a lab, a receiver on the same network); keep false in production"},
	{"TOLLGATE_PROXY_MAX_RESPONSE_BYTES", "0", "largest upstream answer body the proxy passes on, in bytes (502 past it); 0: no maximum"},
	{"TOLLGATE_IDEMPOTENCY_MAX_ANSWERS", "100000", "idempotency records a tenant may hold at once (stored answers and first requests in flight, each 24 h), 1 to 100000000; a new key past it is 429"},
	{"TOLLGATE_IDEMPOTENCY_MAX_BYTES", "67108864", "bytes of stored idempotent answers a tenant may hold at once (a first request in flight holds 1064960, the largest answer), 1064960 to 1099511627776; a new key past it is 429"},
	{"TOLLGATE_QUEUE_WAITERS", "1024", "most requests of one api node waiting in policy queues at once (on_refuse queue); past it a refusal is answered at once"},
	{"TOLLGATE_QUEUE_WAITERS_PER_TENANT", "64", "most of them one tenant's, at most TOLLGATE_QUEUE_WAITERS"},
	{"TOLLGATE_QUEUE_WAITERS_PER_POLICY", "512", "most of them waiting on one policy, at most TOLLGATE_QUEUE_WAITERS"},
	{"TOLLGATE_MAX_CONNS", "0", "client connections the api holds open at once, 0 to 1000000; past it a new one is answered 503 and closed; 0: 10000, or half the process's open-file limit when that is lower"},
	{"TOLLGATE_MAX_CONNS_PER_IP", "512", "client connections open at once from one address (an IPv6 client by its /64), 0 to 1000000; past it a new one is answered 429 and closed; the trusted proxies are not capped; 0: no cap"},
	{"TOLLGATE_READ_TIMEOUT", "30s", "how long a client has to send a whole request, headers and body, from its first byte (a new connection: its first request), Go duration, 1s to 10m"},
	{"TOLLGATE_IDLE_TIMEOUT", "120s", "how long a kept-alive connection may wait for its next request, Go duration, 1s to 1h"},
	{"TOLLGATE_PROXY_MAX_RESPONSE_HEADER_BYTES", "65536", "largest header block (status line and headers) of an upstream's answer the proxy reads, in bytes, 4096 to 1048576 (502 past it, not refunded)"},
	{"TOLLGATE_STRIPE_KEY", "", "Stripe secret or restricted key (sk_… or rk_…); set: the worker exports every final invoice to Stripe; unset: no export"},
	{"TOLLGATE_STRIPE_URL", "https://api.stripe.com", "base URL of the Stripe API the worker exports to (http or https; a stripe-mock in tests)"},
	{"TOLLGATE_GRPC_ADDR", "", "the api's gRPC listen address (host:port; port 0 picks a free one) for Envoy: the rate limit service, ext_authz and gRPC health on one port, plaintext HTTP/2 (docs/envoy.md); unset: off"},
	{"TOLLGATE_USAGE_RETENTION", "0", "months of hourly usage detail the worker keeps before the current month, 0 or 3 to 1200; older months keep only their monthly totals per tenant and meter (invoices are kept) (docs/operations-ledger.md); 0: all of it, for ever"},
}

// Load reads the configuration through getenv and validates it. The error
// names the first variable at fault.
func Load(getenv func(string) string) (Config, error) {
	get := func(name string) string {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			return v
		}
		for _, v := range Vars {
			if v.Name == name {
				return v.Default
			}
		}
		return ""
	}
	var c Config
	var err error
	c.RedisURL = get("REDIS_URL")
	if c.Redis, err = redisdb.ParseURL(c.RedisURL); err != nil {
		return c, fmt.Errorf("config: REDIS_URL: %w", err)
	}
	c.RedisPrefix = get("TOLLGATE_REDIS_PREFIX")
	if !validPrefix(c.RedisPrefix) {
		return c, fmt.Errorf("config: TOLLGATE_REDIS_PREFIX: %q must be 1 to 32 letters, digits, - or _", c.RedisPrefix)
	}
	// The setting of earlier releases, whose v1 layout this one neither
	// reads nor writes: a node still told to share it with old nodes
	// stops here instead of ignoring their state
	// (docs/operations/redis.md).
	if l := strings.TrimSpace(getenv("TOLLGATE_KEY_LAYOUT")); l != "" && l != "v2" {
		return c, fmt.Errorf("config: TOLLGATE_KEY_LAYOUT: %q: the limit state has one layout now (v2, one hash per tenant); "+
			"run the previous release with v2 first, then unset it", l)
	}
	c.DatabaseURL = get("DATABASE_URL")
	if err := checkDatabaseURL(c.DatabaseURL); err != nil {
		return c, fmt.Errorf("config: DATABASE_URL: %w", err)
	}
	c.Addr = get("TOLLGATE_ADDR")
	if err := checkListenAddr(c.Addr); err != nil {
		return c, fmt.Errorf("config: TOLLGATE_ADDR: %w", err)
	}
	if c.OpsAddr = get("TOLLGATE_OPS_ADDR"); c.OpsAddr != "" {
		if err := checkListenAddr(c.OpsAddr); err != nil {
			return c, fmt.Errorf("config: TOLLGATE_OPS_ADDR: %w", err)
		}
		// (Port 0 on both is two free ports.)
		if c.OpsAddr == c.Addr && !strings.HasSuffix(c.Addr, ":0") {
			return c, fmt.Errorf("config: TOLLGATE_OPS_ADDR: %q is TOLLGATE_ADDR itself; unset it to serve operations there", c.OpsAddr)
		}
	}
	c.AdminToken = get("TOLLGATE_ADMIN_TOKEN")
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		return c, fmt.Errorf("config: TOLLGATE_ADMIN_TOKEN: must be at least 16 characters")
	}
	c.ServiceToken = get("TOLLGATE_SERVICE_TOKEN")
	if c.ServiceToken != "" && len(c.ServiceToken) < 16 {
		return c, fmt.Errorf("config: TOLLGATE_SERVICE_TOKEN: must be at least 16 characters")
	}
	if c.ReconcileInterval, err = duration(get, "TOLLGATE_RECONCILE_INTERVAL", 100*time.Millisecond, time.Hour); err != nil {
		return c, err
	}
	c.RoutesFile = getenv("TOLLGATE_ROUTES")
	if err := c.LogLevel.UnmarshalText([]byte(get("TOLLGATE_LOG_LEVEL"))); err != nil {
		return c, fmt.Errorf("config: TOLLGATE_LOG_LEVEL: %q is not debug, info, warn or error", get("TOLLGATE_LOG_LEVEL"))
	}
	c.LogFormat = get("TOLLGATE_LOG_FORMAT")
	if c.LogFormat != "json" && c.LogFormat != "text" {
		return c, fmt.Errorf("config: TOLLGATE_LOG_FORMAT: %q is not json or text", c.LogFormat)
	}
	if c.ShutdownTimeout, err = duration(get, "TOLLGATE_SHUTDOWN_TIMEOUT", 0, 10*time.Minute); err != nil {
		return c, err
	}
	if c.BodyLimit, err = strconv.Atoi(get("TOLLGATE_BODY_LIMIT")); err != nil || c.BodyLimit < 1024 || c.BodyLimit > 64<<20 {
		return c, fmt.Errorf("config: TOLLGATE_BODY_LIMIT: %q must be a number of bytes between 1024 and %d", get("TOLLGATE_BODY_LIMIT"), 64<<20)
	}
	if c.InvoiceGrace, err = duration(get, "TOLLGATE_INVOICE_GRACE", 0, 31*24*time.Hour); err != nil {
		return c, err
	}
	c.WorkerMetricsAddr = get("TOLLGATE_WORKER_METRICS_ADDR")
	if _, _, err := net.SplitHostPort(c.WorkerMetricsAddr); err != nil {
		return c, fmt.Errorf("config: TOLLGATE_WORKER_METRICS_ADDR: %q is not host:port", c.WorkerMetricsAddr)
	}
	if c.SessionTTL, err = duration(get, "TOLLGATE_SESSION_TTL", 5*time.Minute, 720*time.Hour); err != nil {
		return c, err
	}
	if c.UsageRetentionMonths, err = strconv.Atoi(get("TOLLGATE_USAGE_RETENTION")); err != nil ||
		c.UsageRetentionMonths < 0 || c.UsageRetentionMonths > 1200 || (c.UsageRetentionMonths > 0 && c.UsageRetentionMonths < 3) {
		return c, fmt.Errorf("config: TOLLGATE_USAGE_RETENTION: %q must be a number of months, 0 (keep all) or 3 to 1200", get("TOLLGATE_USAGE_RETENTION"))
	}
	if c.TrustedProxies, err = ParsePrefixes(get("TOLLGATE_TRUSTED_PROXIES")); err != nil {
		return c, fmt.Errorf("config: TOLLGATE_TRUSTED_PROXIES: %w", err)
	}
	if c.WebhookAllowPrivate, err = strconv.ParseBool(get("TOLLGATE_WEBHOOK_ALLOW_PRIVATE")); err != nil {
		return c, fmt.Errorf("config: TOLLGATE_WEBHOOK_ALLOW_PRIVATE: %q is not true or false", get("TOLLGATE_WEBHOOK_ALLOW_PRIVATE"))
	}
	if c.ProxyMaxResponseBytes, err = strconv.ParseInt(get("TOLLGATE_PROXY_MAX_RESPONSE_BYTES"), 10, 64); err != nil || c.ProxyMaxResponseBytes < 0 {
		return c, fmt.Errorf("config: TOLLGATE_PROXY_MAX_RESPONSE_BYTES: %q must be a number of bytes, 0 for no maximum", get("TOLLGATE_PROXY_MAX_RESPONSE_BYTES"))
	}
	l := &c.IdempotencyLimits
	if l.Answers, err = strconv.ParseInt(get("TOLLGATE_IDEMPOTENCY_MAX_ANSWERS"), 10, 64); err != nil || l.Answers < 1 || l.Answers > 100_000_000 {
		return c, fmt.Errorf("config: TOLLGATE_IDEMPOTENCY_MAX_ANSWERS: %q must be a number of records between 1 and 100000000", get("TOLLGATE_IDEMPOTENCY_MAX_ANSWERS"))
	}
	// (at least one answer of the largest size fits)
	if l.Bytes, err = strconv.ParseInt(get("TOLLGATE_IDEMPOTENCY_MAX_BYTES"), 10, 64); err != nil || l.Bytes < quota.AnswerReserve || l.Bytes > 1<<40 {
		return c, fmt.Errorf("config: TOLLGATE_IDEMPOTENCY_MAX_BYTES: %q must be a number of bytes between %d and %d", get("TOLLGATE_IDEMPOTENCY_MAX_BYTES"), quota.AnswerReserve, int64(1)<<40)
	}
	if c.QueueWaiters, err = intBetween(get, "TOLLGATE_QUEUE_WAITERS", 1, 1_000_000); err != nil {
		return c, err
	}
	if c.QueueWaitersPerTenant, err = intBetween(get, "TOLLGATE_QUEUE_WAITERS_PER_TENANT", 1, c.QueueWaiters); err != nil {
		return c, err
	}
	if c.QueueWaitersPerPolicy, err = intBetween(get, "TOLLGATE_QUEUE_WAITERS_PER_POLICY", 1, c.QueueWaiters); err != nil {
		return c, err
	}
	if c.MaxConns, err = count(get, "TOLLGATE_MAX_CONNS", 1_000_000); err != nil {
		return c, err
	}
	if c.MaxConnsPerIP, err = count(get, "TOLLGATE_MAX_CONNS_PER_IP", 1_000_000); err != nil {
		return c, err
	}
	if c.ReadTimeout, err = duration(get, "TOLLGATE_READ_TIMEOUT", time.Second, 10*time.Minute); err != nil {
		return c, err
	}
	if c.IdleTimeout, err = duration(get, "TOLLGATE_IDLE_TIMEOUT", time.Second, time.Hour); err != nil {
		return c, err
	}
	if c.ProxyMaxResponseHeaderBytes, err = byteSize(get, "TOLLGATE_PROXY_MAX_RESPONSE_HEADER_BYTES", 4096, 1<<20); err != nil {
		return c, err
	}
	c.StripeKey = get("TOLLGATE_STRIPE_KEY")
	if c.StripeKey != "" && (!strings.HasPrefix(c.StripeKey, "sk_") && !strings.HasPrefix(c.StripeKey, "rk_") ||
		len(c.StripeKey) < 8 || strings.ContainsAny(c.StripeKey, " \t\r\n")) {
		return c, fmt.Errorf("config: TOLLGATE_STRIPE_KEY: must be a Stripe secret key (sk_…) or restricted key (rk_…)")
	}
	c.StripeURL = get("TOLLGATE_STRIPE_URL")
	if u, err := url.Parse(c.StripeURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return c, fmt.Errorf("config: TOLLGATE_STRIPE_URL: %q must be an http or https base URL such as https://api.stripe.com", redactURL(c.StripeURL))
	}
	c.StripeURL = strings.TrimSuffix(c.StripeURL, "/")
	if c.GRPCAddr = get("TOLLGATE_GRPC_ADDR"); c.GRPCAddr != "" {
		if err := checkListenAddr(c.GRPCAddr); err != nil {
			return c, fmt.Errorf("config: TOLLGATE_GRPC_ADDR: %w", err)
		}
		if (c.GRPCAddr == c.Addr || c.GRPCAddr == c.OpsAddr) && !strings.HasSuffix(c.GRPCAddr, ":0") {
			return c, fmt.Errorf("config: TOLLGATE_GRPC_ADDR: %q is the address of another listener of the api; give it a port of its own", c.GRPCAddr)
		}
	}
	return c, nil
}

// intBetween reads an integer variable between lo and hi.
func intBetween(get func(string) string, name string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(get(name))
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("config: %s: %q must be a whole number between %d and %d", name, get(name), lo, hi)
	}
	return n, nil
}

// ParsePrefixes parses a comma-separated list of IP addresses and CIDR
// prefixes ("10.0.0.0/8, 192.0.2.7, fd00::/8"); an address is the prefix of
// that one address. Prefixes are masked ("10.1.2.3/8" is 10.0.0.0/8) and
// IPv4-mapped IPv6 forms are read as IPv4, so that they match the addresses
// a connection reports. An empty list is nil.
func ParsePrefixes(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		var p netip.Prefix
		if strings.Contains(item, "/") {
			var err error
			if p, err = netip.ParsePrefix(item); err != nil {
				return nil, fmt.Errorf("%q is not an address or CIDR prefix", item)
			}
			if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
			}
		} else {
			a, err := netip.ParseAddr(item)
			if err != nil || a.Zone() != "" {
				return nil, fmt.Errorf("%q is not an address or CIDR prefix", item)
			}
			a = a.Unmap()
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// checkListenAddr checks an address to listen on: host:port, the port a
// number (0 picks a free one).
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q has no valid port", addr)
	}
	return nil
}

func duration(get func(string) string, name string, lo, hi time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(get(name))
	if err != nil {
		return 0, fmt.Errorf("config: %s: %q is not a Go duration such as 10s", name, get(name))
	}
	if d < lo || d > hi {
		return 0, fmt.Errorf("config: %s: %s must be between %s and %s", name, d, lo, hi)
	}
	return d, nil
}

// count reads a whole number from 0 to hi.
func count(get func(string) string, name string, hi int) (int, error) {
	n, err := strconv.Atoi(get(name))
	if err != nil || n < 0 || n > hi {
		return 0, fmt.Errorf("config: %s: %q must be a whole number from 0 to %d", name, get(name), hi)
	}
	return n, nil
}

// byteSize reads a number of bytes between lo and hi.
func byteSize(get func(string) string, name string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(get(name))
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("config: %s: %q must be a number of bytes between %d and %d", name, get(name), lo, hi)
	}
	return n, nil
}

func checkDatabaseURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return fmt.Errorf("%q must start with postgres:// or postgresql://", redactURL(raw))
	}
	if u.Host == "" && u.Query().Get("host") == "" {
		return fmt.Errorf("%q names no host", redactURL(raw))
	}
	if strings.Trim(u.Path, "/") == "" {
		return fmt.Errorf("%q names no database", redactURL(raw))
	}
	return nil
}

// redactURL hides a password in a URL before it is printed.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

func validPrefix(s string) bool {
	if len(s) == 0 || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '-' && r != '_' {
			return false
		}
	}
	return true
}

// NewLogger builds the process's slog logger, writing to w in the configured
// format and level.
func (c Config) NewLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.LogLevel}
	if c.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
