package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

// privateLibrary gives r a library of its own (the same code, another
// version), deleted at the test's end, so that a test may delete it from
// Redis without disturbing the tests that share the server.
func privateLibrary(tb testing.TB, r *stack) string {
	tb.Helper()
	*r = *stackOn(redisfn.NewVersion(r.Client(), r.Prefix(), "a test's own version: "+testenv.RandomHex(8)))
	l := r.FunctionLibrary()
	tb.Cleanup(func() { deleteLibrary(tb, r.Client(), l) })
	return l
}

// deleteLibrary removes l from Redis (every master of a cluster), as a
// restart without persistence or a new master would (never FUNCTION
// FLUSH: the server's other libraries are not the test's).
func deleteLibrary(tb testing.TB, c redis.UniversalClient, l string) {
	tb.Helper()
	if err := redisfn.ForEachMaster(context.Background(), c, func(ctx context.Context, n *redis.Client) error {
		if err := n.FunctionDelete(ctx, l).Err(); err != nil && !redis.HasErrorPrefix(err, "Library not found") {
			return err
		}
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
}

// TestFunctionReload deletes the library and checks that Admit still works:
// the FCALL answered "Function not found" loads the library (FUNCTION LOAD)
// and calls once more. A hook records the commands, so the test knows that
// the reload ran (another test could load the library between the delete
// and the admission; then it deletes and tries again).
func TestFunctionReload(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t).(*redis.Client)
	rec := &cmdRecorder{}
	c.AddHook(rec)
	r, _ := mustRunner(t, c)
	l := privateLibrary(t, r)
	ctx := context.Background()
	for try := 0; ; try++ {
		deleteLibrary(t, c, l)
		rec.reset()
		d := mustAdmit(t, r, quota.Request{TenantID: newTenant(), Meter: "demo", Cost: 1, Limits: allLimits()})
		if !d.Allowed {
			t.Fatalf("after FUNCTION DELETE: got %s, want allowed", fmtDecision(d))
		}
		if got := rec.names(); fmt.Sprint(got) == "[fcall function fcall]" {
			break
		} else if try == 5 {
			t.Fatalf("commands after FUNCTION DELETE: got %v, want [fcall function fcall]", got)
		}
	}
	if libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: l}).Result(); err != nil || len(libs) != 1 {
		t.Errorf("FUNCTION LIST after the reload: got %v, %v; want the library", libs, err)
	}
}

// TestFunctionReloadInPipelines: with the library deleted, the calls that
// go in pipelines (the batcher's admissions of concurrent requests, the
// worker's pending checks, claims and finishes, the dashboard's
// PendingMany) each load it and run once: every admission is counted
// exactly once and the usage is flushed exactly once. On one server and
// on a 3-master cluster (where each master loses it).
func TestFunctionReloadInPipelines(t *testing.T) {
	t.Parallel()
	for name, newClient := range map[string]func(testing.TB) redis.UniversalClient{
		"single": testenv.Redis, "cluster": testenv.Cluster,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := newClient(t)
			r, _ := mustRunner(t, c)
			l := privateLibrary(t, r)
			tenants := []string{newTenant(), newTenant(), newTenant()}
			const each = 40
			deleteEverywhere := func() { t.Helper(); deleteLibrary(t, c, l) }
			deleteEverywhere()
			before := r.batch.shared.Load()
			var wg sync.WaitGroup
			start := make(chan struct{})
			for _, tenant := range tenants {
				for range each {
					wg.Go(func() {
						<-start
						if d := mustAdmit(t, r, quota.Request{TenantID: tenant, Meter: "demo", Cost: 1, Now: time.Now(),
							Limits: quota.Limits{DailyQuota: i64(1000)}}); !d.Allowed {
							t.Errorf("refused: %s", fmtDecision(d))
						}
					})
				}
			}
			close(start)
			wg.Wait()
			if r.batch.shared.Load() == before {
				t.Log("no admissions shared a pipeline this time")
			}
			deleteEverywhere()
			many, err := r.PendingMany(ctx, tenants)
			if err != nil {
				t.Fatal(err)
			}
			for _, tenant := range tenants {
				if rows := many[tenant]; len(rows) != 1 || rows[0].Units != each || rows[0].Requests != each {
					t.Errorf("%s pending: %+v, want %d units and requests", tenant, rows, each)
				}
			}
			deleteEverywhere()
			batches, err := r.Claim(ctx, tenants, nil)
			if err != nil || len(batches) != len(tenants) {
				t.Fatalf("Claim: %d batches, %v; want %d", len(batches), err, len(tenants))
			}
			for _, b := range batches {
				if len(b.Rows) != 1 || b.Rows[0].Units != each || b.Resumed {
					t.Errorf("batch of %s: %+v", b.TenantID, b)
				}
			}
			deleteEverywhere()
			if err := r.Finish(ctx, batches); err != nil {
				t.Fatal(err)
			}
			deleteEverywhere()
			if again, err := r.Claim(ctx, tenants, nil); err != nil || len(again) != 0 {
				t.Errorf("Claim after Finish: %+v, %v; want nothing left to flush", again, err)
			}
		})
	}
}

type cmdRecorder struct {
	mu   sync.Mutex
	cmds []string
}

func (h *cmdRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cmdRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *cmdRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.cmds = append(h.cmds, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *cmdRecorder) reset() { h.mu.Lock(); h.cmds = nil; h.mu.Unlock() }
func (h *cmdRecorder) names() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.cmds...)
}
