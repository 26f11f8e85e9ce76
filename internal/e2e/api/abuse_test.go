package api

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// Abuse of the credentials and of the webhook target, through the real
// server: failed-attempt limits per client address and realm, the client
// address behind trusted proxies, and webhook URLs that point inside.

// startKeyed starts an API of its own with extra variables and returns it
// with a tenant on a roomy tier and the tenant's key.
func startKeyed(tb testing.TB, extra map[string]string) (base string, tenant quota.Tenant, key string) {
	tb.Helper()
	s := mustStack(tb)
	base = s.startWith(extra)
	tier := s.tier(1, quota.Limits{DailyQuota: quota.Ptr(int64(1000))})
	tenant, key = s.tenant(tier.Slug)
	return base, tenant, key
}

// raw sends one request written by hand on its own connection, as a client
// that sets whatever headers it likes (several X-Forwarded-For lines, say):
// a request line, then header lines; the body, if any, follows a "" line.
func raw(tb testing.TB, base string, lines ...string) reply {
	tb.Helper()
	head, body, _ := strings.Cut(strings.Join(lines, "\r\n"), "\r\n\r\n")
	return rawRequest(tb, base, head+"\r\nHost: tollgate.test\r\nConnection: close\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
}

// rawRequest sends req, a whole request framed by hand, on a connection of
// its own and reads the answer.
func rawRequest(tb testing.TB, base, req string) reply {
	tb.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		tb.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		tb.Fatalf("reading the answer to %q: %v", strings.SplitN(req, "\r\n", 2)[0], err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

// badKey returns a well-formed API key that no tenant has, with a prefix of
// its own for each i: a cache miss on every try, as a guesser's would be.
func badKey(i int) string {
	prefix := []byte("aaaaaaaa")
	for p := len(prefix) - 1; i > 0; p, i = p-1, i/26 {
		prefix[p] = byte('a' + i%26)
	}
	return "tg_" + string(prefix) + "_" + strings.Repeat("Z", 40)
}

// mustBeLimited checks a refusal of the failed-attempt limit: 429,
// problem+json and a Retry-After of at least a second.
func mustBeLimited(tb testing.TB, what string, r reply) {
	tb.Helper()
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if r.status != 429 || err != nil || ra < 1 || r.header.Get("Content-Type") != "application/problem+json" {
		tb.Fatalf("%s: %d, Retry-After %q, Content-Type %q, want 429 problem+json with Retry-After ≥ 1: %s",
			what, r.status, r.header.Get("Retry-After"), r.header.Get("Content-Type"), r.body)
	}
}

// failUntilLimited sends try(i) until it is refused with 429, and checks that
// the first 20 failures were answered 401 (the limit's burst) and that the
// limit came within 30.
func failUntilLimited(tb testing.TB, what string, try func(i int) reply) reply {
	tb.Helper()
	for i := range 30 {
		r := try(i)
		if r.status == 429 {
			if i < 20 {
				tb.Fatalf("%s: limited after %d failures, want 20 allowed", what, i)
			}
			mustBeLimited(tb, what, r)
			return r
		}
		if r.status != 401 {
			tb.Fatalf("%s %d: %d, want 401: %s", what, i, r.status, r.body)
		}
	}
	tb.Fatalf("%s: 30 failures from one address were never limited", what)
	return reply{}
}

// TestValidKeyWorksAfterBadKeys: 40 bad keys from one address are limited,
// yet a valid key from that address still goes through, to the API and to
// the dashboard's sign-in, while bad keys stay refused.
func TestValidKeyWorksAfterBadKeys(t *testing.T) {
	t.Parallel()
	base, _, key := startKeyed(t, nil)

	var statuses []int
	for i := range 40 {
		r := raw(t, base, "GET /api/demo/echo HTTP/1.1", "Authorization: Bearer "+badKey(i))
		statuses = append(statuses, r.status)
		if i < 20 && r.status != 401 {
			t.Fatalf("bad key %d: %d, want 401 (within the burst of 20): %s", i, r.status, r.body)
		}
		if i == 39 {
			mustBeLimited(t, "the 40th bad key", r)
		}
	}
	t.Logf("statuses of 40 bad keys: %v", statuses)

	if r := do(t, "GET", base+"/api/demo/echo", key, ""); r.status != 200 {
		t.Fatalf("a valid key after 40 bad ones from the same address: %d, want 200: %s", r.status, r.body)
	}
	if r := raw(t, base, "GET /api/demo/echo HTTP/1.1", "X-API-Key: "+key); r.status != 200 {
		t.Fatalf("a valid X-API-Key after 40 bad ones: %d, want 200: %s", r.status, r.body)
	}
	// The success does not wipe the failures: the next bad key is refused.
	mustBeLimited(t, "a bad key after a good one", raw(t, base, "GET /api/demo/echo HTTP/1.1", "Authorization: Bearer "+badKey(41)))
	mustBeLimited(t, "no key at all", raw(t, base, "GET /v1/usage HTTP/1.1"))

	// The dashboard's sign-in counts in the same realm: a wrong key is
	// refused with 429 now, the right one signs in.
	web := newWebClient(t, base)
	if r := web.signIn("dashboard", badKey(42)); r.status != 429 || r.header.Get("Retry-After") == "" {
		t.Errorf("a wrong key at the sign-in form while limited: %d (Retry-After %q), want 429", r.status, r.header.Get("Retry-After"))
	}
	web.mustSignIn("dashboard", key)
}

// TestSpoofedForwardedForIsIgnored: a client that connects directly gets no
// say in its address, whatever X-Forwarded-For it sends, when no proxy is
// trusted and when only another address is.
func TestSpoofedForwardedForIsIgnored(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	for _, trusted := range []string{"", "10.9.9.9, 192.0.2.0/24"} {
		t.Run("trusted="+trusted, func(t *testing.T) {
			base := s.startWith(map[string]string{"TOLLGATE_TRUSTED_PROXIES": trusted})
			failUntilLimited(t, "spoofed bad key", func(i int) reply {
				return raw(t, base, "GET /api/demo/echo HTTP/1.1", "Authorization: Bearer "+badKey(i),
					fmt.Sprintf("X-Forwarded-For: 198.51.100.%d", i),
					fmt.Sprintf("X-Forwarded-For: 203.0.113.%d, 10.9.9.9", i),
					fmt.Sprintf("X-Real-IP: 198.51.100.%d", i), fmt.Sprintf("Forwarded: for=198.51.100.%d", i))
			})
		})
	}
}

// TestTrustedProxyClientsLimitedSeparately: behind a trusted proxy (here
// 127.0.0.1, the tests' own address) the client is the right-most address
// of X-Forwarded-For that is not a trusted proxy; two clients are limited
// apart, and a client cannot escape by prepending addresses.
func TestTrustedProxyClientsLimitedSeparately(t *testing.T) {
	t.Parallel()
	base, _, key := startKeyed(t, map[string]string{"TOLLGATE_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8"})
	get := func(key string, xff ...string) reply {
		lines := []string{"GET /api/demo/echo HTTP/1.1", "Authorization: Bearer " + key}
		for _, x := range xff {
			lines = append(lines, "X-Forwarded-For: "+x)
		}
		return raw(t, base, lines...)
	}

	// Client A, seen through two proxies, prepends a new address every time.
	failUntilLimited(t, "client A", func(i int) reply {
		return get(badKey(i), fmt.Sprintf("198.51.100.%d, 203.0.113.7", i), "10.1.2.3")
	})
	mustBeLimited(t, "client A through one proxy", get(badKey(50), "203.0.113.7"))
	mustBeLimited(t, "client A with an IPv4-mapped address", get(badKey(51), "::ffff:203.0.113.7"))
	if r := get(key, "203.0.113.7"); r.status != 200 {
		t.Errorf("client A's valid key: %d, want 200: %s", r.status, r.body)
	}
	// Client B, behind the same proxy, is not limited by A's failures.
	if r := get(badKey(52), "203.0.113.8"); r.status != 401 {
		t.Errorf("client B's first bad key: %d, want 401 (A's failures are not B's): %s", r.status, r.body)
	}
	// The proxy's own requests (no X-Forwarded-For) are the proxy's.
	if r := get(badKey(53)); r.status != 401 {
		t.Errorf("the proxy's own bad key: %d, want 401: %s", r.status, r.body)
	}
}

// TestBearerTokenFailuresLimited: wrong admin and service tokens are limited
// per address like API keys, each realm on its own. While an address is
// limited, even the right token is refused from it: a token may be short
// enough to guess, and a limit that still answers "right" would not slow
// guessing at all. Other addresses are unaffected.
func TestBearerTokenFailuresLimited(t *testing.T) {
	t.Parallel()
	base, tenant, key := startKeyed(t, map[string]string{"TOLLGATE_TRUSTED_PROXIES": "127.0.0.1"})
	checkBody := `{"tenant_id": "` + tenant.ID + `", "meter": "m", "cost": 1, "dry_run": true}`
	for _, tc := range []struct {
		realm, token string
		send         func(token, client string) reply
	}{
		{"admin", adminToken, func(token, client string) reply {
			return raw(t, base, "GET /admin/v1/tiers HTTP/1.1", "Authorization: Bearer "+token, "X-Forwarded-For: "+client)
		}},
		{"service", serviceToken, func(token, client string) reply {
			return raw(t, base, "POST /v1/check HTTP/1.1", "Authorization: Bearer "+token, "X-Forwarded-For: "+client,
				"Content-Type: application/json", "", checkBody)
		}},
	} {
		t.Run(tc.realm, func(t *testing.T) {
			attacker, other := "198.51.100.1", "198.51.100.2"
			if tc.realm == "service" {
				attacker, other = "198.51.100.3", "198.51.100.4"
			}
			failUntilLimited(t, "wrong "+tc.realm+" token", func(i int) reply {
				return tc.send(fmt.Sprintf("wrong-%s-token-%04d", tc.realm, i), attacker)
			})
			mustBeLimited(t, "the right "+tc.realm+" token from the limited address", tc.send(tc.token, attacker))
			if r := tc.send(tc.token, other); r.status != 200 {
				t.Errorf("the right %s token from another address: %d, want 200: %s", tc.realm, r.status, r.body)
			}
			// Realms are apart: the limited address still uses its API key.
			if r := raw(t, base, "GET /api/demo/echo HTTP/1.1", "Authorization: Bearer "+key, "X-Forwarded-For: "+attacker); r.status != 200 {
				t.Errorf("an API key from the address limited for %s tokens: %d, want 200", tc.realm, r.status)
			}
			if r := raw(t, base, "GET /api/demo/echo HTTP/1.1", "Authorization: Bearer "+badKey(1), "X-Forwarded-For: "+attacker); r.status != 401 {
				t.Errorf("a bad API key from the address limited for %s tokens: %d, want 401", tc.realm, r.status)
			}
		})
	}
}

// TestConsoleSignInSharesTheAdminRealm: the console's sign-in guesses the
// same secret as the admin API, so their failures add up; failed API keys
// from the address do not stop the admin.
func TestConsoleSignInSharesTheAdminRealm(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.startWith(nil)
	for i := range 40 {
		raw(t, base, "GET /api/demo/echo HTTP/1.1", "Authorization: Bearer "+badKey(i))
	}
	if r := admin(t, "GET", base+"/admin/v1/tiers", ""); r.status != 200 {
		t.Fatalf("the admin token after 40 bad API keys from its address: %d, want 200: %s", r.status, r.body)
	}
	newWebClient(t, base).mustSignIn("console", adminToken)

	failUntilLimited(t, "wrong admin token", func(i int) reply {
		return do(t, "GET", base+"/admin/v1/tiers", fmt.Sprintf("wrong-admin-token-%04d", i), "")
	})
	if r := newWebClient(t, base).signIn("console", adminToken); r.status != 429 || r.header.Get("Retry-After") == "" {
		t.Errorf("console sign-in from an address limited by the admin API: %d (Retry-After %q), want 429",
			r.status, r.header.Get("Retry-After"))
	}
}

// privateWebhooks are webhook URLs that reach the service's own network.
var privateWebhooks = []string{
	"http://127.0.0.1/", "http://169.254.169.254/latest", "http://[::1]/", "http://10.0.0.1/", "http://localhost/",
	"https://LOCALHOST.:8443/x", "http://api.localhost/", "http://127.1/", "http://2130706433/", "http://0x7f000001/",
	"http://0.0.0.0/", "http://[::]/", "http://[::ffff:127.0.0.1]/", "http://[::ffff:a9fe:a9fe]/", "http://172.16.0.1/",
	"http://192.168.1.1/", "http://100.64.0.1/", "http://[fd00::1]/", "http://[fe80::1%25eth0]/", "http://224.0.0.1/",
	"http://[64:ff9b::a00:1]/",
}

// TestWebhookURLMustBePublic: creating or patching a tenant with a webhook
// URL on loopback, link-local or private addresses is refused naming
// webhook_url, unless TOLLGATE_WEBHOOK_ALLOW_PRIVATE is set.
func TestWebhookURLMustBePublic(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	base := s.startWith(nil)
	r := admin(t, "POST", base+"/admin/v1/tenants", `{"name": "Public", "tier": "free", "webhook_url": "https://hooks.example.com/tollgate"}`)
	if r.status != 201 {
		t.Fatalf("create with a public webhook: %d %s", r.status, r.body)
	}
	id := r.json(t)["id"].(string)
	for _, u := range privateWebhooks {
		r := admin(t, "POST", base+"/admin/v1/tenants", `{"name": "Inside `+testenv.RandomHex(3)+`", "tier": "free", "webhook_url": "`+u+`"}`)
		if r.status != 400 || r.json(t)["field"] != "webhook_url" || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("create with webhook %s: %d %s, want 400 naming webhook_url", u, r.status, r.body)
		}
		r = admin(t, "PATCH", base+"/admin/v1/tenants/"+id, `{"webhook_url": "`+u+`"}`)
		if r.status != 400 || r.json(t)["field"] != "webhook_url" {
			t.Errorf("patch to webhook %s: %d %s, want 400 naming webhook_url", u, r.status, r.body)
		}
	}
	if got, err := s.store.Tenant(context.Background(), id); err != nil || got.WebhookURL != "https://hooks.example.com/tollgate" {
		t.Fatalf("after the refused patches: webhook %q, %v, want it unchanged", got.WebhookURL, err)
	}
	// A URL stored before this check does not block other changes; the
	// worker refuses to send to it.
	if _, err := s.pool.Exec(context.Background(), `UPDATE tenants SET webhook_url = 'http://127.0.0.1/' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if r := admin(t, "PATCH", base+"/admin/v1/tenants/"+id, `{"name": "Renamed `+testenv.RandomHex(3)+`"}`); r.status != 200 {
		t.Errorf("rename of a tenant with an old private webhook: %d %s, want 200", r.status, r.body)
	}

	allowed := s.startWith(map[string]string{"TOLLGATE_WEBHOOK_ALLOW_PRIVATE": "true"})
	if r := admin(t, "POST", allowed+"/admin/v1/tenants", `{"name": "Lab", "tier": "free", "webhook_url": "http://127.0.0.1:9000/hook"}`); r.status != 201 {
		t.Errorf("with TOLLGATE_WEBHOOK_ALLOW_PRIVATE=true, a loopback webhook: %d %s, want 201", r.status, r.body)
	}
}
