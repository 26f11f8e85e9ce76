package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPeriodsMatchGo holds the scripts' calendar (lua/state.lua: days since
// the epoch to year and month, and back) to Go's time package: for fixed
// edge dates and random instants from 1970 to 2250, grant.lua must report
// the period id and next period start that Go computes.
func TestPeriodsMatchGo(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t, c)
	ctx := context.Background()
	instants := []time.Time{
		time.UnixMicro(1), time.Unix(86399, 999999000), time.Unix(86400, 0),
		at(t, "2000-02-29T23:59:59.999999Z"), at(t, "2000-03-01T00:00:00Z"),
		at(t, "2100-02-28T23:59:59.999999Z"), at(t, "2100-03-01T00:00:00Z"),
		at(t, "2024-02-29T12:00:00Z"), at(t, "2024-12-31T23:59:59.999999Z"), at(t, "2025-01-01T00:00:00Z"),
		at(t, "2200-12-31T23:59:59Z"), at(t, "2250-01-31T00:00:00Z"),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		instants = append(instants, time.UnixMicro(1+rng.Int64N(at(t, "2250-01-01T00:00:00Z").UnixMicro())))
	}
	for i, now := range instants {
		u := now.UTC()
		for _, tc := range []struct {
			period     string
			id         int64
			nextPeriod time.Time
		}{
			{"day", u.Unix() / 86400, quota.DayStart(u).AddDate(0, 0, 1)},
			{"month", int64(u.Year())*100 + int64(u.Month()), quota.MonthStart(u).AddDate(0, 1, 0)},
		} {
			r := newStack(c, prefix)
			keys := r.StateKeys(fmt.Sprintf("cal-%s-%d", tc.period, i))
			got, err := r.Call(ctx, redisfn.FnGrant, keys, now.UnixMicro(), tc.period, 1).Int64Slice()
			if err != nil {
				t.Fatalf("grant.lua at %v: %v", u, err)
			}
			if got[0] != tc.id || got[4] != tc.nextPeriod.UnixMicro() {
				t.Errorf("%s at %v: got id %d, next %v; want %d, %v", tc.period, u.Format(time.RFC3339Nano),
					got[0], time.UnixMicro(got[4]).UTC(), tc.id, tc.nextPeriod)
			}
		}
	}
}

func TestAdmitRejectsBadInput(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, prefix := mustRunner(t, c)
	ok := quota.Request{TenantID: "t1", Meter: "demo", Cost: 1, Limits: allLimits(), Overage: quota.OverageBlock}
	for _, tc := range []struct {
		name  string
		edit  func(*quota.Request)
		field string
	}{
		{"cost 0", func(r *quota.Request) { r.Cost = 0 }, "cost"},
		{"negative cost", func(r *quota.Request) { r.Cost = -1 }, "cost"},
		{"cost above MaxQuantity", func(r *quota.Request) { r.Cost = quota.MaxQuantity + 1 }, "cost"},
		{"empty meter", func(r *quota.Request) { r.Meter = "" }, "meter"},
		{"meter with |", func(r *quota.Request) { r.Meter = "a|u" }, "meter"},
		{"meter of 65 characters", func(r *quota.Request) { r.Meter = strings.Repeat("m", 65) }, "meter"},
		{"empty tenant", func(r *quota.Request) { r.TenantID = "" }, "tenant_id"},
		{"tenant with a brace", func(r *quota.Request) { r.TenantID = "a}b" }, "tenant_id"},
		{"tenant with a newline", func(r *quota.Request) { r.TenantID = "a\nb" }, "tenant_id"},
		{"unknown overage", func(r *quota.Request) { r.Overage = "maybe" }, "overage"},
		{"burst without rate", func(r *quota.Request) { r.Limits.BurstRate = nil }, "burst"},
		{"negative daily quota", func(r *quota.Request) { r.Limits.DailyQuota = i64(-1) }, "daily_quota"},
		{"burst window too long", func(r *quota.Request) {
			r.Limits.BurstRate, r.Limits.Burst = f64(quota.MinRate), i64(quota.MaxQuantity)
		}, "burst"},
		{"bucket window too long", func(r *quota.Request) {
			r.Limits.BucketRefillPerSec, r.Limits.BucketCapacity = f64(quota.MinRate), i64(quota.MaxQuantity)
		}, "bucket_capacity"},
		{"time before 1970", func(r *quota.Request) { r.Now = time.Unix(-5, 0) }, "now"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := ok
			tc.edit(&req)
			_, err := r.Admit(context.Background(), req)
			var qe *quota.Error
			if !errors.As(err, &qe) || qe.Code != quota.CodeInvalid || qe.Field != tc.field {
				t.Errorf("Admit: got error %v, want a %s error on field %s", err, quota.CodeInvalid, tc.field)
			}
		})
	}
	if keys := mustKeys(t, c, prefix); len(keys) != 0 {
		t.Errorf("invalid requests wrote keys %v, want none", keys)
	}
	if d := mustAdmit(t, r, ok); !d.Allowed {
		t.Errorf("valid request: got %s, want allowed", fmtDecision(d))
	}
	for _, tc := range []struct {
		name, period string
		units        int64
		field        string
	}{
		{"unknown period", "week", 1, "period"},
		{"zero units", "day", 0, "units"},
		{"too many units", "month", quota.MaxQuantity + 1, "units"},
	} {
		err := r.Grant(context.Background(), "t1", tc.period, tc.units, time.Time{})
		if quota.ErrorCode(err) != quota.CodeInvalid || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Grant %s: got error %v, want a %s error on field %s", tc.name, err, quota.CodeInvalid, tc.field)
		}
	}
}

// TestRedisFailureIsAnError checks that a Redis failure reaches the caller
// as an error, never as a refusal (nor an admission).
func TestRedisFailureIsAnError(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	r := newStack(c, "unreachable")
	d, err := r.Admit(context.Background(), quota.Request{TenantID: "t1", Meter: "demo", Cost: 1, Limits: allLimits()})
	if err == nil || !strings.HasPrefix(err.Error(), "ratelimit: admit: ") {
		t.Fatalf("Admit against a dead server: got error %v, want a \"ratelimit: admit: \" error", err)
	}
	if d.Allowed || d.Limits != nil || d.Violated != nil {
		t.Errorf("Admit against a dead server: got decision %s, want the zero Decision", fmtDecision(d))
	}
	if code := quota.ErrorCode(err); code != quota.CodeInternal {
		t.Errorf("ErrorCode: got %s, want %s", code, quota.CodeInternal)
	}
}

// TestKeyLayout checks the names of a tenant's keys: versioned, and each
// with the tenant's hash tag.
func TestKeyLayout(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, prefix := mustRunner(t, c)
	tenant := newTenant()
	mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Limits: allLimits(), IdempotencyKey: "k1",
		Now: time.Now().Add(time.Hour)}) // an hour ahead keeps gcra/bucket from expiring before the scan
	got := map[string]bool{}
	for _, k := range mustKeys(t, c, prefix) {
		got[k] = true
	}
	base := prefix + ":v1:{t:" + tenant + "}:"
	want := []string{prefix + ":v2:{t:" + tenant + "}", base + "idem2:" + redisfn.IdemHash("k1")}
	for _, k := range want {
		if !got[k] {
			t.Errorf("key %s: missing; got %v", k, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("keys: got %d (%v), want %d", len(got), got, len(want))
	}
}

// TestStateHashStaysCompact: the state hash keeps Redis's compact listpack
// encoding (each value under hash-max-listpack-value): a hash table would
// cost twice the memory and a slower HMGET on every admission.
func TestStateHashStaysCompact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	big := i64(1 << 40)
	limits := quota.Limits{BurstRate: f64(1e6), Burst: i64(1e9), BucketCapacity: i64(1e9), BucketRefillPerSec: f64(1e6),
		DailyQuota: big, MonthlyQuota: big}
	for _, meter := range []string{"demo", "a-meter-name-of-sixty-four-characters-is-the-longest-one-allowed"} {
		mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: meter, Cost: 1 << 39, Limits: limits})
	}
	if now, err := c.Time(ctx).Result(); err != nil {
		t.Fatal(err)
	} else if _, err := r.ApplyGrant(ctx, tenant, quota.Calendar{}, "0123456789abcdef0123456789abcdef", "month", quota.MonthStart(now), 1<<40); err != nil {
		t.Fatal(err)
	}
	key := r.StateKeys(tenant)[0]
	if enc := c.ObjectEncoding(ctx, key).Val(); enc != "listpack" && enc != "ziplist" {
		t.Fatalf("OBJECT ENCODING %s: %q, want listpack", key, enc)
	}
}

// TestEveryKeyHasATTL checks, after admissions with Redis time, that every
// key expires, and no later than its state needs.
func TestEveryKeyHasATTL(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, prefix := mustRunner(t, c)
	tenant := newTenant()
	// A slow GCRA and bucket, so that their keys are still there when read.
	limits := quota.Limits{BurstRate: f64(0.01), Burst: i64(5), BucketCapacity: i64(20), BucketRefillPerSec: f64(0.01),
		DailyQuota: i64(100), MonthlyQuota: i64(1000)}
	var d quota.Decision
	for i := range 3 {
		d = mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "demo", Cost: 2, Limits: limits,
			IdempotencyKey: "k" + strconv.Itoa(i)})
	}
	ctx := context.Background()
	now := d.Now
	reset := func(name quota.LimitName) time.Time { l, _ := d.Limit(name); return l.Reset }
	// Expiries are rounded up to the millisecond (so a key never disappears
	// before its state is empty) and PTTL subtracts Redis's current time
	// rounded down to the millisecond: a PTTL can exceed the exact remaining
	// life by up to 2 ms.
	const slack = 2 * time.Millisecond
	// The state hash holds the pending usage: it lives 14 days after the
	// last admission, or until the end of its month + 1 h if later, and a
	// day's slack, rounded up to the hour (lua/state.lua).
	maxTTL := map[string]time.Duration{
		"state": max(reset(monthly).Sub(now)+time.Hour, 14*24*time.Hour) + 25*time.Hour + slack,
		"idem2": 24*time.Hour + slack,
	}
	keys := mustKeys(t, c, prefix)
	if len(keys) != 4 {
		t.Errorf("keys: got %d (%v), want 4", len(keys), keys)
	}
	for _, k := range keys {
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatalf("PTTL %s: %v", k, err)
		}
		kind := "state"
		if i := strings.LastIndex(k, "}:"); i >= 0 {
			kind, _, _ = strings.Cut(k[i+2:], ":")
		}
		if ttl <= 0 || ttl > maxTTL[kind] {
			t.Errorf("PTTL %s: got %v, want in (0, %v]", k, ttl, maxTTL[kind])
		}
	}
}

// TestDryRunChangesNothing compares every key's DUMP and expiry before and
// after dry runs that would be allowed and dry runs that would be refused.
func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, prefix := mustRunner(t, c)
	tenant := newTenant()
	now := at(t, "2031-03-10T10:00:00Z")
	req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Limits: allLimits(), Now: now}

	dry := req
	dry.DryRun, dry.IdempotencyKey = true, "k"
	if d := mustAdmit(t, r, dry); !d.Allowed {
		t.Fatalf("dry run on a fresh tenant: got %s, want allowed", fmtDecision(d))
	}
	if keys := mustKeys(t, c, prefix); len(keys) != 0 {
		t.Fatalf("dry run on a fresh tenant wrote keys %v, want none", keys)
	}

	mustAdmit(t, r, req)
	before := mustSnapshot(t, c, prefix)
	for _, cost := range []int64{1, 5, 20, 21, 101, 5000} { // allowed, allowed, bucket-full, never, ...
		dry.Cost = cost
		mustAdmit(t, r, dry)
	}
	dry.Overage, dry.Cost = quota.OverageBill, 999
	mustAdmit(t, r, dry)
	if _, err := r.Peek(context.Background(), tenant, allLimits(), now); err != nil {
		t.Fatal(err)
	}
	if after := mustSnapshot(t, c, prefix); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("dry runs changed keys:\n got  %v\n want %v", after, before)
	}
}

// TestRefusalCountsOnlyTheRefusal checks that a refused request changes no
// limit state (DUMP and expiry of every key) and only adds 1 to the pending
// "x" counter.
func TestRefusalCountsOnlyTheRefusal(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, prefix := mustRunner(t, c)
	tenant := newTenant()
	now := at(t, "2031-03-10T10:00:00Z")
	limits := allLimits()
	limits.MonthlyQuota = i64(3)
	req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 3, Limits: limits, Now: now}
	mustAdmit(t, r, req)

	stateKey := r.StateKeys(tenant)[0] // holds the pending usage: compared apart
	before := mustSnapshot(t, c, prefix)
	stateBefore := stateOf(t, c, r, tenant)
	pendingBefore := pendingFields(t, r, tenant)
	req.Cost, req.IdempotencyKey = 1, "k"
	if d := mustAdmit(t, r, req); d.Allowed {
		t.Fatalf("over the monthly quota: got %s, want refused", fmtDecision(d))
	}
	after := mustSnapshot(t, c, prefix)
	for k, v := range before {
		if k != stateKey && after[k] != v {
			t.Errorf("key %s changed on refusal", k)
		}
	}
	if len(after) != len(before) {
		t.Errorf("keys after refusal: got %d, want %d (no idem key for a refusal)", len(after), len(before))
	}
	if got := stateOf(t, c, r, tenant); fmt.Sprint(got) != fmt.Sprint(stateBefore) {
		t.Errorf("state changed on refusal: got %+v, want %+v", got, stateBefore)
	}
	pendingAfter := pendingFields(t, r, tenant)
	hour := strconv.FormatInt(now.Truncate(time.Hour).Unix(), 10)
	want := map[string]int64{}
	for k, v := range pendingBefore {
		want[k] = v
	}
	want[hour+"|demo|x"] = 1
	if fmt.Sprint(pendingAfter) != fmt.Sprint(want) {
		t.Errorf("pending after refusal: got %v, want %v", pendingAfter, want)
	}
}

func TestIdempotentRepeat(t *testing.T) {
	t.Parallel()
	testIdempotency(t, testenv.Redis(t))
}

// testIdempotency checks, with Redis time, that a repeat of the same request
// returns the first decision and counts nothing, that another request under
// the key is a mismatch, that a repeat while the first is in flight decides
// nothing until its answer is stored, that a released key runs again, and
// that a refused attempt is not stored.
func testIdempotency(t *testing.T, c redis.UniversalClient) {
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	for _, tenant := range []string{newTenant(), newTenant(), newTenant()} {
		limits := quota.Limits{MonthlyQuota: i64(10), DailyQuota: i64(10)}
		req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 4, Limits: limits, IdempotencyKey: "order-1",
			IdempotencyFingerprint: "GET /a", IdempotencyLease: time.Minute}
		first := mustAdmit(t, r, req)
		if !first.Allowed || first.Idem != quota.IdemNone {
			t.Fatalf("first: got %s, want allowed, not replayed", fmtDecision(first))
		}
		if d := mustAdmit(t, r, req); d.Idem != quota.IdemInFlight || d.Allowed {
			t.Errorf("repeat in flight: got %s (idem %d), want in flight", fmtDecision(d), d.Idem)
		}
		stored := quota.StoredAnswer{Status: 201, Header: "Content-Type: application/json", Body: []byte(`{"id":1}`)}
		answerOf := func(key, fp string) quota.Request {
			return quota.Request{TenantID: tenant, IdempotencyKey: key, IdempotencyFingerprint: fp, IdempotencyClaim: "claim-" + key}
		}
		if ok, err := r.StoreAnswer(ctx, answerOf("order-1", "GET /other"), stored); err != nil || ok {
			t.Errorf("StoreAnswer with another fingerprint: got %t, %v; want false", ok, err)
		}
		if ok, err := r.StoreAnswer(ctx, answerOf("order-1", "GET /a"), stored); err != nil || !ok {
			t.Fatalf("StoreAnswer: got %t, %v; want true", ok, err)
		}
		for range 3 {
			again := mustAdmit(t, r, req)
			want := first
			want.Idem, want.Now = quota.IdemReplayed, again.Now
			if g, w := fmtDecision(again), fmtDecision(want); g != w {
				t.Errorf("repeat:\n got  %s\n want %s", g, w)
			}
		}
		if got, err := r.Answer(ctx, tenant, "order-1"); err != nil || got.Status != stored.Status ||
			got.Header != stored.Header || string(got.Body) != string(stored.Body) {
			t.Errorf("Answer: got %+v, %v; want %+v", got, err, stored)
		}
		other := req
		other.IdempotencyFingerprint = "POST /a"
		if d := mustAdmit(t, r, other); d.Idem != quota.IdemMismatch || d.Allowed {
			t.Errorf("same key, other request: got %s (idem %d), want a mismatch", fmtDecision(d), d.Idem)
		}
		pending := sumPending(t, r, tenant)
		if pending["u"] != 4 || pending["r"] != 1 {
			t.Errorf("pending after repeats: got %v, want u=4 r=1", pending)
		}
		// A released key runs again, as a new request.
		rel := req
		rel.IdempotencyKey = "order-3"
		if d := mustAdmit(t, r, rel); !d.Allowed {
			t.Fatalf("order-3: got %s, want allowed", fmtDecision(d))
		}
		if err := r.ReleaseKey(ctx, answerOf("order-3", "GET /a")); err != nil {
			t.Fatal(err)
		}
		if d := mustAdmit(t, r, rel); d.Idem != quota.IdemNone || d.Allowed {
			t.Errorf("released key: got %s (idem %d), want a new decision (refused: 8 of 10 used)", fmtDecision(d), d.Idem)
		}
		big := req
		big.Cost, big.IdempotencyKey = 5, "order-2"
		if d := mustAdmit(t, r, big); d.Allowed {
			t.Fatalf("over quota: got %s, want refused", fmtDecision(d))
		}
		if err := r.Grant(ctx, tenant, "month", 5, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := r.Grant(ctx, tenant, "day", 5, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if d := mustAdmit(t, r, big); !d.Allowed || d.Replayed() {
			t.Errorf("retry after a refusal: got %s, want a new allowed decision", fmtDecision(d))
		}
	}
}

// sumPending adds up a tenant's pending usage by kind (u, r, x, o).
func sumPending(tb testing.TB, r *stack, tenant string) map[string]int64 {
	tb.Helper()
	sum := map[string]int64{}
	for f, n := range pendingFields(tb, r, tenant) {
		sum[f[strings.LastIndex(f, "|")+1:]] += n
	}
	return sum
}

// TestPeekReportsWithoutCounting checks Peek against the reference on a tenant
// with some usage, and that it reports an exhausted limit.
func TestPeekReportsWithoutCounting(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	tenant := newTenant()
	now := at(t, "2031-03-10T10:00:00Z")
	limits := allLimits()
	limits.DailyQuota = i64(4)
	var m ref
	for _, cost := range []int64{1, 3} {
		req := quota.Request{TenantID: tenant, Meter: "demo", Cost: cost, Limits: limits, Now: now}
		mustAdmit(t, r, req)
		m.Admit(req, now)
	}
	got, err := r.Peek(context.Background(), tenant, limits, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want := m.Peek(limits, quota.Calendar{}, now.Add(time.Second))
	if g, w := fmtDecision(got), fmtDecision(want); g != w {
		t.Errorf("Peek:\n got  %s\n want %s", g, w)
	}
	if l, _ := got.Limit(daily); got.Allowed || l.Remaining != 0 || fmt.Sprint(got.Violated) != "[daily]" {
		t.Errorf("Peek on a full daily quota: got %s, want refused by daily with 0 remaining", fmtDecision(got))
	}
	if l, _ := got.Limit(burst); l.Remaining != 5 {
		t.Errorf("Peek burst remaining one second later: got %d, want 5", l.Remaining)
	}
}
