package pending

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// This file is the Redis side of the worker's reconciliation: which tenants
// have usage to flush, taking and dropping batches, and repairing counters
// after Redis lost data. The Postgres side is internal/billing.

// ActiveTenants returns the tenants reported active since the worker last
// marked them done.
func (r *Usage) ActiveTenants(ctx context.Context) ([]string, error) {
	ids, err := r.Client().SMembers(ctx, r.ActiveKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("ratelimit: active tenants: %w", err)
	}
	return ids, nil
}

// SweepTenants finds every tenant with pending or in-flight usage by
// scanning the keyspace (every master of a cluster). It is the worker's
// safety net for tenants whose API node died before reporting them; its cost
// grows with the keyspace, so the worker runs it rarely.
func (r *Usage) SweepTenants(ctx context.Context) ([]string, error) {
	seen := map[string]struct{}{}
	var mu sync.Mutex
	scan := func(ctx context.Context, c *redis.Client) error {
		// pending and flushing hashes, and state hashes (which hold the
		// pending usage of tenants with state: a claim of one with nothing
		// pending claims nothing).
		for _, pat := range [][2]string{{":v1:{t:*", "}:pending"}, {":v1:{t:*", "}:flushing"}, {":v2:{t:*", "}"}} {
			suffix := pat[1]
			iter := c.Scan(ctx, 0, r.Prefix()+pat[0]+suffix, 1000).Iterator()
			for iter.Next(ctx) {
				k := iter.Val()
				start := strings.Index(k, "{t:") + 3
				end := strings.LastIndex(k, suffix)
				if start < 3 || end < start {
					continue
				}
				mu.Lock()
				seen[k[start:end]] = struct{}{}
				mu.Unlock()
			}
			if err := iter.Err(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := redisfn.ForEachMaster(ctx, r.Client(), scan); err != nil {
		return nil, fmt.Errorf("ratelimit: sweep: %w", err)
	}
	out := make([]string, 0, len(seen))
	for id := range seen {
		out = append(out, id)
	}
	// A state hash holds pending usage only for some of its life: keep the
	// tenants that have some (or a pending hash), in pipelined checks.
	var kept []string
	for start := 0; start < len(out); start += 500 {
		ids := out[start:min(start+500, len(out))]
		has, err := r.Pipelined(ctx, len(ids), func(i int) (redisfn.Fn, []string, []any) {
			return redisfn.FnPending, r.PendingKeys(ids[i]), []any{"any"}
		})
		if err != nil {
			return nil, fmt.Errorf("ratelimit: sweep: %w", err)
		}
		for i, id := range ids {
			if n, err := has[i].Int(); err == nil && n == 1 {
				kept = append(kept, id)
			}
		}
	}
	return kept, nil
}

// batchIDs numbers the batch ids this process proposes, after a random
// prefix of its own: as unique as random ones, and cheaper.
var batchIDs struct {
	once   sync.Once
	prefix string
	n      atomic.Uint64
}

func newBatchID() string {
	batchIDs.once.Do(func() {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		batchIDs.prefix = hex.EncodeToString(b)
	})
	return batchIDs.prefix + fmt.Sprintf("%016x", batchIDs.n.Add(1))
}

// pipelinePart is the most calls Claim and Finish send in one pipeline,
// so that the answers to one pipeline come back well within the client's
// read timeout also when Redis is busy.
const pipelinePart = 500

// pipelinedParts is pipelined in pipelines of at most pipelinePart calls,
// one after the other.
func (r *Usage) pipelinedParts(ctx context.Context, n int, each func(i int) (redisfn.Fn, []string, []any)) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, 0, n)
	for start := 0; start < n; start += pipelinePart {
		part, err := r.Pipelined(ctx, min(pipelinePart, n-start), func(i int) (redisfn.Fn, []string, []any) { return each(start + i) })
		if err != nil {
			return nil, err
		}
		cmds = append(cmds, part...)
	}
	return cmds, nil
}

// claimCall is the most tenants one claim call takes (lua/claim.lua): a
// call costs Redis more than a tenant's claim in it does, and at 64 a call
// holds Redis for about half a millisecond.
const claimCall = 64

// claimCalls splits the indices of tenantIDs into claim calls: calls of at
// most claimCall tenants, on a cluster each of tenants of one hash slot
// (the keys of one call must share it).
func (r *Usage) claimCalls(tenantIDs []string) [][]int {
	var groups [][]int
	if _, cluster := r.Client().(*redis.ClusterClient); cluster {
		bySlot := map[int]int{} // slot -> its group's index
		for i, id := range tenantIDs {
			slot := redisfn.KeySlot("t:" + id)
			g, ok := bySlot[slot]
			if !ok {
				g = len(groups)
				bySlot[slot] = g
				groups = append(groups, nil)
			}
			groups[g] = append(groups[g], i)
		}
	} else {
		all := make([]int, len(tenantIDs))
		for i := range all {
			all[i] = i
		}
		groups = [][]int{all}
	}
	var calls [][]int
	for _, g := range groups {
		for len(g) > 0 {
			n := min(claimCall, len(g))
			calls = append(calls, g[:n:n])
			g = g[n:]
		}
	}
	return calls
}

// Claim takes the pending usage of each tenant as a batch (or returns the
// batch already in flight), up to claimCall tenants a call, pipelined (a
// round trip per pipelinePart tenants or so). Tenants with nothing to flush
// are left out. drop, when not nil, holds for each tenant the id of a batch
// Postgres recorded and Redis still holds in flight, or "": that batch is
// dropped first, in the same call (as Finish would), so that the claim
// takes the usage pending since.
func (r *Usage) Claim(ctx context.Context, tenantIDs, drop []string) ([]quota.Batch, error) {
	proposed := make([]string, len(tenantIDs))
	calls := r.claimCalls(tenantIDs)
	ttl := quota.FlushingTTL.Milliseconds()
	answers := make([][]any, len(tenantIDs))
	for start := 0; start < len(calls); {
		end, tenants := start, 0
		for end < len(calls) && (end == start || tenants+len(calls[end]) <= pipelinePart) {
			tenants += len(calls[end])
			end++
		}
		part := calls[start:end]
		cmds, err := r.Pipelined(ctx, len(part), func(c int) (redisfn.Fn, []string, []any) {
			call := part[c]
			keys := make([]string, 0, 3*len(call))
			args := make([]any, 1, 1+2*len(call))
			args[0] = ttl
			for _, i := range call {
				id := tenantIDs[i]
				proposed[i] = newBatchID()
				dropID := ""
				if drop != nil {
					dropID = drop[i]
				}
				keys = append(keys, r.Key(id, "pending"), r.Key(id, "flushing"), r.StateKey(id))
				args = append(args, proposed[i], dropID)
			}
			return redisfn.FnClaim, keys, args
		})
		if err != nil {
			return nil, fmt.Errorf("ratelimit: claim: %w", err)
		}
		for c, cmd := range cmds {
			each, err := cmd.Slice()
			if err == nil && len(each) != len(part[c]) {
				err = fmt.Errorf("%d answers for %d tenants", len(each), len(part[c]))
			}
			if err != nil {
				return nil, fmt.Errorf("ratelimit: claim: %w", err)
			}
			for k, i := range part[c] {
				flat, ok := each[k].([]any)
				if !ok {
					return nil, fmt.Errorf("ratelimit: claim %s: answer %T", tenantIDs[i], each[k])
				}
				answers[i] = flat
			}
		}
		start = end
	}
	var out []quota.Batch
	for i, flat := range answers {
		if len(flat) == 0 {
			continue
		}
		h := make(map[string]string, len(flat)/2)
		for j := 0; j+1 < len(flat); j += 2 {
			k, _ := flat[j].(string)
			v, _ := flat[j+1].(string)
			h[k] = v
		}
		b := quota.Batch{TenantID: tenantIDs[i], ID: h["batch"], Resumed: h["batch"] != proposed[i]}
		var err error
		if seq, ok := h["seq"]; ok {
			if b.Seq, err = strconv.ParseInt(seq, 10, 64); err != nil || b.Seq <= 0 {
				b.Seq, err = 0, fmt.Errorf("batch sequence %q", seq)
			}
		}
		if prev, ok := h["prev"]; ok && err == nil {
			if p, perr := strconv.ParseInt(prev, 10, 64); perr != nil || p < 0 {
				err = fmt.Errorf("batch's previous sequence %q", prev)
			} else {
				b.Prev = &p
			}
		}
		delete(h, "batch")
		delete(h, "seq")
		delete(h, "prev")
		if err == nil {
			b.Rows, err = ParsePending(h)
		}
		if err != nil {
			b.Rows, b.Err = nil, fmt.Errorf("ratelimit: claim %s: %w", tenantIDs[i], err)
		}
		out = append(out, b)
	}
	return out, nil
}

// InFlight reports, for each batch, whether its tenant's batch in flight is
// still that batch (it was neither finished nor replaced by a later one),
// pipelined.
func (r *Usage) InFlight(ctx context.Context, batches []quota.Batch) ([]bool, error) {
	cmds, err := r.Client().Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, b := range batches {
			p.HGet(ctx, r.Key(b.TenantID, "flushing"), "batch")
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("ratelimit: batches in flight: %w", err)
	}
	live := make([]bool, len(batches))
	for i, cmd := range cmds {
		id, err := cmd.(*redis.StringCmd).Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, fmt.Errorf("ratelimit: batches in flight: %w", err)
		default:
			live[i] = id == batches[i].ID
		}
	}
	return live, nil
}

// Finish drops batches Postgres has recorded, pipelined (a round trip per
// pipelinePart batches).
func (r *Usage) Finish(ctx context.Context, batches []quota.Batch) error {
	_, err := r.pipelinedParts(ctx, len(batches), func(i int) (redisfn.Fn, []string, []any) {
		b := batches[i]
		return redisfn.FnFinish, []string{r.Key(b.TenantID, "flushing")}, []any{b.ID}
	})
	if err != nil {
		return fmt.Errorf("ratelimit: finish: %w", err)
	}
	return nil
}

// Idle takes tenants out of the active set: a claim just found nothing
// pending and nothing in flight for them. (A tenant that counts usage
// after that claim is reported again by its API node within a second, and
// the sweep finds it in any case.)
func (r *Usage) Idle(ctx context.Context, tenantIDs []string) error {
	if len(tenantIDs) == 0 {
		return nil
	}
	members := make([]any, len(tenantIDs))
	for i, id := range tenantIDs {
		members[i] = id
	}
	if err := r.Client().SRem(ctx, r.ActiveKey(), members...).Err(); err != nil {
		return fmt.Errorf("ratelimit: idle: %w", err)
	}
	return nil
}

// Epoch keys tell the worker that Redis lost its data (first start, a restart
// without persistence, FLUSHALL, a failover to an empty replica). A cluster
// can lose the data of one master and not the others, so there is one epoch
// key per master: a key whose hash tag lands in a slot that master serves.
// The keys are derived again from CLUSTER SLOTS on every call, so they
// follow slots that move; a resharding that gives a master another key costs
// one needless restore, which is harmless (a restore never lowers a counter).
//
// A key holds epochIntact, or epochRestoring from the start of a restore
// until it succeeded: a restore that fails (Postgres down, a timeout) is
// retried by the next cycle rather than taken as done.
const (
	epochIntact    = "intact"
	epochRestoring = "restoring"
)

// epochKeys returns one epoch key per master (one key on a single server).
func (r *Usage) epochKeys(ctx context.Context) ([]string, error) {
	cc, ok := r.Client().(*redis.ClusterClient)
	if !ok {
		return []string{r.Prefix() + ":v1:epoch"}, nil
	}
	shards, err := cc.ClusterShards(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("ratelimit: epoch keys: %w", err)
	}
	master := func(slot int) string { // "" when no master serves it
		for _, sh := range shards {
			for _, rg := range sh.Slots {
				if int(rg.Start) <= slot && slot <= int(rg.End) {
					for _, n := range sh.Nodes {
						if n.Role == "master" {
							return n.ID
						}
					}
				}
			}
		}
		return ""
	}
	masters := map[string]bool{}
	for _, sh := range shards {
		if len(sh.Slots) > 0 {
			if m := master(int(sh.Slots[0].Start)); m != "" {
				masters[m] = true
			}
		}
	}
	// The smallest tags that land on each master, so that the keys stay the
	// same as long as the slots do.
	seen := map[string]bool{}
	var keys []string
	for n := 0; len(keys) < len(masters) && n < 1<<20; n++ {
		tag := "e:" + strconv.Itoa(n)
		if m := master(redisfn.KeySlot(tag)); m != "" && !seen[m] {
			seen[m] = true
			keys = append(keys, r.Prefix()+":v1:{"+tag+"}:epoch")
		}
	}
	if len(keys) < len(masters) {
		return nil, fmt.Errorf("ratelimit: epoch keys: no tag found for %d of %d masters", len(masters)-len(keys), len(masters))
	}
	return keys, nil
}

// EpochLost reports whether Redis lost data since the last restore: the
// epoch key of some master is gone, or a restore began and has not
// succeeded. It extends the keys' lives; it changes nothing else, so the
// answer stays true until MarkRestored.
func (r *Usage) EpochLost(ctx context.Context) (bool, error) {
	keys, err := r.epochKeys(ctx)
	if err != nil {
		return false, err
	}
	gets := make([]*redis.StringCmd, len(keys))
	_, _ = r.Client().Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			gets[i] = p.Get(ctx, k)
			p.Expire(ctx, k, redisfn.ActiveTTL)
		}
		return nil
	})
	lost := false
	for _, g := range gets {
		v, err := g.Result()
		switch {
		case errors.Is(err, redis.Nil):
			lost = true
		case err != nil:
			return false, fmt.Errorf("ratelimit: epoch: %w", err)
		case v == epochRestoring:
			lost = true
		}
	}
	return lost, nil
}

// MarkRestoring marks every master's epoch as being restored, before a
// restore starts: until MarkRestored, EpochLost reports a loss.
func (r *Usage) MarkRestoring(ctx context.Context) error {
	return r.markEpoch(ctx, epochRestoring, false)
}

// MarkRestored marks the epochs intact after a successful restore, except on
// a master whose key vanished since MarkRestoring: that master lost its data
// again during the restore, and the next EpochLost reports it.
func (r *Usage) MarkRestored(ctx context.Context) error {
	return r.markEpoch(ctx, epochIntact, true)
}

func (r *Usage) markEpoch(ctx context.Context, value string, onlyExisting bool) error {
	keys, err := r.epochKeys(ctx)
	if err != nil {
		return err
	}
	cmds := make([]redis.Cmder, len(keys))
	_, _ = r.Client().Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			if onlyExisting {
				cmds[i] = p.SetXX(ctx, k, value, redisfn.ActiveTTL)
			} else {
				cmds[i] = p.Set(ctx, k, value, redisfn.ActiveTTL)
			}
		}
		return nil
	})
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("ratelimit: epoch: %w", err)
		}
	}
	return nil
}

// prepaidKeep is how long past its period's end a prepaid tenant's draws
// are kept (admit.lua's PREPAID_KEEP_US).
const prepaidKeep = 40 * 24 * time.Hour

// RestorePrepaid gives prepaid tenants' credit draws back from the ledger
// after Redis lost data (lua/restore_prepaid.lua), pipelined.
func (r *Usage) RestorePrepaid(ctx context.Context, recs []quota.PrepaidRecorded) error {
	_, err := r.Pipelined(ctx, len(recs), func(i int) (redisfn.Fn, []string, []any) {
		rec := recs[i]
		return redisfn.FnRestorePrepaid, []string{r.Key(rec.TenantID, "mq")},
			[]any{rec.Period, rec.Millicents, rec.Prev, rec.PrevMillicents, rec.Until.Add(prepaidKeep).UnixMilli()}
	})
	if err != nil {
		return fmt.Errorf("ratelimit: restore prepaid: %w", err)
	}
	return nil
}

// meterRestoreArgs are restore_meters's ARGV (lua/restore_meters.lua) for
// rec at at.
func meterRestoreArgs(rec quota.Recorded, at time.Time) []any {
	day, month := redisfn.PeriodIDs(rec.Calendar, at)
	_, end := rec.Calendar.Period(at)
	var mc int64
	for _, m := range rec.Meters {
		mc += m.OverageMillicents
	}
	args := []any{day, month, end.Add(time.Hour).UnixMilli(), mc}
	for _, m := range rec.Meters {
		args = append(args, m.Meter, m.DayUnits, m.MonthUnits, m.MonthOverage)
	}
	return args
}

// Restore repairs the tenants' day and month counters for the periods
// containing at (see lua/restore.lua), pipelined: each record's day and
// month are those of its Calendar; its meters' too (lua/restore_meters.lua).
// The month's overage comes back with its units (the tier's, and the
// meters' millicents that the spend cap counts), so that the cap's room
// is what the ledger left of it, not full again.
func (r *Usage) Restore(ctx context.Context, at time.Time, recs []quota.Recorded) error {
	at = at.UTC()
	day, month := quota.DayStart(at), quota.MonthStart(at)
	y, m, _ := at.Date()
	type restoreCall struct {
		f    redisfn.Fn
		keys []string
		args []any
	}
	var calls []restoreCall
	for _, rec := range recs {
		if len(rec.Meters) > 0 {
			calls = append(calls, restoreCall{redisfn.FnRestoreMeters, []string{r.Key(rec.TenantID, "mq")}, meterRestoreArgs(rec, at)})
		}
		keys := r.StateKeys(rec.TenantID, "pending")
		if cal := rec.Calendar; !cal.IsDefault() {
			ds, de := cal.Day(at)
			ps, pe := cal.Period(at)
			calls = append(calls, restoreCall{redisfn.FnRestore, keys, []any{cal.DayID(at), cal.PeriodID(at), ds.Unix(), ps.Unix(),
				rec.DayUnits, rec.MonthUnits, rec.DayGrant, rec.MonthGrant, rec.MonthOverage, de.Unix(), pe.Unix()}})
			continue
		}
		calls = append(calls, restoreCall{redisfn.FnRestore, keys, []any{day.Unix() / 86400, y*100 + int(m), day.Unix(), month.Unix(),
			rec.DayUnits, rec.MonthUnits, rec.DayGrant, rec.MonthGrant, rec.MonthOverage}})
	}
	_, err := r.Pipelined(ctx, len(calls), func(i int) (redisfn.Fn, []string, []any) {
		return calls[i].f, calls[i].keys, calls[i].args
	})
	if err != nil {
		return fmt.Errorf("ratelimit: restore: %w", err)
	}
	return nil
}
