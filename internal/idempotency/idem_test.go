package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/quotaredis"
	"github.com/tollgate/tollgate/internal/quotaredis/quotaredistest"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestAnswerClaims: lua/idem.lua's claims. A key whose live record decides
// (stored, in flight, another request) takes no room; a new one takes a
// record and the largest answer's bytes, or is refused with the wait until
// the first claim expires; a forced count passes the bound; unclaiming,
// storing and releasing settle the claim; a store larger than the
// reservation is an error and changes nothing.
func TestAnswerClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := quotaredistest.OnPrefix(t, testenv.Redis(t), quotaredis.New)
	r.WithAnswerLimits(quota.AnswerLimits{Answers: 2, Bytes: 1 << 30})
	tenant := quotaredistest.NewTenant()
	t0 := time.Now().Truncate(time.Millisecond)
	req := func(key, fp string) quota.Request {
		return quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Limits: quota.Limits{DailyQuota: quotaredistest.I64(100)},
			IdempotencyKey: key, IdempotencyFingerprint: fp, IdempotencyLease: time.Minute, IdempotencyClaim: "c-" + key + fp, Now: t0}
	}
	claim := func(q quota.Request, force bool) quota.AnswerClaim {
		t.Helper()
		c, err := r.ClaimAnswer(ctx, q, force)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	room := func(answers, bytes int64) {
		t.Helper()
		if u, err := r.AnswerUsage(ctx, tenant); err != nil || u.Answers != answers || u.Bytes != bytes {
			t.Fatalf("room %+v, %v; want %d answers, %d bytes", u, err, answers, bytes)
		}
	}

	a := req("a", "GET /a")
	if c := claim(a, false); c.Status != quota.ClaimTaken || c.Usage.Answers != 1 || c.Usage.Bytes != quota.AnswerReserve {
		t.Fatalf("first claim: %+v, want taken, 1 answer of the reserve", c)
	}
	if c := claim(a, false); c.Status != quota.ClaimTaken || c.Usage.Answers != 1 {
		t.Fatalf("the same claim again: %+v, want taken once", c)
	}
	quotaredistest.MustAdmit(t, r, a)
	for _, q := range []quota.Request{req("a", "GET /a"), req("a", "POST /a")} {
		if c := claim(q, false); c.Status != quota.ClaimSkipped {
			t.Fatalf("claim of %s in flight: %+v, want skipped", q.IdempotencyFingerprint, c)
		}
	}
	big := quota.StoredAnswer{Status: 200, Header: "X: y\n", Body: make([]byte, quota.AnswerReserve)}
	if _, err := r.StoreAnswer(ctx, a, big); err == nil {
		t.Fatal("storing an answer past the reservation: no error")
	}
	room(1, quota.AnswerReserve)
	if ok, err := r.StoreAnswer(ctx, a, quota.StoredAnswer{Status: 200, Body: []byte("12345")}); err != nil || !ok {
		t.Fatalf("store: %t %v", ok, err)
	}
	room(1, 5)
	if c := claim(req("a", "GET /a"), false); c.Status != quota.ClaimSkipped {
		t.Fatalf("claim of a stored key: %+v, want skipped", c)
	}

	b := req("b", "GET /b")
	if c := claim(b, false); c.Status != quota.ClaimTaken {
		t.Fatalf("claim b: %+v", c)
	}
	c := claim(req("c", "GET /c"), false)
	if c.Status != quota.ClaimRefused || c.RetryAfter < 24*time.Hour-time.Second || c.RetryAfter > 24*time.Hour {
		t.Fatalf("claim past 2 answers: %+v, want refused until a's record expires", c)
	}
	room(2, 5+quota.AnswerReserve)
	if c := claim(req("c", "GET /c"), true); c.Status != quota.ClaimTaken {
		t.Fatalf("forced claim: %+v", c)
	}
	room(3, 5+2*quota.AnswerReserve)
	if err := r.UnclaimAnswer(ctx, req("c", "GET /c")); err != nil {
		t.Fatal(err)
	}
	room(2, 5+quota.AnswerReserve)
	// b was admitted, then refunded
	quotaredistest.MustAdmit(t, r, b)
	if err := r.ReleaseKey(ctx, b); err != nil {
		t.Fatal(err)
	}
	room(1, 5)
	// a store for a record that is not the request's drops its claim
	d := req("d", "GET /d")
	claim(d, false)
	room(2, 5+quota.AnswerReserve)
	if ok, err := r.StoreAnswer(ctx, d, quota.StoredAnswer{Status: 200}); err != nil || ok {
		t.Fatalf("store without a record: %t %v, want false", ok, err)
	}
	room(1, 5)
	// a's record expires 24 h after its decision, and its room with it
	later := req("e", "GET /e")
	later.Now = t0.Add(24 * time.Hour)
	if c := claim(later, false); c.Status != quota.ClaimTaken || c.Usage.Answers != 1 || c.Usage.Bytes != quota.AnswerReserve {
		t.Fatalf("claim a day later: %+v, want taken with a's room freed", c)
	}
}

// TestClusterAnswerRoom: a tenant's room and records share its slot, on
// every master: claims, stores and the room's report run as one script.
func TestClusterAnswerRoom(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t)
	r := quotaredistest.OnPrefix(t, c, quotaredis.New)
	ctx := context.Background()
	for _, tenant := range quotaredistest.TenantsOnDistinctMasters(t, c, 3) {
		req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Limits: quotaredistest.AllLimits(), IdempotencyKey: "k",
			IdempotencyFingerprint: "GET /k", IdempotencyLease: time.Minute, IdempotencyClaim: "claim-k"}
		if cl, err := r.ClaimAnswer(ctx, req, false); err != nil || cl.Status != quota.ClaimTaken {
			t.Fatalf("tenant %s: claim %+v, %v", tenant, cl, err)
		}
		quotaredistest.MustAdmit(t, r, req)
		if ok, err := r.StoreAnswer(ctx, req, quota.StoredAnswer{Status: 200, Body: []byte("ok")}); err != nil || !ok {
			t.Fatalf("tenant %s: store %t, %v", tenant, ok, err)
		}
		if u, err := r.AnswerUsage(ctx, tenant); err != nil || u.Answers != 1 || u.Bytes != 2 {
			t.Fatalf("tenant %s: room %+v, %v; want 1 answer of 2 bytes", tenant, u, err)
		}
		keys := []string{r.Key(tenant, "idemroom"), r.Key(tenant, "idembytes"), r.Key(tenant, "idem2:"+redisfn.IdemHash("k"))}
		want := c.ClusterKeySlot(ctx, keys[0]).Val()
		for _, k := range keys[1:] {
			if got := c.ClusterKeySlot(ctx, k).Val(); got != want {
				t.Errorf("slot of %s: got %d, want %d", k, got, want)
			}
		}
	}
}
