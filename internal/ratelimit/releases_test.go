package ratelimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

func TestReleasesAreAnnouncedForFullQueuePolicies(t *testing.T) {
	t.Parallel()
	testReleases(t, testenv.Redis)
}

func TestClusterReleasesAreAnnouncedForFullQueuePolicies(t *testing.T) {
	t.Parallel()
	testReleases(t, testenv.Cluster)
}

// queueConcurrencyPolicy is a concurrency policy of limit 2, leases of 30 s, on_refuse how.
func queueConcurrencyPolicy(name string, scope quota.Scope, how quota.OnRefuse) *quota.Policy {
	p := &quota.Policy{Name: name, Algorithm: quota.AlgConcurrency, Scope: scope, Limit: i64(2),
		LeaseSeconds: i64(30), OnRefuse: how}
	if how == quota.RefuseQueue {
		p.MaxWaitMS = i64(5000)
	}
	p.Defaults()
	if err := p.Validate(); err != nil {
		panic(err)
	}
	return p
}

// testReleases: two runners on clients of their own, as two API nodes: a
// release by one of a concurrency policy of limit 2 that queues and was
// full is heard by the other's ListenReleases, under the policy's
// LeaseKey, whatever master of a cluster holds the state (scope tenant:
// the tenant's slot; global: a slot of its own) and whatever server the
// listener is on. A release that leaves the policy less than full, or of
// a policy that rejects, announces nothing: a message published after it
// by the server that holds the state is the next one heard.
func testReleases(t *testing.T, newClient func(testing.TB) redis.UniversalClient) {
	c := newClient(t)
	a, prefix := mustRunner(t, c)
	b := newStack(newClient(t), prefix)
	heard := make(chan string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ready := make(chan struct{})
	go b.ListenReleases(ctx, func(key string) { heard <- key }, func() {}, ready)
	select {
	case <-ready:
	case <-time.After(5 * time.Second):
		t.Fatal("ListenReleases never subscribed")
	}
	next := func(what, want string) {
		t.Helper()
		select {
		case got := <-heard:
			if got != want {
				t.Fatalf("%s: heard %q, want %q", what, got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: nothing heard within 5 s, want %q", what, want)
		}
	}
	// quiet checks that nothing was announced for key: a message the
	// key's own server publishes now is the next one heard
	quiet := func(what, key string) {
		t.Helper()
		pub := c
		if cc, ok := c.(*redis.ClusterClient); ok {
			m, err := cc.MasterForKey(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			pub = m
		}
		if err := pub.Publish(ctx, a.releases(), "after:"+key).Err(); err != nil {
			t.Fatal(err)
		}
		next(what, "after:"+key)
	}
	n := 0
	admit := func(tenant string, p *quota.Policy) quota.Request {
		t.Helper()
		n++
		req := quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Limits: quota.Limits{DailyQuota: i64(100)},
			Overage: quota.OverageBlock, RequestID: fmt.Sprintf("req-%d", n),
			Policies: []quota.PolicyCall{{Policy: p, Value: tenant, Limit: 2}}}
		if d := mustAdmit(t, a, req); !d.Allowed {
			t.Fatalf("%s: %s, want admitted", p.Name, fmtDecision(d))
		}
		return req
	}
	release := func(req quota.Request) string {
		t.Helper()
		if err := a.ReleasePolicies(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		return b.LeaseKey(req, req.Policies[0])
	}
	for _, scope := range []quota.Scope{quota.ScopeTenant, quota.ScopeGlobal} {
		tenant := newTenant()
		rejects := queueConcurrencyPolicy("rejects-"+string(scope), scope, quota.RefuseReject)
		queues := queueConcurrencyPolicy("queues-"+string(scope), scope, quota.RefuseQueue)
		r1, r2 := admit(tenant, rejects), admit(tenant, rejects)
		quiet(string(scope)+": a full reject policy released", release(r1))
		release(r2)
		q1 := admit(tenant, queues)
		quiet(string(scope)+": a queue policy released below its limit", release(q1))
		q2, q3 := admit(tenant, queues), admit(tenant, queues)
		key := release(q2)
		next(string(scope)+": a full queue policy released", key)
		quiet(string(scope)+": the last holder released", release(q3))
	}
}
