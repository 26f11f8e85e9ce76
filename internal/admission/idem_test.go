package admission

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/testenv"
)

// mustRoomGate is a live gate whose runner bounds idempotency records by l.
func mustRoomGate(tb testing.TB, l quota.AnswerLimits) (*Gate, *quotaredis.Store) {
	tb.Helper()
	rdb := testenv.Redis(tb)
	r := quotaredis.New(rdb, testenv.Prefix(tb, rdb)).WithAnswerLimits(l)
	return New(&counting{Store: r}, time.Now), r
}

// keyed is req with an idempotency key of its own claim, at now.
func keyed(req quota.Request, key string, now time.Time) quota.Request {
	req.IdempotencyKey, req.IdempotencyFingerprint, req.IdempotencyLease = key, "POST /a "+key, time.Minute
	req.IdempotencyClaim, req.Now = "claim-"+key+"-"+testenv.RandomHex(4), now
	return req
}

func mustRoom(tb testing.TB, r *quotaredis.Store, tenant string, answers, bytes int64) {
	tb.Helper()
	u, err := r.AnswerUsage(context.Background(), tenant)
	if err != nil || u.Answers != answers || u.Bytes != bytes {
		tb.Fatalf("room: %+v, %v; want %d answers, %d bytes", u, err, answers, bytes)
	}
}

// TestAnswerRoomBoundsTenantRecords: with room for 2 records, a third key
// is refused before it is decided (nothing consumed) until a record goes:
// released, or expired 24 hours after its first request; a stored answer
// holds its own size, a request in flight the largest answer's; a repeat
// needs no room; a refused request gives its claim back.
func TestAnswerRoomBoundsTenantRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, r := mustRoomGate(t, quota.AnswerLimits{Answers: 2, Bytes: 3 * quota.AnswerReserve})
	base := dailyOf(5)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	admit := func(req quota.Request) quota.Decision {
		t.Helper()
		d, err := g.Admit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	k1 := keyed(base, "k1", t0)
	if d := admit(k1); !d.Allowed || d.Idem != quota.IdemNone {
		t.Fatalf("k1: %+v, want admitted", d)
	}
	mustRoom(t, r, base.TenantID, 1, quota.AnswerReserve)
	answer := quota.StoredAnswer{Status: 201, Header: "Content-Type: application/json\n", Body: []byte(`{"id":1}`)}
	if err := g.StoreAnswer(ctx, k1, answer); err != nil {
		t.Fatal(err)
	}
	size := int64(len(answer.Header) + len(answer.Body))
	mustRoom(t, r, base.TenantID, 1, size)
	k2 := keyed(base, "k2", t0)
	if d := admit(k2); !d.Allowed {
		t.Fatalf("k2: %+v, want admitted", d)
	}
	mustRoom(t, r, base.TenantID, 2, size+quota.AnswerReserve)

	k3 := keyed(base, "k3", t0)
	d := admit(k3)
	if d.Allowed || d.Idem != quota.IdemLimit || d.RetryAfter < 23*time.Hour || d.RetryAfter > 24*time.Hour {
		t.Fatalf("k3 past the room: %+v, want IdemLimit, retry when k1's record expires (within 24 h)", d)
	}
	mustRoom(t, r, base.TenantID, 2, size+quota.AnswerReserve)
	if d := admit(keyed(base, "k1", t0)); !d.Replayed() {
		t.Fatalf("repeat of k1 with the room full: %+v, want replayed", d)
	}
	// the refusal consumed nothing: k1, k2 and this one of 5 units, all
	// at t0's day (the real clock's day differs in its first hour)
	plain := base
	plain.Now = t0
	if daily, _ := admitLimit(t, admit(plain), quota.LimitDaily); daily.Remaining != 2 {
		t.Fatalf("daily remaining %d, want 2: a refusal for room takes nothing", daily.Remaining)
	}
	if err := g.ReleaseKey(ctx, k2); err != nil {
		t.Fatal(err)
	}
	mustRoom(t, r, base.TenantID, 1, size)

	// a request its limits refuse gives its claim back at once
	big := keyed(base, "k5", t0)
	big.Cost = 10
	if d := admit(big); d.Allowed || d.Idem != quota.IdemNone {
		t.Fatalf("k5 of cost 10: %+v, want refused by the daily quota", d)
	}
	mustRoom(t, r, base.TenantID, 1, size)
	if d := admit(k3); !d.Allowed {
		t.Fatalf("k3 after k2 was released: %+v, want admitted", d)
	}
	mustRoom(t, r, base.TenantID, 2, size+quota.AnswerReserve)

	// a day later k1's record (and its room) is gone; k3's claim, never
	// settled (its node died), frees 5 minutes after its record
	later := t0.Add(24*time.Hour + time.Second)
	mustRoomAt(t, g, r, keyed(base, "k6", later), base.TenantID, 2, quota.AnswerReserve*2)
	mustRoomAt(t, g, r, keyed(base, "k7", later.Add(5*time.Minute)), base.TenantID, 2, quota.AnswerReserve*2)
}

// admitLimit is d's named limit; it fails the test when d was not
// admitted.
func admitLimit(tb testing.TB, d quota.Decision, name quota.LimitName) (quota.LimitState, bool) {
	tb.Helper()
	if !d.Allowed {
		tb.Fatalf("decision %+v, want admitted", d)
	}
	return d.Limit(name)
}

// mustRoomAt admits req (a new key, at its time) and checks the room after
// it.
func mustRoomAt(tb testing.TB, g *Gate, r *quotaredis.Store, req quota.Request, tenant string, answers, bytes int64) {
	tb.Helper()
	if d, err := g.Admit(context.Background(), req); err != nil || !d.Allowed {
		tb.Fatalf("%s at %s: %+v, %v; want admitted", req.IdempotencyKey, req.Now, d, err)
	}
	u, err := r.AnswerUsage(context.Background(), tenant)
	if err != nil || u.Answers != answers || u.Bytes != bytes {
		tb.Fatalf("room after %s: %+v, %v; want %d answers, %d bytes", req.IdempotencyKey, u, err, answers, bytes)
	}
}

// TestAnswerRoomHoldsUnderConcurrency: 200 new keys at once take exactly
// the room there is, by count and by bytes.
func TestAnswerRoomHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		limits quota.AnswerLimits
		want   int
	}{
		{"answers", quota.AnswerLimits{Answers: 50, Bytes: 1 << 40}, 50},
		{"bytes", quota.AnswerLimits{Answers: 1000, Bytes: 7*quota.AnswerReserve + 1000}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, r := mustRoomGate(t, tc.limits)
			base := dailyOf(1000)
			var wg sync.WaitGroup
			var mu sync.Mutex
			outcomes := map[string]int{}
			for i := range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d, err := g.Admit(context.Background(), keyed(base, fmt.Sprintf("c%d", i), time.Time{}))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err != nil:
						outcomes[err.Error()]++
					case d.Allowed:
						outcomes["admitted"]++
					case d.Idem == quota.IdemLimit:
						outcomes["limit"]++
					default:
						outcomes[fmt.Sprintf("%+v", d)]++
					}
				}()
			}
			wg.Wait()
			if outcomes["admitted"] != tc.want || outcomes["limit"] != 200-tc.want {
				t.Fatalf("outcomes %v, want %d admitted and %d refused for room", outcomes, tc.want, 200-tc.want)
			}
			mustRoom(t, r, base.TenantID, int64(tc.want), int64(tc.want)*quota.AnswerReserve)
		})
	}
}

// TestAnswerClaimOfABadRequestIsGivenBack: a request the admission refuses
// as bad input wrote nothing: its claim goes back at once.
func TestAnswerClaimOfABadRequestIsGivenBack(t *testing.T) {
	t.Parallel()
	g, r := mustRoomGate(t, quota.AnswerLimits{Answers: 1, Bytes: 1 << 30})
	bad := keyed(dailyOf(5), "k", time.Time{})
	bad.Meter = "has|bar"
	if _, err := g.Admit(context.Background(), bad); quota.ErrorCode(err) != quota.CodeInvalid {
		t.Fatalf("a bad meter: %v, want invalid", err)
	}
	mustRoom(t, r, bad.TenantID, 0, 0)
	good := keyed(dailyOf(5), "k", time.Time{})
	good.TenantID = bad.TenantID
	if d, err := g.Admit(context.Background(), good); err != nil || !d.Allowed {
		t.Fatalf("then a good request: %+v, %v; want admitted", d, err)
	}
}
