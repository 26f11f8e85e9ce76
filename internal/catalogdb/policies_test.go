package catalogdb_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// window is a valid fixed_window policy named name, matching m.
func window(name string, m quota.PolicyMatch) quota.Policy {
	return quota.Policy{Name: name, Algorithm: quota.AlgFixedWindow, Limit: quota.Ptr(int64(10)),
		WindowSeconds: quota.Ptr(int64(60)), Match: m}
}

func mustCreatePolicy(tb testing.TB, store *catalogdb.Store, p quota.Policy) quota.Policy {
	tb.Helper()
	out, err := store.CreatePolicy(context.Background(), "test", p)
	if err != nil {
		tb.Fatalf("create policy %s: %v", p.Name, err)
	}
	return out
}

// policyRows counts the policies and the audit entries of policies.
func policyRows(tb testing.TB, pool *pgxpool.Pool) (policies, audits int) {
	tb.Helper()
	err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM policies),
		(SELECT count(*) FROM audit_log WHERE entity = 'policy')`).Scan(&policies, &audits)
	if err != nil {
		tb.Fatal(err)
	}
	return policies, audits
}

func policyAudit(tb testing.TB, store *catalogdb.Store, name string) []quota.AuditEntry {
	tb.Helper()
	es, _, err := store.ListAudit(context.Background(), "policy", name, quota.Page{Limit: 50})
	if err != nil {
		tb.Fatal(err)
	}
	return es
}

func mustField(tb testing.TB, what string, err error, code, field string) {
	tb.Helper()
	var qe *quota.Error
	if !errors.As(err, &qe) || qe.Code != code || qe.Field != field {
		tb.Errorf("%s: %v, want a %s error naming %q", what, err, code, field)
	}
}

func TestPolicyCRUDWithAudit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	store := catalogdb.NewStore(pool)

	created := mustCreatePolicy(t, store, window("reports", quota.PolicyMatch{Meters: []string{"report"}, Methods: []string{"post"}}))
	if created.Scope != quota.ScopeTenant || created.Cost != quota.CostRequests || created.OnRefuse != quota.RefuseReject {
		t.Errorf("created scope %q cost %q on_refuse %q, want the defaults tenant, requests, reject", created.Scope, created.Cost, created.OnRefuse)
	}
	if got := created.Match.Methods; !reflect.DeepEqual(got, []string{"POST"}) {
		t.Errorf("created methods %v, want [POST]", got)
	}
	got, err := store.Policy(ctx, "reports")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, created) {
		t.Errorf("read back %+v, want %+v", got, created)
	}

	_, err = store.CreatePolicy(ctx, "test", window("reports", quota.PolicyMatch{}))
	mustField(t, "duplicate name", err, quota.CodeConflict, "name")
	for _, name := range []string{"nope", "Bad Name", "a\x00b", "\xff"} {
		if _, err := store.Policy(ctx, name); quota.ErrorCode(err) != quota.CodeNotFound {
			t.Errorf("Policy(%q): %v, want CodeNotFound", name, err)
		}
	}

	// A change reads, changes and writes under the lock; change may write
	// through the pointers it is given without touching what the audit
	// records as before.
	updated, err := store.UpdatePolicy(ctx, "alice", "reports", func(p *quota.Policy) error {
		*p.Limit = 20
		p.OnRefuse, p.MaxWaitMS = quota.RefuseQueue, quota.Ptr(int64(500))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if *updated.Limit != 20 || updated.OnRefuse != quota.RefuseQueue || *updated.MaxWaitMS != 500 {
		t.Errorf("updated %+v, want limit 20, queue up to 500 ms", updated)
	}
	var version int64
	if err := pool.QueryRow(ctx, `SELECT version FROM policies WHERE name = 'reports'`).Scan(&version); err != nil || version != 2 {
		t.Errorf("version after one update: %d (%v), want 2", version, err)
	}

	if err := store.DeletePolicy(ctx, "bob", "reports"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Policy(ctx, "reports"); quota.ErrorCode(err) != quota.CodeNotFound {
		t.Errorf("after delete: %v, want CodeNotFound", err)
	}
	if err := store.DeletePolicy(ctx, "bob", "reports"); quota.ErrorCode(err) != quota.CodeNotFound {
		t.Errorf("delete again: %v, want CodeNotFound", err)
	}
	if _, err := store.UpdatePolicy(ctx, "bob", "reports", func(*quota.Policy) error { return nil }); quota.ErrorCode(err) != quota.CodeNotFound {
		t.Errorf("update a deleted policy: %v, want CodeNotFound", err)
	}

	// The audit log holds each write, newest first, with before and after.
	es := policyAudit(t, store, "reports")
	type entry struct{ action, actor string }
	var actions []entry
	for _, e := range es {
		actions = append(actions, entry{e.Action, e.Actor})
	}
	if want := []entry{{"delete", "bob"}, {"update", "alice"}, {"create", "test"}}; !reflect.DeepEqual(actions, want) {
		t.Fatalf("audit of reports: %v, want %v", actions, want)
	}
	decode := func(raw json.RawMessage) *quota.Policy {
		if string(raw) == "null" {
			return nil
		}
		var p quota.Policy
		if err := json.Unmarshal(raw, &p); err != nil {
			t.Fatal(err)
		}
		return &p
	}
	del, upd, cre := es[0], es[1], es[2]
	if b, a := decode(cre.Before), decode(cre.After); b != nil || a == nil || !reflect.DeepEqual(*a, created) {
		t.Errorf("create entry: before %+v after %+v, want none and the created policy", b, a)
	}
	if b, a := decode(upd.Before), decode(upd.After); b == nil || a == nil || *b.Limit != 10 || *a.Limit != 20 || !reflect.DeepEqual(*a, updated) {
		t.Errorf("update entry: before %+v after %+v, want limit 10 then the updated policy", b, a)
	}
	if b, a := decode(del.Before), decode(del.After); b == nil || a != nil || !reflect.DeepEqual(*b, updated) {
		t.Errorf("delete entry: before %+v after %+v, want the updated policy and none", b, a)
	}
}

// TestRefusedPolicyWritesChangeNothing: every refused create or update
// leaves the policies and the audit log as they were.
func TestRefusedPolicyWritesChangeNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	store := catalogdb.NewStore(pool)
	base := mustCreatePolicy(t, store, window("base", quota.PolicyMatch{}))
	policies, audits := policyRows(t, pool)

	leaky := quota.Policy{Name: "leaky", Algorithm: quota.AlgLeakyBucket, Burst: quota.Ptr(int64(5))}
	_, err := store.CreatePolicy(ctx, "test", leaky)
	mustField(t, "leaky_bucket without rate", err, quota.CodeInvalid, "rate")
	_, err = store.CreatePolicy(ctx, "test", window("Bad", quota.PolicyMatch{}))
	mustField(t, "bad name", err, quota.CodeInvalid, "name")

	oops := errors.New("the change failed")
	for _, tc := range []struct {
		what, field string
		change      func(*quota.Policy) error
	}{
		{"rename", "name", func(p *quota.Policy) error { p.Name = "other"; return nil }},
		{"limit out of bounds", "limit", func(p *quota.Policy) error { *p.Limit = 0; return nil }},
		{"a field of another algorithm", "rate", func(p *quota.Policy) error { p.Rate = quota.Ptr(1.0); return nil }},
		{"param scope without param", "param", func(p *quota.Policy) error { p.Scope = quota.ScopeParam; return nil }},
		{"queue without max_wait_ms", "max_wait_ms", func(p *quota.Policy) error { p.OnRefuse = quota.RefuseQueue; return nil }},
	} {
		_, err := store.UpdatePolicy(ctx, "test", "base", tc.change)
		mustField(t, tc.what, err, quota.CodeInvalid, tc.field)
	}
	if _, err := store.UpdatePolicy(ctx, "test", "base", func(*quota.Policy) error { return oops }); !errors.Is(err, oops) {
		t.Errorf("a failing change: %v, want its error", err)
	}

	if p, a := policyRows(t, pool); p != policies || a != audits {
		t.Errorf("after refused writes: %d policies and %d audit entries, want %d and %d", p, a, policies, audits)
	}
	if got, err := store.Policy(ctx, "base"); err != nil || !reflect.DeepEqual(got, base) {
		t.Errorf("base after refused changes: %+v (%v), want %+v", got, err, base)
	}
}

func TestPoliciesByNameAndPaged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := catalogdb.NewStore(testenv.Postgres(t))
	names := []string{"b", "a-2", "a", "c1", "a2"} // bytewise: a, a-2, a2, b, c1
	for _, n := range names {
		mustCreatePolicy(t, store, window(n, quota.PolicyMatch{Meters: []string{n}}))
	}
	want := []string{"a", "a-2", "a2", "b", "c1"}
	all, err := store.Policies(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range all {
		got = append(got, p.Name)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Policies: %v, want %v", got, want)
	}

	got = nil
	page := quota.Page{Limit: 2}
	for i := 0; ; i++ {
		items, next, err := store.ListPolicies(ctx, page)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range items {
			got = append(got, p.Name)
		}
		if next == nil {
			break
		}
		if i > len(want) {
			t.Fatal("ListPolicies does not end")
		}
		page.Cursor = *next
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ListPolicies by 2: %v, want %v", got, want)
	}
	for _, c := range []string{"garbage!", "eyJpIjoiYVx1MDAwMGIifQ"} { // the second: {"i":"a\u0000b"}
		if _, _, err := store.ListPolicies(ctx, quota.Page{Limit: 2, Cursor: c}); quota.ErrorCode(err) != quota.CodeInvalid {
			t.Errorf("cursor %q: %v, want CodeInvalid", c, err)
		}
	}
}

// TestConcurrentPolicyUpdatesAreSerialized: read-modify-write under the
// lock loses no update.
func TestConcurrentPolicyUpdatesAreSerialized(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	store := catalogdb.NewStore(pool)
	mustCreatePolicy(t, store, window("counter", quota.PolicyMatch{}))
	const n = 12
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := store.UpdatePolicy(ctx, "test", "counter", func(p *quota.Policy) error { *p.Limit++; return nil })
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	p, err := store.Policy(ctx, "counter")
	if err != nil {
		t.Fatal(err)
	}
	var version int64
	if err := pool.QueryRow(ctx, `SELECT version FROM policies WHERE name = 'counter'`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if *p.Limit != 10+n || version != 1+n {
		t.Errorf("after %d concurrent increments: limit %d version %d, want %d and %d", n, *p.Limit, version, 10+n, 1+n)
	}
}

// TestPolicyCrowdingTakesHeadAsGet: a HEAD request is under the policies
// on GET (quota.PolicyMatch.TakesMethod), so a policy on HEAD beside 16 on
// GET crowds it, and so does one on GET beside 16 on HEAD.
func TestPolicyCrowdingTakesHeadAsGet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct{ crowd, extra string }{{"GET", "HEAD"}, {"HEAD", "GET"}} {
		store := catalogdb.NewStore(testenv.Postgres(t))
		for i := range quota.MaxPoliciesPerRequest {
			mustCreatePolicy(t, store, window(fmt.Sprintf("m-%02d", i), quota.PolicyMatch{Methods: []string{tc.crowd}}))
		}
		_, err := store.CreatePolicy(ctx, "test", window("extra", quota.PolicyMatch{Methods: []string{tc.extra}}))
		mustField(t, tc.extra+" beside 16 on "+tc.crowd, err, quota.CodeInvalid, "match")
		if _, err := store.CreatePolicy(ctx, "test", window("posts", quota.PolicyMatch{Methods: []string{"POST"}})); err != nil {
			t.Errorf("POST beside 16 on %s: %v, want it created", tc.crowd, err)
		}
	}
}

// TestPolicyCrowding: a policy that would make more than
// MaxPoliciesPerRequest policies apply to some request is refused, naming
// match; one that shares no such request with them is not.
func TestPolicyCrowding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	store := catalogdb.NewStore(pool)
	// 16 policies on POST /api/r... requests of the meter report.
	base := quota.PolicyMatch{Meters: []string{"report"}, Methods: []string{"POST"}, PathPrefix: "/api/r"}
	for i := range quota.MaxPoliciesPerRequest {
		mustCreatePolicy(t, store, window(fmt.Sprintf("base-%02d", i), base))
	}
	for _, tc := range []struct {
		name    string
		match   quota.PolicyMatch
		refused bool
	}{
		{"everything", quota.PolicyMatch{}, true},
		{"another meter", quota.PolicyMatch{Meters: []string{"echo"}}, false},
		{"another method", quota.PolicyMatch{Methods: []string{"get"}}, false},
		{"the same meter by another method", quota.PolicyMatch{Meters: []string{"report"}, Methods: []string{"GET"}}, false},
		{"another path", quota.PolicyMatch{PathPrefix: "/api/other"}, false},
		{"a path above", quota.PolicyMatch{PathPrefix: "/api"}, true},
		{"a path below", quota.PolicyMatch{PathPrefix: "/api/r/deeper"}, true},
		{"a path the prefix starts", quota.PolicyMatch{PathPrefix: "/api/rx"}, true},
		// a request path is under a prefix as lenient upstreams read both
		// (routes.UnderPrefix): /api/r/x is under /api/R/ too
		{"a path in another case", quota.PolicyMatch{PathPrefix: "/api/R/"}, true},
		{"a path escaped", quota.PolicyMatch{PathPrefix: "/api/%72/deeper"}, true},
		{"a path behind an empty segment", quota.PolicyMatch{PathPrefix: "/api//r"}, true},
		{"another path in another case", quota.PolicyMatch{PathPrefix: "/api/Other"}, false},
		{"one tier", quota.PolicyMatch{Tiers: []string{"free"}}, true},
		{"methods in any case", quota.PolicyMatch{Meters: []string{"echo", "report"}, Methods: []string{"PUT", "post"}}, true},
	} {
		_, audits := policyRows(t, pool)
		p, err := store.CreatePolicy(ctx, "test", window("extra", tc.match))
		if !tc.refused {
			if err != nil {
				t.Errorf("%s: %v, want it created", tc.name, err)
			} else if err := store.DeletePolicy(ctx, "test", p.Name); err != nil {
				t.Fatal(err)
			}
			continue
		}
		mustField(t, tc.name, err, quota.CodeInvalid, "match")
		if n, a := policyRows(t, pool); n != quota.MaxPoliciesPerRequest || a != audits {
			t.Errorf("%s: refused, but %d policies and %d audit entries, want %d and %d", tc.name, n, a, quota.MaxPoliciesPerRequest, audits)
		}
	}

	// A change that makes a policy share the crowded requests is refused too.
	mustCreatePolicy(t, store, window("echo", quota.PolicyMatch{Meters: []string{"echo"}}))
	_, err := store.UpdatePolicy(ctx, "test", "echo", func(p *quota.Policy) error { p.Match.Meters = nil; return nil })
	mustField(t, "widened to every meter", err, quota.CodeInvalid, "match")
	// Changing one of the crowd leaves it as crowded as before: allowed.
	if _, err := store.UpdatePolicy(ctx, "test", "base-00", func(p *quota.Policy) error { *p.Limit = 5; return nil }); err != nil {
		t.Errorf("changing the limit of one of 16: %v, want it changed", err)
	}
}

// TestPolicyCrowdingCountsOneRequest: the bound is on the policies one
// request matches, not on those that overlap the new policy somewhere.
func TestPolicyCrowdingCountsOneRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := catalogdb.NewStore(testenv.Postgres(t))
	for i := range 8 {
		mustCreatePolicy(t, store, window(fmt.Sprintf("a-%d", i), quota.PolicyMatch{Meters: []string{"a"}}))
		mustCreatePolicy(t, store, window(fmt.Sprintf("b-%d", i), quota.PolicyMatch{Meters: []string{"b"}}))
	}
	// It overlaps all 16, but a request matches at most 9 of them.
	mustCreatePolicy(t, store, window("all", quota.PolicyMatch{}))
	for i := range 7 {
		mustCreatePolicy(t, store, window(fmt.Sprintf("get-%d", i), quota.PolicyMatch{Methods: []string{"GET"}}))
	}
	// GET of meter a now matches 8 + 1 + 7 = 16: one more is refused, on
	// another method it is not.
	_, err := store.CreatePolicy(ctx, "test", window("get-a", quota.PolicyMatch{Meters: []string{"a"}, Methods: []string{"GET"}}))
	mustField(t, "a 17th on GET of meter a", err, quota.CodeInvalid, "match")
	mustCreatePolicy(t, store, window("post-a", quota.PolicyMatch{Meters: []string{"a"}, Methods: []string{"POST"}}))
}

// TestPolicyConstraints checks that the schema itself refuses rows the
// store would never write.
func TestPolicyConstraints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	for _, tc := range []struct{ name, sql string }{
		{"bad name", `INSERT INTO policies (name, spec) VALUES ('Bad Name', '{"name": "Bad Name"}')`},
		{"spec of another name", `INSERT INTO policies (name, spec) VALUES ('one', '{"name": "two"}')`},
		{"spec not an object", `INSERT INTO policies (name, spec) VALUES ('one', '["one"]')`},
		{"version zero", `INSERT INTO policies (name, spec, version) VALUES ('one', '{"name": "one"}', 0)`},
	} {
		if _, err := db.Exec(ctx, tc.sql); err == nil {
			t.Errorf("%s: accepted, want a constraint violation", tc.name)
		}
	}
}
