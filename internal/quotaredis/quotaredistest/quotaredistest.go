// Package quotaredistest holds the helpers that the tests of the Redis
// side share (internal/ratelimit, internal/pending, internal/settlement,
// internal/idempotency): tenants, times and limits of the tests' own,
// admission that fails the test on an error, and readers of what Redis
// holds of a tenant (its counters, pending usage and meter quotas).
//
// It imports none of the parts it helps test, so that every part's own
// tests can use it: a helper takes the parts through the small interfaces
// below, which quotaredis.Store and the parts' own joins satisfy.
//
// It is for tests only: no product code imports it (the architecture test
// holds it).
package quotaredistest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/limits"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

// Admitter admits a request (ratelimit.Runner, quotaredis.Store).
type Admitter interface {
	Admit(ctx context.Context, req quota.Request) (quota.Decision, error)
}

// Store is what the readers need of a redisfn.Store (which
// quotaredis.Store embeds): its client, key layout and functions.
type Store interface {
	Client() redis.UniversalClient
	Key(tenantID, name string) string
	StateKey(tenantID string) string
	StateKeys(tenantID string, extra ...string) []string
	PendingKeys(tenantID string) []string
	Call(ctx context.Context, f redisfn.Fn, keys []string, args ...any) *redis.Cmd
}

// NewTenant returns a random tenant id, so that tests sharing a prefix or a
// cluster land on different hash slots.
func NewTenant() string { return "tn-" + testenv.RandomHex(6) }

// MustAdmit admits req and fails the test on an error.
func MustAdmit(tb testing.TB, r Admitter, req quota.Request) quota.Decision {
	tb.Helper()
	d, err := r.Admit(context.Background(), req)
	if err != nil {
		tb.Fatalf("Admit(%+v): %v", req, err)
	}
	return d
}

// FmtDecision prints every field of d on one line, so that two decisions
// compare as strings and a mismatch shows both in full.
func FmtDecision(d quota.Decision) string {
	var b strings.Builder
	fmt.Fprintf(&b, "allowed=%t violated=%v retry=%dus overage=%d replayed=%t now=%d",
		d.Allowed, d.Violated, d.RetryAfter.Microseconds(), d.OverageUnits, d.Replayed(), d.Now.UnixMicro())
	for _, l := range d.Limits {
		fmt.Fprintf(&b, " | %s limit=%d rem=%d reset=%d window=%v", l.Name, l.Limit, l.Remaining, l.Reset.UnixMicro(), l.Window)
	}
	return b.String()
}

// At parses an RFC 3339 time; the tests' times are literals.
func At(tb testing.TB, s string) time.Time {
	tb.Helper()
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		tb.Fatalf("bad time %q: %v", s, err)
	}
	return t
}

// I64 returns a pointer to v.
func I64(v int64) *int64 { return &v }

// F64 returns a pointer to v.
func F64(v float64) *float64 { return &v }

// AllLimits are four active limits that admit a handful of requests.
func AllLimits() quota.Limits {
	return quota.Limits{
		BurstRate: F64(10), Burst: I64(5),
		BucketCapacity: I64(20), BucketRefillPerSec: F64(5),
		DailyQuota: I64(100), MonthlyQuota: I64(1000),
	}
}

// LimitOf returns the named limit of d, failing the test when it is absent.
func LimitOf(tb testing.TB, d quota.Decision, name quota.LimitName) quota.LimitState {
	tb.Helper()
	l, ok := d.Limit(name)
	if !ok {
		tb.Fatalf("decision has no limit %q: %s", name, FmtDecision(d))
	}
	return l
}

// TenantsOnDistinctMasters returns n tenant ids whose keys live on n
// different masters.
func TenantsOnDistinctMasters(tb testing.TB, c redis.UniversalClient, n int) []string {
	tb.Helper()
	cc := c.(*redis.ClusterClient)
	seen := map[string]bool{}
	var tenants []string
	for tries := 0; len(tenants) < n; tries++ {
		if tries > 1000 {
			tb.Fatalf("found tenants on only %d masters, want %d", len(tenants), n)
		}
		tenant := NewTenant()
		node, err := cc.MasterForKey(context.Background(), "x:v1:{t:"+tenant+"}:gcra")
		if err != nil {
			tb.Fatalf("MasterForKey: %v", err)
		}
		if addr := node.Options().Addr; !seen[addr] {
			seen[addr] = true
			tenants = append(tenants, tenant)
		}
	}
	return tenants
}

// Counters are the counters of a tenant's hash (lua/state.lua) in
// the tests' terms.
type Counters struct {
	TAT, Full  int64
	Day, Month Period
}

// Period is a quota period's counters. ID is the day since the epoch or
// year*100+month.
type Period struct {
	ID, Used, Grant, Overage int64
}

// StateOf reads a tenant's counters from its v2 hash.
func StateOf(tb testing.TB, c redis.UniversalClient, r Store, tenant string) Counters {
	tb.Helper()
	s := RedisState(tb, c, r, tenant)
	if !s.Exists {
		return Counters{}
	}
	return Counters{TAT: s.TAT, Full: s.Full,
		Day:   Period{ID: s.Day, Used: s.DayUsed, Grant: s.DayGrant},
		Month: Period{ID: s.Month, Used: s.MonthUsed, Grant: s.MonthGrant, Overage: s.MonthOver}}
}

// RedisState reads everything Redis holds of a tenant as a limits.State:
// its hash, the v1 pending hash (whose fields are the hash's "p" fields
// while the tenant has no state: a refusal's count), the meter quotas'
// hash, and the idempotency records of keys.
func RedisState(tb testing.TB, c redis.UniversalClient, r Store, tenant string, keys ...string) limits.State {
	tb.Helper()
	ctx := context.Background()
	tenantHash, err := c.HGetAll(ctx, r.StateKey(tenant)).Result()
	if err != nil {
		tb.Fatalf("HGETALL state: %v", err)
	}
	pending, err := c.HGetAll(ctx, r.Key(tenant, "pending")).Result()
	if err != nil {
		tb.Fatalf("HGETALL pending: %v", err)
	}
	for f, v := range pending {
		f = "p" + f
		if old, ok := tenantHash[f]; ok {
			var a, b int64
			if _, err := fmt.Sscan(old, &a); err != nil {
				tb.Fatalf("pending field %s: %q: %v", f, old, err)
			}
			if _, err := fmt.Sscan(v, &b); err != nil {
				tb.Fatalf("pending field %s: %q: %v", f, v, err)
			}
			v = fmt.Sprint(a + b)
		}
		tenantHash[f] = v
	}
	meters, err := c.HGetAll(ctx, r.Key(tenant, "mq")).Result()
	if err != nil {
		tb.Fatalf("HGETALL meters: %v", err)
	}
	idem := map[string]map[string]string{}
	for _, k := range keys {
		h := redisfn.IdemHash(k)
		rec, err := c.HGetAll(ctx, r.Key(tenant, "idem2:"+h)).Result()
		if err != nil {
			tb.Fatalf("HGETALL idem: %v", err)
		}
		if len(rec) > 0 {
			idem[h] = rec
		}
	}
	s, err := limits.Parse(tenantHash, meters, idem)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// PendingFields returns a tenant's pending usage fields, wherever they live
// (lua/pending.lua), as "<hour>|<meter>|<kind>" -> count.
func PendingFields(tb testing.TB, r Store, tenant string) map[string]int64 {
	tb.Helper()
	flat, err := r.Call(context.Background(), redisfn.FnPending, r.PendingKeys(tenant), "get").StringSlice()
	if err != nil {
		tb.Fatalf("pending of %s: %v", tenant, err)
	}
	out := map[string]int64{}
	for j := 0; j+1 < len(flat); j += 2 {
		f, v := flat[j], flat[j+1]
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			tb.Fatalf("pending field %s=%q: %v", f, v, err)
		}
		out[f] = n
	}
	return out
}

// PendingAt is a tenant's pending count of kind (u, r, o, m, ...) for meter
// in the hour of t.
func PendingAt(tb testing.TB, r Store, tenant string, t time.Time, meter, kind string) int64 {
	tb.Helper()
	return PendingFields(tb, r, tenant)[fmt.Sprintf("%d|%s|%s", t.Truncate(time.Hour).Unix(), meter, kind)]
}

// MeterCounters reads a meter's field "d,du,m,mu,mo" of the meter quotas'
// hash: day id and units, month id, units and overage units (zeros when
// absent).
func MeterCounters(tb testing.TB, r Store, tenant, meter string) [5]int64 {
	tb.Helper()
	var f [5]int64
	v, err := r.Client().HGet(context.Background(), r.Key(tenant, "mq"), meter).Result()
	if errors.Is(err, redis.Nil) {
		return f
	}
	if err != nil {
		tb.Fatal(err)
	}
	parts := strings.Split(v, ",")
	if len(parts) != len(f) {
		tb.Fatalf("meter field %s=%q: want 5 numbers", meter, v)
	}
	for i, p := range parts {
		if f[i], err = strconv.ParseInt(p, 10, 64); err != nil {
			tb.Fatalf("meter field %s=%q: %v", meter, v, err)
		}
	}
	return f
}

// MonthBefore reads the tenant's month before (state.lua's field w:
// "m,mu,mg,mo").
func MonthBefore(tb testing.TB, r Store, tenant string) string {
	tb.Helper()
	w, err := r.Client().HGet(context.Background(), r.StateKeys(tenant)[0], "w").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		tb.Fatal(err)
	}
	return w
}

// MeterHash reads fields of the tenant's meter quotas' hash ("" when absent).
func MeterHash(tb testing.TB, r Store, tenant string, fields ...string) []string {
	tb.Helper()
	v, err := r.Client().HMGet(context.Background(), r.Key(tenant, "mq"), fields...).Result()
	if err != nil {
		tb.Fatal(err)
	}
	out := make([]string, len(v))
	for i, x := range v {
		if s, ok := x.(string); ok {
			out[i] = s
		}
	}
	return out
}

// WantMonths checks what Redis holds of the tenant's months (in the
// test's terms): the tier's month before (w), search's month before
// ("search|w"), the meters' overage millicents ('$w', '$') and search's
// field as [month, units, overage].
func WantMonths(tb testing.TB, r Store, tenant, when, w string, mq [3]string, search [3]int64) {
	tb.Helper()
	if got := MonthBefore(tb, r, tenant); got != w {
		tb.Errorf("%s: the tier's month before %q, want %q", when, got, w)
	}
	if got := MeterHash(tb, r, tenant, "search|w", "$w", "$"); [3]string(got) != mq {
		tb.Errorf("%s: search|w, $w, $ = %q, want %q", when, got, mq)
	}
	if f := MeterCounters(tb, r, tenant, "search"); [3]int64{f[2], f[3], f[4]} != search {
		tb.Errorf("%s: search's counters %v, want month, units, overage %v", when, f, search)
	}
}

// OnPrefix returns join's parts on c under a key prefix of the test's own,
// whose keys are deleted at cleanup: OnPrefix(t, c, quotaredis.New).
func OnPrefix[T any](tb testing.TB, c redis.UniversalClient, join func(redis.UniversalClient, string) T) T {
	tb.Helper()
	return join(c, testenv.Prefix(tb, c))
}
