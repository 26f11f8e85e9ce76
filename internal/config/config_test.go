package config

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadDefaults(t *testing.T) {
	c, err := Load(env(nil))
	if err != nil {
		t.Fatalf("Load(empty) = %v, want defaults", err)
	}
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"Addr", c.Addr, "127.0.0.1:8080"},
		{"ReconcileInterval", c.ReconcileInterval, 10 * time.Second},
		{"RedisAddrs", c.Redis.Addrs[0], "127.0.0.1:6379"},
		{"Cluster", c.Redis.IsClusterMode, false},
		{"LogFormat", c.LogFormat, "json"},
		{"AdminToken", c.AdminToken, ""},
		{"RedisPrefix", c.RedisPrefix, "tg"},
		{"SessionTTL", c.SessionTTL, 8 * time.Hour},
		{"TrustedProxies", len(c.TrustedProxies), 0},
		{"WebhookAllowPrivate", c.WebhookAllowPrivate, false},
		{"ProxyMaxResponseBytes", c.ProxyMaxResponseBytes, int64(0)},
		{"IdempotencyLimits", c.IdempotencyLimits, quota.DefaultAnswerLimits},
		{"QueueWaiters", c.QueueWaiters, 1024},
		{"QueueWaitersPerTenant", c.QueueWaitersPerTenant, 64},
		{"QueueWaitersPerPolicy", c.QueueWaitersPerPolicy, 512},
		{"ProxyMaxResponseHeaderBytes", c.ProxyMaxResponseHeaderBytes, 65536},
		{"MaxConns", c.MaxConns, 0},
		{"MaxConnsPerIP", c.MaxConnsPerIP, 512},
		{"ReadTimeout", c.ReadTimeout, 30 * time.Second},
		{"IdleTimeout", c.IdleTimeout, 120 * time.Second},
		{"StripeKey", c.StripeKey, ""},
		{"StripeURL", c.StripeURL, "https://api.stripe.com"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestLoadCluster(t *testing.T) {
	c, err := Load(env(map[string]string{"REDIS_URL": "redis://127.0.0.1:7000, 127.0.0.1:7001,127.0.0.1:7002"}))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Redis.IsClusterMode || len(c.Redis.Addrs) != 3 || c.Redis.Addrs[1] != "127.0.0.1:7001" {
		t.Fatalf("got cluster=%t addrs=%v, want cluster of 3", c.Redis.IsClusterMode, c.Redis.Addrs)
	}
}

// TestLoadNamesTheBadVariable checks that every invalid value is refused with
// an error naming its variable.
func TestLoadNamesTheBadVariable(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"DATABASE_URL", "nonsense"},
		{"DATABASE_URL", "mysql://localhost/db"},
		{"DATABASE_URL", "postgres://localhost"},
		{"REDIS_URL", "http://[::1"},
		{"REDIS_URL", "redis://a:1,,redis://b:2"},
		{"REDIS_URL", "redis://a:1/3,redis://b:2"},
		{"TOLLGATE_ADDR", "nonsense"},
		{"TOLLGATE_ADDR", "127.0.0.1:99999"},
		{"TOLLGATE_ADMIN_TOKEN", "short"},
		{"TOLLGATE_SERVICE_TOKEN", "short"},
		{"TOLLGATE_RECONCILE_INTERVAL", "often"},
		{"TOLLGATE_RECONCILE_INTERVAL", "1ms"},
		{"TOLLGATE_RECONCILE_INTERVAL", "-5s"},
		{"TOLLGATE_LOG_LEVEL", "loud"},
		{"TOLLGATE_LOG_FORMAT", "xml"},
		{"TOLLGATE_REDIS_PREFIX", "has space"},
		{"TOLLGATE_BODY_LIMIT", "-1"},
		{"TOLLGATE_BODY_LIMIT", "lots"},
		{"TOLLGATE_SHUTDOWN_TIMEOUT", "forever"},
		{"TOLLGATE_INVOICE_GRACE", "1y"},
		{"TOLLGATE_SESSION_TTL", "1m"},
		{"TOLLGATE_SESSION_TTL", "always"},
		{"TOLLGATE_USAGE_RETENTION", "1"},
		{"TOLLGATE_USAGE_RETENTION", "-3"},
		{"TOLLGATE_USAGE_RETENTION", "13mo"},
		{"TOLLGATE_USAGE_RETENTION", "1201"},
		{"TOLLGATE_TRUSTED_PROXIES", "proxy.internal"},
		{"TOLLGATE_TRUSTED_PROXIES", "10.0.0.1, 10.0.0.0/33"},
		{"TOLLGATE_TRUSTED_PROXIES", "fe80::1%eth0"},
		{"TOLLGATE_WEBHOOK_ALLOW_PRIVATE", "yes please"},
		{"TOLLGATE_PROXY_MAX_RESPONSE_BYTES", "-1"},
		{"TOLLGATE_PROXY_MAX_RESPONSE_BYTES", "1MB"},
		{"TOLLGATE_PROXY_MAX_RESPONSE_BYTES", "99999999999999999999"},
		{"TOLLGATE_IDEMPOTENCY_MAX_ANSWERS", "0"},
		{"TOLLGATE_IDEMPOTENCY_MAX_ANSWERS", "many"},
		{"TOLLGATE_IDEMPOTENCY_MAX_BYTES", "1048576"},
		{"TOLLGATE_IDEMPOTENCY_MAX_BYTES", "64MiB"},
		{"TOLLGATE_QUEUE_WAITERS", "0"},
		{"TOLLGATE_QUEUE_WAITERS", "many"},
		{"TOLLGATE_QUEUE_WAITERS_PER_TENANT", "0"},
		{"TOLLGATE_QUEUE_WAITERS_PER_TENANT", "1025"}, // past the node's 1024
		{"TOLLGATE_QUEUE_WAITERS_PER_POLICY", "-3"},
		{"TOLLGATE_QUEUE_WAITERS_PER_POLICY", "2000"},
		{"TOLLGATE_PROXY_MAX_RESPONSE_HEADER_BYTES", "4095"},
		{"TOLLGATE_PROXY_MAX_RESPONSE_HEADER_BYTES", "1048577"},
		{"TOLLGATE_PROXY_MAX_RESPONSE_HEADER_BYTES", "64KiB"},
		{"TOLLGATE_MAX_CONNS", "-1"},
		{"TOLLGATE_MAX_CONNS", "many"},
		{"TOLLGATE_MAX_CONNS", "1000001"},
		{"TOLLGATE_MAX_CONNS_PER_IP", "-5"},
		{"TOLLGATE_MAX_CONNS_PER_IP", "1e3"},
		{"TOLLGATE_READ_TIMEOUT", "0s"},
		{"TOLLGATE_READ_TIMEOUT", "11m"},
		{"TOLLGATE_READ_TIMEOUT", "soon"},
		{"TOLLGATE_IDLE_TIMEOUT", "500ms"},
		{"TOLLGATE_IDLE_TIMEOUT", "2h"},
		{"TOLLGATE_STRIPE_KEY", "pk_test_publishable"},
		{"TOLLGATE_STRIPE_KEY", "sk_"},
		{"TOLLGATE_STRIPE_KEY", "sk_test_has space"},
		{"TOLLGATE_STRIPE_URL", "api.stripe.com"},
		{"TOLLGATE_STRIPE_URL", "ftp://api.stripe.com"},
		{"TOLLGATE_STRIPE_URL", "https://user:secret@api.stripe.com"},
		{"TOLLGATE_STRIPE_URL", "https://"},
		{"TOLLGATE_GRPC_ADDR", "nowhere"},
		{"TOLLGATE_GRPC_ADDR", "127.0.0.1:70000"},
		{"TOLLGATE_GRPC_ADDR", "127.0.0.1:8080"}, // TOLLGATE_ADDR's default
	} {
		_, err := Load(env(map[string]string{tc.name: tc.value}))
		if err == nil {
			t.Errorf("%s=%q: got no error, want one naming %s", tc.name, tc.value, tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s=%q: got %q, want it to name %s", tc.name, tc.value, err, tc.name)
		}
	}
}

func TestLoadTrustedProxiesAndWebhooks(t *testing.T) {
	c, err := Load(env(map[string]string{
		"TOLLGATE_TRUSTED_PROXIES":       " 10.1.2.3/8,192.0.2.7 ,, ::ffff:198.51.100.1, fd00::/8, ::ffff:203.0.113.0/120",
		"TOLLGATE_WEBHOOK_ALLOW_PRIVATE": "true",
	}))
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(c.TrustedProxies)
	if want := "[10.0.0.0/8 192.0.2.7/32 198.51.100.1/32 fd00::/8 203.0.113.0/24]"; got != want {
		t.Errorf("TrustedProxies = %s, want %s", got, want)
	}
	if !c.WebhookAllowPrivate {
		t.Error("WebhookAllowPrivate = false, want true")
	}
}

// FuzzParsePrefixes: any list either parses into valid, masked prefixes of
// unmapped addresses, or is refused; it never panics.
func FuzzParsePrefixes(f *testing.F) {
	for _, seed := range []string{"", "10.0.0.0/8, 192.0.2.7", "::ffff:10.0.0.1/104", "fe80::1%eth0", "1.2.3.4/", ",,", "::/0"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, list string) {
		ps, err := ParsePrefixes(list)
		if err != nil {
			return
		}
		for _, p := range ps {
			if !p.IsValid() || p != p.Masked() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
				t.Fatalf("ParsePrefixes(%q) gave %v", list, p)
			}
		}
	})
}

func TestLoadRedactsPassword(t *testing.T) {
	_, err := Load(env(map[string]string{"DATABASE_URL": "postgres://u:hunter2@db"}))
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("got %v, want an error without the password", err)
	}
}

func TestVarsHaveMeanings(t *testing.T) {
	for _, v := range Vars {
		if v.Meaning == "" {
			t.Errorf("%s has no meaning", v.Name)
		}
	}
}

// TestLoadRefusesTheV1Layout: the limit state's v1 layout is gone, so a
// node started with the setting of a rolling upgrade from it
// (TOLLGATE_KEY_LAYOUT=v1) refuses to start instead of ignoring the state
// that layout holds; v2, the only layout, is accepted and changes nothing.
func TestLoadRefusesTheV1Layout(t *testing.T) {
	for _, v := range []string{"v1", "v3"} {
		_, err := Load(env(map[string]string{"TOLLGATE_KEY_LAYOUT": v}))
		if err == nil || !strings.Contains(err.Error(), "TOLLGATE_KEY_LAYOUT") {
			t.Errorf("TOLLGATE_KEY_LAYOUT=%s: got %v, want an error naming it", v, err)
		}
	}
	if _, err := Load(env(map[string]string{"TOLLGATE_KEY_LAYOUT": "v2"})); err != nil {
		t.Errorf("TOLLGATE_KEY_LAYOUT=v2: %v", err)
	}
}

func TestLoadStripe(t *testing.T) {
	c, err := Load(env(map[string]string{"TOLLGATE_STRIPE_KEY": "sk_test_123456", "TOLLGATE_STRIPE_URL": "http://127.0.0.1:12111/"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.StripeKey != "sk_test_123456" || c.StripeURL != "http://127.0.0.1:12111" {
		t.Fatalf("StripeKey, StripeURL = %q, %q; want the key and the URL without its trailing slash", c.StripeKey, c.StripeURL)
	}
	_, err = Load(env(map[string]string{"TOLLGATE_STRIPE_URL": "https://user:secret@api.stripe.com"}))
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("a URL with a password: %v, want an error that does not print the password", err)
	}
}

func TestLoadGRPCAddr(t *testing.T) {
	c, err := Load(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.GRPCAddr != "" {
		t.Errorf("GRPCAddr by default = %q, want empty (off)", c.GRPCAddr)
	}
	if c, err = Load(env(map[string]string{"TOLLGATE_GRPC_ADDR": "127.0.0.1:8081"})); err != nil || c.GRPCAddr != "127.0.0.1:8081" {
		t.Errorf("GRPCAddr = %q, %v, want 127.0.0.1:8081", c.GRPCAddr, err)
	}
}

func TestLoadUsageRetention(t *testing.T) {
	c, err := Load(env(nil))
	if err != nil || c.UsageRetentionMonths != 0 {
		t.Fatalf("UsageRetentionMonths by default = %d, %v, want 0 (keep all)", c.UsageRetentionMonths, err)
	}
	for _, v := range []string{"3", "13", "1200"} {
		c, err := Load(env(map[string]string{"TOLLGATE_USAGE_RETENTION": v}))
		if err != nil || fmt.Sprint(c.UsageRetentionMonths) != v {
			t.Errorf("TOLLGATE_USAGE_RETENTION=%s: %d, %v", v, c.UsageRetentionMonths, err)
		}
	}
}
