package catalog

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

func testPolicy(name string, limit int64) quota.Policy {
	return quota.Policy{Name: name, Algorithm: quota.AlgConcurrency, Limit: quota.Ptr(limit),
		LeaseSeconds: quota.Ptr(int64(30)), Match: quota.PolicyMatch{Meters: []string{"report"}}}
}

// limitOf returns the limit of the policy name in set, or -1 without it.
func limitOf(set PolicySet, name string) int64 {
	i := slices.IndexFunc(set.List, func(p quota.Policy) bool { return p.Name == name })
	if i < 0 {
		return -1
	}
	return *set.List[i].Limit
}

// TestPolicyChangesReachTheOtherNodeWithinASecond: a policy created,
// changed and deleted through one node's catalog is seen so by another
// within a second, under a new version each time, and the other node's
// tenant hooks (the deny cache) hear of it.
func TestPolicyChangesReachTheOtherNodeWithinASecond(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, nodes, _ := mustNodes(t, testenv.Postgres(t), 2)
	admin := NewAdmin(store, nodes[0]) // node 0's admin writes
	var last PolicySet
	for _, n := range nodes { // both have the set cached, so only a message can change it
		s, err := n.PolicySet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.List) != 0 || s.Version == 0 {
			t.Fatalf("a fresh node's set: %+v, want no policies under a version", s)
		}
		last = s
	}
	changed := make(chan string, 10)
	nodes[1].OnTenantChange(func(id string) { changed <- id })

	for _, step := range []struct {
		name  string
		write func() error
		limit int64 // what the other node must see: -1 for no policy
	}{
		{"create", func() error { _, err := admin.CreatePolicy(ctx, "test", testPolicy("reports", 2)); return err }, 2},
		{"update", func() error {
			_, err := admin.UpdatePolicy(ctx, "test", "reports", func(p *quota.Policy) error { *p.Limit = 5; return nil })
			return err
		}, 5},
		{"delete", func() error { return admin.DeletePolicy(ctx, "test", "reports") }, -1},
	} {
		start := time.Now()
		if err := step.write(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		for {
			s, err := nodes[1].PolicySet(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if limitOf(s, "reports") == step.limit {
				if s.Version == last.Version {
					t.Errorf("%s: the set changed but kept version %d", step.name, s.Version)
				}
				last = s
				break
			}
			if time.Since(start) > time.Second {
				t.Fatalf("%s: the other node still sees limit %d after 1s, want %d", step.name, limitOf(s, "reports"), step.limit)
			}
			time.Sleep(10 * time.Millisecond)
		}
		select {
		case id := <-changed:
			if id != "" {
				t.Errorf("%s: OnTenantChange(%q), want \"\" (every tenant)", step.name, id)
			}
		case <-time.After(time.Second):
			t.Fatalf("%s: OnTenantChange not called on the other node", step.name)
		}
	}
	if got, err := nodes[1].Policies(ctx); err != nil || len(got) != 0 {
		t.Errorf("Policies after the delete: %v (%v), want none", got, err)
	}
}

// TestPolicySetIsCachedAndVersioned: the set is served from memory, a
// refresh picks up a change no message announced, and the version moves
// only when the list does.
func TestPolicySetIsCachedAndVersioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, nodes, _ := mustNodes(t, testenv.Postgres(t), 1)
	c := nodes[0]
	first, err := c.PolicySet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Written past the catalog: no invalidation.
	if _, err := store.CreatePolicy(ctx, "test", testPolicy("quiet", 3)); err != nil {
		t.Fatal(err)
	}
	if s, _ := c.PolicySet(ctx); len(s.List) != 0 || s.Version != first.Version {
		t.Fatalf("before a refresh: %+v, want the cached empty set of version %d", s, first.Version)
	}
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := c.PolicySet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if limitOf(second, "quiet") != 3 || second.Version <= first.Version {
		t.Fatalf("after a refresh: %+v, want quiet under a version above %d", second, first.Version)
	}
	// Nothing changed: a refresh and an invalidation reload the same list,
	// which keeps its version and its slice.
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Invalidate(ctx, KindPolicy, "quiet"); err != nil {
		t.Fatal(err)
	}
	third, err := c.PolicySet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if third.Version != second.Version || &third.List[0] != &second.List[0] {
		t.Errorf("reloaded unchanged: version %d (list %p), want version %d (list %p)", third.Version, third.List, second.Version, second.List)
	}
}

// heldPolicies reads the real store, then holds its first Policies read
// until the test releases it: the read has its answer from before the
// change the test then makes.
type heldPolicies struct {
	*catalogdb.Store
	once          sync.Once
	held, release chan struct{}
}

func (s *heldPolicies) Policies(ctx context.Context) ([]quota.Policy, error) {
	ps, err := s.Store.Policies(ctx)
	s.once.Do(func() { close(s.held); <-s.release })
	return ps, err
}

// TestAStalePolicyLoadDoesNotOutliveItsInvalidation: a load that read the
// policies before a change and ends after the change's invalidation must
// not cache (nor answer) what it read.
func TestAStalePolicyLoadDoesNotOutliveItsInvalidation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := catalogdb.NewStore(testenv.Postgres(t))
	rdb := testenv.Redis(t)
	src := &heldPolicies{Store: store, held: make(chan struct{}), release: make(chan struct{})}
	c := New(src, rdb, testenv.Prefix(t, rdb), slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
	got := make(chan []quota.Policy, 1)
	go func() {
		ps, err := c.Policies(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- ps
	}()
	<-src.held // the miss read no policy
	if _, err := NewAdmin(src, c).CreatePolicy(ctx, "test", testPolicy("late", 4)); err != nil {
		t.Fatal(err)
	}
	close(src.release)
	if ps := <-got; len(ps) != 1 || ps[0].Name != "late" {
		t.Errorf("the held lookup answered %v, want the policy created while it loaded", ps)
	}
	if ps, err := c.Policies(ctx); err != nil || len(ps) != 1 || ps[0].Name != "late" {
		t.Errorf("the next lookup: %v (%v), want the policy created while the miss loaded", ps, err)
	}
}
