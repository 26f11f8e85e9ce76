package billing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/quota"
)

// chunk is how many tenants one Redis pipeline of the repair carries, and
// the fewest a chunk of a flush carries.
const chunk = 500

// maxChunk is the most tenants a flush claims in one Redis pipeline and
// records in one Postgres transaction. A chunk's fixed costs (its round
// trips, its statements' planning, its commit) are spread over its
// tenants; a flush of many tenants makes its chunks bigger, up to this.
const maxChunk = 2000

// chunkSize is how many tenants each chunk of a flush of n tenants moving
// parallel chunks at once carries: at least four chunks for each one moved
// at once, so that their Redis round trips and Postgres transactions
// overlap, between chunk and maxChunk.
func chunkSize(n, parallel int) int {
	return min(max(n/(4*max(parallel, 1)), chunk), maxChunk)
}

// batchRetention is how long usage_batches remembers a recorded batch's id.
// A batch can be replayed only while its in-flight hash lives
// (quota.FlushingTTL from its claim, which comes before its record); the
// margin covers clocks that disagree between workers and Redis.
const batchRetention = quota.FlushingTTL + 7*24*time.Hour

// pruneBatch and pruneStatements bound the pruning of one flush: 100,000
// ids, in statements short enough not to hold up the flushes of other
// workers. A flush records far fewer batches, so pruning keeps up.
const (
	pruneBatch      = 5000
	pruneStatements = 20
)

// pendingUsage is the admission side of the flush and the repair, where
// the usage counted at admission waits (*pending.Usage, in quotaredis.Store): the tenants to
// flush, their batches claimed and finished, and the counters restored after
// a loss.
type pendingUsage interface {
	ActiveTenants(ctx context.Context) ([]string, error)
	SweepTenants(ctx context.Context) ([]string, error)
	Claim(ctx context.Context, tenantIDs, drop []string) ([]quota.Batch, error)
	Finish(ctx context.Context, batches []quota.Batch) error
	InFlight(ctx context.Context, batches []quota.Batch) ([]bool, error)
	Idle(ctx context.Context, tenantIDs []string) error
	EpochLost(ctx context.Context) (bool, error)
	MarkRestoring(ctx context.Context) error
	Restore(ctx context.Context, at time.Time, recs []quota.Recorded) error
	RestorePrepaid(ctx context.Context, recs []quota.PrepaidRecorded) error
	MarkRestored(ctx context.Context) error
}

// Reconciler moves usage counted in Redis into the usage ledger, exactly
// once, and repairs Redis' quota counters after Redis lost data.
//
// Exactly once: a tenant's pending usage is claimed in Redis as a batch with
// an id and a sequence (lua/claim.lua); in the same transaction as the
// batch's usage rows the batch becomes its tenant's last recorded
// (usage_flushed), and adds its rows, only if its sequence is greater than
// the last's (newBatches); the batch is dropped from Redis only after the
// commit, by the tenant's next claim (which names it: one call a tenant a
// cycle) or by Close. A crash between any two steps leaves the batch in
// flight, and the next cycle (of this or another worker) flushes that same
// batch again, which Postgres then counts once, and drops it. Two workers
// claiming the same tenant get the same batch.
//
// A tenant whose claim finds nothing pending and nothing in flight leaves
// the active set; one whose batch was recorded stays in it until then, so
// that its next cycle drops that batch.
//
// Refunds: a refund takes its units out of the pending usage, wherever the
// refunded request's units are by then. Once they were claimed, the pending
// hash holds negative units, which the tenant's next batch subtracts from the
// ledger's row (clamped at zero), after the batch that added them.
//
// Stuck batches: a batch Postgres rejects for its data stays in flight and is
// retried each cycle, alone, while every other tenant's batches are recorded;
// the worker's metrics count it and the log names it.
type Reconciler struct {
	db  *pgxpool.Pool
	rl  pendingUsage
	now func() time.Time
	log *slog.Logger
	// SweepEvery is how often the keyspace is scanned for tenants no API
	// node reported (their node died first).
	SweepEvery time.Duration
	lastSweep  time.Time
	// Share, when set, is this worker's share of the tenants when several
	// run at once (worker.Shares): Flush flushes only the active tenants it
	// Owns, and sweeps the keyspace only while it Leads, flushing every
	// tenant the sweep finds (so that the leader's FlushedThrough, which
	// gates the closing of months, speaks for all tenants). Nil: this
	// worker flushes every tenant and sweeps.
	Share Share
	// Parallel is how many chunks of tenants a flush moves at once (its
	// Redis round trips and Postgres transactions overlap); below 2, one
	// after the other.
	Parallel int

	// hook, in tests, runs between the steps of a flush; an error stops the
	// flush there, as a crash would.
	hook func(step string) error

	// Counters for the worker's metrics.
	TenantsFlushed, UnitsFlushed, Batches atomic.Int64
	// LateCredits and LateCreditCents count the credits given back for
	// usage recorded after its period's invoice was final, and their sum;
	// LateRaises the times such usage raised a final period's charge
	// (not billed). See "Late usage" in late.go.
	LateCredits, LateCreditCents, LateRaises atomic.Int64
	// RescuedBatches counts the batches recorded although their sequence
	// was below their tenant's last (Redis' clock went back: newBatches).
	RescuedBatches atomic.Int64
	// OlderDataBatches counts the batches not recorded because Redis
	// claimed them from older data (newBatches): their usage was recorded
	// already.
	OlderDataBatches atomic.Int64

	mu      sync.Mutex            // guards the fields below, read by the invoicer and metrics
	flushed map[string]struct{}   // tenants recorded since the last TakeFlushed
	stuck   map[string]stuckBatch // by tenant id
	// recorded holds, by tenant id, the batch this reconciler recorded last
	// and has not dropped from Redis yet: the tenant's next claim drops it
	// (or Close does).
	recorded map[string]string
	sweptAt  time.Time // start of the last completed flush that swept the keyspace
	// watermark is the leader's last published FlushedThrough
	// (flush_watermark), as a worker that does not lead last read it.
	watermark time.Time
}

// Share is a worker's share of the tenants (see Reconciler.Share).
type Share interface {
	// Owns reports whether this worker flushes the tenant's usage.
	Owns(tenantID string) bool
	// Leads reports whether this worker runs the steps done by one worker
	// for all tenants (the sweep among them).
	Leads() bool
}

// stuckBatch is a batch Postgres rejected, left in flight.
type stuckBatch struct {
	id     string
	oldest time.Time // its first hour of usage; zero when unknown
}

// TakeFlushed returns the tenants whose usage was recorded since the last
// call (the invoices step refreshes their drafts).
func (r *Reconciler) TakeFlushed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.flushed))
	for id := range r.flushed {
		out = append(out, id)
	}
	r.flushed = nil
	return out
}

// StuckBatches returns how many batches are left in flight because Postgres
// rejected them.
func (r *Reconciler) StuckBatches() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.stuck)
}

func (r *Reconciler) stuckTenants() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Collect(maps.Keys(r.stuck))
}

// FlushedThrough returns a time before which all usage counted in Redis is
// in the ledger: the start of the last flush that swept the keyspace and
// completed, or the first hour of a batch still stuck if that is earlier.
// It is zero until such a flush. With a Share, only the leader sweeps: it
// publishes its FlushedThrough to flush_watermark after each sweep, and the
// other workers read it there each cycle and use it in place of a sweep of
// their own (the leader's sweep flushed their tenants too, its stuck
// batches among them). The invoices step finalizes a month only once this
// is past the month's end. (A refund that arrives after that, for a request
// of the month, still changes the month's usage, not its final invoice:
// what it gives back becomes a credit, see "Late usage" in late.go.)
func (r *Reconciler) FlushedThrough() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.sweptAt
	if r.watermark.After(t) {
		t = r.watermark
	}
	for _, b := range r.stuck {
		if b.oldest.Before(t) {
			t = b.oldest
		}
	}
	return t
}

// NewReconciler returns a Reconciler on the ledger db and the Redis runner rl.
func NewReconciler(db *pgxpool.Pool, rl pendingUsage, now func() time.Time, log *slog.Logger) *Reconciler {
	return &Reconciler{db: db, rl: rl, now: now, log: log, SweepEvery: 5 * time.Minute, hook: func(string) error { return nil }}
}

// Flush flushes every tenant reported active (and, every SweepEvery, every
// tenant with usage left in Redis), then prunes batch ids too old to be
// replayed. Its work grows with the tenants active since the last cycle, not
// with all tenants. With a Share, only this worker's share of them, and the
// sweep only on the leader; a worker that does not lead flushes nothing
// while Redis reports a loss not yet repaired (Repair, which the leader runs).
func (r *Reconciler) Flush(ctx context.Context) error {
	if r.Share != nil && !r.Share.Leads() {
		// After Redis lost data the leader restores the counters from the
		// ledger plus the usage pending in Redis: usage another worker
		// moved from one to the other meanwhile would be in neither. Until
		// the leader has restored them, only it flushes.
		if lost, err := r.rl.EpochLost(ctx); err != nil || lost {
			return err
		}
	}
	began := r.now()
	ids, err := r.rl.ActiveTenants(ctx)
	if err != nil {
		return err
	}
	if r.Share != nil {
		ids = slices.DeleteFunc(ids, func(id string) bool { return !r.Share.Owns(id) })
		r.dropMoved(ctx)
	}
	// Stuck batches are retried every cycle, also those a sweep found.
	ids = union(ids, r.stuckTenants())
	swept := began.Sub(r.lastSweep) >= r.SweepEvery && (r.Share == nil || r.Share.Leads())
	if swept {
		all, err := r.rl.SweepTenants(ctx)
		if err != nil {
			return err
		}
		ids = union(ids, all)
	}
	if err := r.flushChunks(ctx, ids); err != nil {
		return err
	}
	if swept {
		// Only a flush that completed counts as a sweep: after a failed one
		// the next cycle sweeps again, or the tenants only the sweep found
		// would wait SweepEvery.
		r.lastSweep = began
		r.mu.Lock()
		r.sweptAt = began // a complete flush that swept the keyspace (FlushedThrough)
		r.mu.Unlock()
		if r.Share != nil {
			if err := r.publishWatermark(ctx); err != nil {
				return err
			}
		}
	}
	if r.Share != nil && !r.Share.Leads() {
		if err := r.readWatermark(ctx); err != nil {
			return err
		}
	}
	return r.prune(ctx)
}

// publishWatermark raises flush_watermark to this worker's FlushedThrough
// (the leader's, after a sweep), for the workers that do not sweep. It is
// never lowered: a time before which all usage counted was in the ledger
// stays one.
func (r *Reconciler) publishWatermark(ctx context.Context) error {
	t := r.FlushedThrough()
	if t.IsZero() {
		return nil
	}
	if _, err := r.db.Exec(ctx, `
		INSERT INTO flush_watermark AS w (flushed_through) VALUES ($1)
		ON CONFLICT (id) DO UPDATE SET flushed_through = greatest(w.flushed_through, EXCLUDED.flushed_through)`, t); err != nil {
		return fmt.Errorf("billing: publish flushed through: %w", err)
	}
	return nil
}

// readWatermark reads flush_watermark (FlushedThrough); none yet leaves
// what this worker read before.
func (r *Reconciler) readWatermark(ctx context.Context) error {
	var t time.Time
	switch err := r.db.QueryRow(ctx, `SELECT flushed_through FROM flush_watermark`).Scan(&t); {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("billing: read flushed through: %w", err)
	}
	r.mu.Lock()
	r.watermark = t
	r.mu.Unlock()
	return nil
}

// flushChunks flushes ids chunk by chunk, Parallel chunks at once, and
// returns the first error (the chunks not begun by then are left to the
// next cycle).
func (r *Reconciler) flushChunks(ctx context.Context, ids []string) error {
	size := chunkSize(len(ids), r.Parallel)
	if r.Parallel < 2 || len(ids) <= size {
		for start := 0; start < len(ids); start += size {
			if err := r.flushTenants(ctx, ids[start:min(start+size, len(ids))]); err != nil {
				return err
			}
		}
		return nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan []string)
	var wg sync.WaitGroup
	for range r.Parallel {
		wg.Go(func() {
			for ids := range next {
				if err := r.flushTenants(ctx, ids); err != nil {
					cancel(err)
				}
			}
		})
	}
	for start := 0; start < len(ids) && ctx.Err() == nil; start += size {
		select {
		case next <- ids[start:min(start+size, len(ids))]:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

func union(a, b []string) []string {
	seen := make(map[string]struct{}, len(a)+len(b))
	out := make([]string, 0, len(a)+len(b))
	for _, s := range append(a, b...) {
		if _, ok := seen[s]; !ok {
			seen[s] = struct{}{}
			out = append(out, s)
		}
	}
	return out
}

// flushTenants flushes the tenants' usage. A tenant whose claim resumed a
// batch left in flight gets a second claim in the same cycle, so its newer
// pending usage does not wait for another cycle.
func (r *Reconciler) flushTenants(ctx context.Context, ids []string) error {
	for round := 0; len(ids) > 0 && round < 3; round++ {
		resumed, err := r.flushOnce(ctx, ids)
		if err != nil {
			return err
		}
		ids = resumed
	}
	return nil
}

func (r *Reconciler) flushOnce(ctx context.Context, ids []string) (resumed []string, err error) {
	drop := r.takeRecorded(ids)
	batches, err := r.rl.Claim(ctx, ids, drop)
	if err != nil {
		return nil, err
	}
	// At once: usage counted after the claim is reported again by its API
	// node within a second (and the sweep finds it in any case).
	if err := r.rl.Idle(ctx, idle(ids, batches)); err != nil {
		return nil, err
	}
	if drop != nil {
		if err := r.hook("finished"); err != nil { // the batches recorded before dropped
			return nil, err
		}
	}
	if err := r.hook("claimed"); err != nil {
		return nil, err
	}
	recorded, err := r.recordBatches(ctx, batches)
	if err != nil {
		return nil, err
	}
	r.noteRecorded(ids, batches, recorded)
	if len(recorded) > 0 {
		if err := r.hook("committed"); err != nil {
			return nil, err
		}
	}
	// The batches of tenants another worker flushes (the leader's sweep
	// finds them) are dropped at once: left in flight, their owner's next
	// claim would find them and record them again.
	var others []quota.Batch
	for _, b := range recorded {
		if !r.owns(b.TenantID) {
			others = append(others, b)
		}
	}
	if err := r.rl.Finish(ctx, others); err != nil {
		return nil, err
	}
	for _, b := range recorded {
		if b.Resumed {
			resumed = append(resumed, b.TenantID)
		}
	}
	return resumed, nil
}

// idle returns the tenants of ids of which the claim returned no batch:
// nothing pending, nothing in flight.
func idle(ids []string, batches []quota.Batch) []string {
	if len(batches) == len(ids) {
		return nil
	}
	has := make(map[string]struct{}, len(batches))
	for _, b := range batches {
		has[b.TenantID] = struct{}{}
	}
	var out []string
	for _, id := range ids {
		if _, ok := has[id]; !ok {
			out = append(out, id)
		}
	}
	return out
}

// takeRecorded returns, aligned with ids, the batches this reconciler
// recorded of those tenants and has not dropped ("" for none), which their
// claim is to drop, and forgets them; nil when there are none.
func (r *Reconciler) takeRecorded(ids []string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.recorded) == 0 {
		return nil
	}
	var drop []string
	for i, id := range ids {
		if b, ok := r.recorded[id]; ok {
			if drop == nil {
				drop = make([]string, len(ids))
			}
			drop[i] = b
			delete(r.recorded, id)
		}
	}
	return drop
}

// owns reports whether this reconciler flushes the tenant (Share).
func (r *Reconciler) owns(tenantID string) bool {
	return r.Share == nil || r.Share.Owns(tenantID)
}

// dropMoved drops from Redis the batches this reconciler recorded of
// tenants whose shard another worker took since, and forgets them: their
// next claim is the other worker's. Those it cannot drop (Redis down) the
// other worker finds recorded and drops.
func (r *Reconciler) dropMoved(ctx context.Context) {
	if err := r.dropRecorded(ctx, r.owns); err != nil {
		r.log.Warn("recorded batches of tenants another worker took left in flight: it drops them", "err", err)
	}
}

// Close drops from Redis the batches this reconciler recorded and has not
// dropped yet (their tenants' next claims would have): the worker calls it
// when it stops. Those it cannot drop are dropped by the next claim of
// their tenants, by any worker, after Postgres found them recorded.
func (r *Reconciler) Close(ctx context.Context) error {
	return r.dropRecorded(ctx, func(string) bool { return false })
}

// dropRecorded drops from Redis the batches this reconciler recorded and
// has not dropped yet, of the tenants for which keep is false, and forgets
// them.
func (r *Reconciler) dropRecorded(ctx context.Context, keep func(tenantID string) bool) error {
	r.mu.Lock()
	var batches []quota.Batch
	for id, b := range r.recorded {
		if !keep(id) {
			batches = append(batches, quota.Batch{TenantID: id, ID: b})
			delete(r.recorded, id)
		}
	}
	r.mu.Unlock()
	return r.rl.Finish(ctx, batches)
}

// recordBatches records the batches in one transaction and returns those
// recorded. When Postgres rejects the transaction for its data, each batch
// is recorded in a transaction of its own, so that the one it cannot record
// holds back no other; that batch is marked stuck and left in flight.
// Batches already stuck go alone from the start, so that they do not fail
// the chunk's transaction every cycle. Any other failure (Postgres down, a
// timeout) is the flush's error: nothing is marked stuck for it.
func (r *Reconciler) recordBatches(ctx context.Context, batches []quota.Batch) ([]quota.Batch, error) {
	var together, alone, recorded []quota.Batch
	for _, b := range batches {
		switch {
		case b.Err != nil:
			r.markStuck(b, b.Err)
		case r.isStuck(b):
			alone = append(alone, b)
		default:
			together = append(together, b)
		}
	}
	if len(together) > 0 {
		switch err := r.recordTx(ctx, together); {
		case err == nil:
			recorded = together
		case rejected(err):
			alone = append(alone, together...)
		default:
			return nil, err
		}
	}
	for _, b := range alone {
		switch err := r.recordTx(ctx, []quota.Batch{b}); {
		case err == nil:
			recorded = append(recorded, b)
		case rejected(err):
			r.markStuck(b, err)
		default:
			return nil, err
		}
	}
	return recorded, nil
}

// rejected reports whether Postgres refused a statement for the data it
// carried (SQLSTATE class 22, data exception, or 23, integrity constraint
// violation): the same batch would be refused again.
func rejected(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23"))
}

func (r *Reconciler) isStuck(b quota.Batch) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stuck[b.TenantID].id == b.ID
}

// markStuck records b as stuck, logging it the first time.
func (r *Reconciler) markStuck(b quota.Batch, err error) {
	var oldest time.Time
	if len(b.Rows) > 0 {
		oldest = b.Rows[0].Hour // ParsePending sorts by hour
	}
	r.mu.Lock()
	known := r.stuck[b.TenantID].id == b.ID
	if r.stuck == nil {
		r.stuck = map[string]stuckBatch{}
	}
	r.stuck[b.TenantID] = stuckBatch{id: b.ID, oldest: oldest}
	r.mu.Unlock()
	if !known {
		r.log.Error("usage batch cannot be recorded: left in flight, retried each cycle; the tenant's later usage waits behind it",
			"tenant_id", b.TenantID, "batch_id", b.ID, "err", err)
	}
}

// noteRecorded remembers the tenants whose batches were recorded (for the
// invoices step), and those batches of the tenants it owns (for their next
// claims to drop), and forgets the stuck batches that are gone: recorded,
// or dropped by another worker (the tenant had no batch left to claim).
func (r *Reconciler) noteRecorded(ids []string, claimed, recorded []quota.Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.flushed == nil {
		r.flushed = map[string]struct{}{}
	}
	if r.recorded == nil {
		r.recorded = map[string]string{}
	}
	for _, b := range recorded {
		r.flushed[b.TenantID] = struct{}{}
		if r.owns(b.TenantID) {
			r.recorded[b.TenantID] = b.ID
		}
		delete(r.stuck, b.TenantID)
	}
	if len(r.stuck) == 0 {
		return
	}
	for _, id := range idle(ids, claimed) {
		delete(r.stuck, id)
	}
}

// recordTx records the batches in one transaction and counts them once it
// committed.
func (r *Reconciler) recordTx(ctx context.Context, batches []quota.Batch) error {
	var t recordTally
	err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) (err error) {
		t, err = r.record(ctx, tx, batches)
		return err
	})
	if err != nil {
		return err
	}
	r.Batches.Add(int64(len(batches)))
	r.TenantsFlushed.Add(int64(len(batches)))
	r.UnitsFlushed.Add(t.units)
	r.LateCredits.Add(t.late.credits)
	r.LateCreditCents.Add(t.late.cents)
	r.LateRaises.Add(t.late.raises)
	r.RescuedBatches.Add(t.rescued)
	r.OlderDataBatches.Add(t.older)
	return nil
}

// recordTally is what record did: the units the new batches added, what
// their late usage did, and how many were rescued and how many came from
// older data (newBatches).
type recordTally struct {
	units, rescued, older int64
	late                  lateTally
}

// record finds which batches are new (newBatches) and adds their usage rows
// to the ledger, and credits what rows of a period whose invoice
// is final give back (see "Late usage" in late.go); then writes the
// threshold crossings those rows cause to the alerts outbox. All in the
// caller's transaction. It returns the units the new batches added and
// what their late usage did.
func (r *Reconciler) record(ctx context.Context, tx pgx.Tx, batches []quota.Batch) (recordTally, error) {
	// Invoices of ended periods the rows fall in are locked before the rows
	// are written; the final ones late usage reaches for the first time
	// are rated as they are without the rows.
	late, err := lockLateInvoices(ctx, tx, batches, r.now())
	if err != nil {
		return recordTally{}, err
	}
	var fresh []lateInvoice
	for _, li := range late {
		if li.final && !li.adjusted {
			fresh = append(fresh, li)
		}
	}
	before, err := rateCharges(ctx, tx, fresh)
	if err != nil {
		return recordTally{}, err
	}
	// Which batches are new: only those add rows.
	isNew, rescued, older, err := r.newBatches(ctx, tx, batches)
	if err != nil {
		return recordTally{}, err
	}
	if older > 0 && r.rl != nil {
		// Redis went back to older data: its quota counters too. The
		// leader's next Repair restores them from the ledger (they are
		// never lowered), and until then the other workers flush nothing.
		// Asked before the commit: if Redis does not take it, nothing is
		// recorded, and the next cycle finds the same batches again.
		if err := r.rl.MarkRestoring(ctx); err != nil {
			return recordTally{}, err
		}
	}
	var (
		units       int64
		fixes, adds []quota.Batch
	)
	for _, b := range batches {
		if !isNew[b.ID] {
			continue
		}
		for _, row := range b.Rows {
			units += row.Units
		}
		adds = append(adds, b)
		if slices.ContainsFunc(b.Rows, isCorrection) {
			fixes = append(fixes, b)
		}
	}
	if err := addRows(ctx, tx, adds); err != nil {
		return recordTally{}, err
	}
	if len(fixes) > 0 {
		if err := correct(ctx, tx, fixes); err != nil {
			return recordTally{}, err
		}
	}
	tally, err := r.lateAdjust(ctx, tx, late, before, batches, isNew)
	if err != nil {
		return recordTally{}, err
	}
	tenants := make([]string, 0, len(adds))
	for _, b := range adds {
		tenants = append(tenants, b.TenantID)
	}
	if err := r.recordCrossings(ctx, tx, tenants); err != nil {
		return recordTally{}, err
	}
	return recordTally{units: units, late: tally, rescued: rescued, older: older}, nil
}

// recentSeqs is how many of a tenant's last recorded batch sequences
// usage_flushed keeps (recent): a batch found in flight again after
// Redis went back to older data (a restart from its files, a failover to
// a replica behind) is one of them, and is not recorded twice.
const recentSeqs = 16

// newBatches records which of the batches are new, in the caller's
// transaction, and returns them by id. A batch with a sequence is new if
// its sequence is greater than the last the ledger recorded of its tenant
// (usage_flushed), which it then becomes; a batch without one (claimed by
// an earlier release) is new if its id was not in usage_batches, where it
// is then added. A batch of a tenant deleted meanwhile, or of an id that
// is no UUID, is not new: nothing is recorded of it, and the flush drops
// it from Redis as it does a batch recorded before.
//
// A batch whose sequence is not greater is normally recorded already: a
// replay after a crash, a claim that went stale while another worker
// recorded the batch and a later one, or a batch Redis holds in flight
// again after it went back to older data; its sequence is then among the
// tenant's recent ones. One that is not, and is still in flight in Redis,
// is new with a smaller sequence: Redis' clock went back (after it lost
// its data, or on another master after its slot moved). It is recorded
// (rescue).
//
// Older data: Redis claimed each batch after another one, its Prev, which
// the ledger recorded last (recent[1]), unless Redis went back to older
// data since (a restart from files behind its last writes, a failover to a
// replica that lagged) and forgot the claims recorded after Prev: the
// usage pending in that older data was recorded in them. A batch whose
// Prev is known, is not the last recorded and is below the greatest
// (fromOlderData) is from older data: not new, whatever its sequence, and
// never rescued; the flush drops it (older counts those in flight), and
// the batch Redis claims after it follows it (rescue). Usage counted
// between Redis coming back and that claim is dropped with it, as usage
// pending at a loss is.
func (r *Reconciler) newBatches(ctx context.Context, tx pgx.Tx, batches []quota.Batch) (isNew map[string]bool, rescued, older int64, err error) {
	var (
		lIDs, lTenants    []string // without a sequence: usage_batches
		lUnits, lRequests []int64
		sTenants, sIDs    []string // with one: usage_flushed
		sSeqs             []int64
		sPrevs            []*int64
		sBatches          []quota.Batch
	)
	for _, b := range batches {
		if !quota.ValidID(b.TenantID) {
			r.log.Warn("pending usage of a tenant id that is no UUID, dropped", "tenant_id", b.TenantID, "batch_id", b.ID)
			continue
		}
		if b.Seq > 0 {
			sTenants, sIDs, sSeqs, sPrevs = append(sTenants, b.TenantID), append(sIDs, b.ID), append(sSeqs, b.Seq), append(sPrevs, b.Prev)
			sBatches = append(sBatches, b)
			continue
		}
		var u, q int64
		for _, row := range b.Rows {
			u += row.Units
			q += row.Requests
		}
		lIDs, lTenants = append(lIDs, b.ID), append(lTenants, b.TenantID)
		lUnits, lRequests = append(lUnits, max(u, 0)), append(lRequests, max(q, 0))
	}
	isNew = map[string]bool{}
	collect := func(rows pgx.Rows, err error) error {
		if err != nil {
			return fmt.Errorf("billing: record batches: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("billing: record batches: %w", err)
		}
		for _, id := range ids {
			isNew[id] = true
		}
		return nil
	}
	if len(sTenants) > 0 {
		// (One order of row locks for every worker, the tenants': two
		// recording the same batches at once wait for each other, never
		// deadlock. Each tenant is looked up through its key: OFFSET 0
		// keeps the planner from joining all tenants instead.)
		err = collect(tx.Query(ctx, `
			INSERT INTO usage_flushed AS f (tenant_id, seq, batch_id, recent, flushed_at, prev, prev_of)
			SELECT t.id, b.seq, b.id, ARRAY[b.seq], $4, b.prev, b.seq
			FROM unnest($1::uuid[], $2::bigint[], $3::text[], $5::bigint[]) AS b(tenant, seq, id, prev)
			CROSS JOIN LATERAL (SELECT t.id FROM tenants t WHERE t.id = b.tenant OFFSET 0) t
			ORDER BY t.id
			ON CONFLICT (tenant_id) DO UPDATE SET seq = EXCLUDED.seq, batch_id = EXCLUDED.batch_id,
				recent = (EXCLUDED.recent || f.recent)[1:`+strconv.Itoa(recentSeqs)+`], flushed_at = EXCLUDED.flushed_at,
				prev = EXCLUDED.prev, prev_of = EXCLUDED.prev_of
			WHERE f.seq < EXCLUDED.seq
			  -- (not from older data: see fromOlderData)
			  AND NOT coalesce(EXCLUDED.prev > 0 AND f.prev IS NOT NULL AND f.prev_of = f.recent[1]
			                   AND EXCLUDED.prev <> f.recent[1] AND EXCLUDED.prev < f.seq, false)
			RETURNING f.batch_id`, customPlan, sTenants, sSeqs, sIDs, r.now(), sPrevs))
		if err != nil {
			return nil, 0, 0, err
		}
		if len(isNew) < len(sTenants) {
			if rescued, older, err = r.rescue(ctx, tx, sBatches, isNew); err != nil {
				return nil, 0, 0, err
			}
		}
	}
	if len(lIDs) > 0 {
		err = collect(tx.Query(ctx, `
			INSERT INTO usage_batches (batch_id, tenant_id, units, requests, flushed_at)
			SELECT b.id, b.tenant, b.units, b.requests, $5
			FROM unnest($1::text[], $2::uuid[], $3::bigint[], $4::bigint[]) AS b(id, tenant, units, requests)
			ORDER BY b.id
			ON CONFLICT (batch_id) DO NOTHING
			RETURNING batch_id`, lIDs, lTenants, lUnits, lRequests, r.now()))
		if err != nil {
			return nil, 0, 0, err
		}
	}
	return isNew, rescued, older, nil
}

// rescue records, among the batches with a sequence that newBatches did not
// find new, those that are new all the same (see newBatches): their
// sequence is not among their tenant's recent ones, they are still in
// flight in Redis, and they are not from older data (fromOlderData). Each
// is added to the recent ones (the greater sequence kept) under the
// tenant's row lock, which the upsert took: a worker recording the same
// batch at once waits, then finds it there. It returns how many it
// rescued, and how many in flight it found from older data.
func (r *Reconciler) rescue(ctx context.Context, tx pgx.Tx, batches []quota.Batch, isNew map[string]bool) (rescuedN, olderN int64, err error) {
	var tenants []string
	for _, b := range batches {
		if !isNew[b.ID] {
			tenants = append(tenants, b.TenantID)
		}
	}
	rows, err := tx.Query(ctx, `SELECT tenant_id::text, seq, recent, prev, prev_of FROM usage_flushed WHERE tenant_id = ANY($1::uuid[])`, tenants)
	if err != nil {
		return 0, 0, fmt.Errorf("billing: record batches: %w", err)
	}
	heads, err := pgx.CollectRows(rows, pgx.RowToStructByPos[flushedHead])
	if err != nil {
		return 0, 0, fmt.Errorf("billing: record batches: %w", err)
	}
	last := make(map[string]flushedHead, len(heads))
	for _, h := range heads {
		last[h.Tenant] = h
	}
	var suspects []quota.Batch
	for _, b := range batches {
		h, ok := last[strings.ToLower(b.TenantID)]
		if isNew[b.ID] || !ok || b.Seq == h.Seq || slices.Contains(h.Recent, b.Seq) {
			continue // new, of a tenant deleted, or recorded before
		}
		suspects = append(suspects, b)
	}
	if len(suspects) == 0 || r.rl == nil {
		return 0, 0, nil
	}
	live, err := r.rl.InFlight(ctx, suspects)
	if err != nil {
		return 0, 0, err
	}
	var rescued, older []quota.Batch
	for k, b := range suspects {
		if !live[k] {
			continue // recorded, dropped from Redis, followed by another
		}
		// Its sequence becomes the last recorded, with its prev, so that
		// the batch Redis claims next follows it; only a rescued one names
		// the batch and adds its usage. But a batch from older data that
		// was in flight there (Resumed) leaves the last recorded as it is:
		// the usage pending behind it is older data too, and its batch
		// follows this one.
		fromOlder := last[strings.ToLower(b.TenantID)].fromOlderData(b)
		if fromOlder && b.Resumed {
			older = append(older, b)
			continue
		}
		tag, err := tx.Exec(ctx, `
			UPDATE usage_flushed SET recent = (ARRAY[$3::bigint] || recent)[1:`+strconv.Itoa(recentSeqs)+`], prev = $5, prev_of = $3,
				batch_id = CASE WHEN $6 THEN batch_id ELSE $2 END, flushed_at = CASE WHEN $6 THEN flushed_at ELSE $4 END
			WHERE tenant_id = $1 AND NOT ($3::bigint = ANY(recent))`, b.TenantID, b.ID, b.Seq, r.now(), b.Prev, fromOlder)
		if err != nil {
			return 0, 0, fmt.Errorf("billing: record batches: %w", err)
		}
		switch {
		case tag.RowsAffected() != 1:
		case fromOlder:
			older = append(older, b)
		default:
			isNew[b.ID] = true
			rescued = append(rescued, b)
		}
	}
	if len(older) > 0 { // (one line a chunk)
		r.log.Warn("usage batches Redis claimed from older data (it went back), not recorded: their usage was recorded already",
			"batches", len(older), "tenant_id", older[0].TenantID, "batch_id", older[0].ID, "prev", *older[0].Prev)
	}
	if len(rescued) > 0 { // (one line a chunk: a clock gone back rescues every tenant's batch for a while)
		r.log.Warn("usage batches with sequences below their tenants' last recorded all the same (Redis' clock went back)",
			"batches", len(rescued), "tenant_id", rescued[0].TenantID, "batch_id", rescued[0].ID, "seq", rescued[0].Seq)
	}
	return int64(len(rescued)), int64(len(older)), nil
}

// flushedHead is a tenant's row of usage_flushed, as rescue reads it.
type flushedHead struct {
	Tenant string
	Seq    int64
	Recent []int64
	Prev   *int64 // the last batch's this release recorded; nil when its claim was not marked
	PrevOf *int64 // that batch's sequence
}

// fromOlderData reports whether Redis claimed b from older data it went
// back to: b follows a batch (Prev) that is not the tenant's last
// recorded (Recent[0]) and is below its greatest. Redis' claim marks the
// tenant's state hash with the sequence it claims, in the same call, so
// b's Prev is normally the last recorded (or, if that one never was
// recorded, one claimed after it). Only when the last recorded batch's
// claim was marked too (h.Prev), and this release recorded it (h.PrevOf):
// after a claim of a release that does not mark them, or of a tenant
// without limit state, or a record of a release before, b's Prev may be
// older. The upsert of newBatches makes the same test.
func (h flushedHead) fromOlderData(b quota.Batch) bool {
	if b.Prev == nil || *b.Prev == 0 || h.Prev == nil || h.PrevOf == nil || len(h.Recent) == 0 || *h.PrevOf != h.Recent[0] {
		return false
	}
	return *b.Prev != h.Recent[0] && *b.Prev < h.Seq
}

// ledgerKey is a usage row's key.
type ledgerKey struct {
	tenant, meter string
	hour          int64
}

// addRows adds the batches' rows (all but the corrections: correct) to the
// usage ledger, in one statement: each hour and meter summed once, in key
// order (the order every writer locks rows in), the rows of tenants
// deleted meanwhile dropped.
func addRows(ctx context.Context, tx pgx.Tx, batches []quota.Batch) error {
	sums := map[ledgerKey]*quota.PendingRow{}
	var keys []ledgerKey
	for _, b := range batches {
		for _, row := range b.Rows {
			if isCorrection(row) {
				continue
			}
			k := ledgerKey{b.TenantID, row.Meter, row.Hour.Unix()}
			sum, ok := sums[k]
			if !ok {
				sum = &quota.PendingRow{Hour: row.Hour, Meter: row.Meter}
				sums[k] = sum
				keys = append(keys, k)
			}
			sum.Units += row.Units
			sum.Requests += row.Requests
			sum.Rejected += row.Rejected
			sum.Overage += row.Overage
			sum.ShadowRefused += row.ShadowRefused
			sum.Degraded += row.Degraded
			sum.MeterOverage += row.MeterOverage
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.SortFunc(keys, func(a, b ledgerKey) int {
		if c := strings.Compare(a.tenant, b.tenant); c != 0 {
			return c
		}
		if c := cmp.Compare(a.hour, b.hour); c != 0 {
			return c
		}
		return strings.Compare(a.meter, b.meter)
	})
	n := len(keys)
	tenant, meter := make([]string, n), make([]string, n)
	hour := make([]time.Time, n)
	u, q, x, o := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	sh, dg, mo := make([]int64, n), make([]int64, n), make([]int64, n)
	for i, k := range keys {
		row := sums[k]
		tenant[i], meter[i], hour[i] = k.tenant, k.meter, row.Hour
		u[i], q[i], x[i], o[i] = row.Units, row.Requests, row.Rejected, row.Overage
		sh[i], dg[i], mo[i] = row.ShadowRefused, row.Degraded, row.MeterOverage
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO usage AS u (tenant_id, hour, meter, units, requests, rejected, overage_units, shadow_refused, degraded,
		                        meter_overage_units)
		SELECT t.id, r.hour, r.meter, r.units, r.requests, r.rejected, r.overage, r.shadow_refused, r.degraded, r.meter_overage
		FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[],
		            $8::bigint[], $9::bigint[], $10::bigint[]) WITH ORDINALITY
		     AS r(tenant, hour, meter, units, requests, rejected, overage, shadow_refused, degraded, meter_overage, n)
		-- (each tenant looked up through its key: OFFSET 0 keeps the
		-- planner from joining all tenants instead)
		CROSS JOIN LATERAL (SELECT t.id FROM tenants t WHERE t.id = r.tenant OFFSET 0) t
		ORDER BY r.n
		ON CONFLICT (tenant_id, hour, meter) DO UPDATE SET
			units = u.units + EXCLUDED.units, requests = u.requests + EXCLUDED.requests,
			rejected = u.rejected + EXCLUDED.rejected, overage_units = u.overage_units + EXCLUDED.overage_units,
			shadow_refused = u.shadow_refused + EXCLUDED.shadow_refused, degraded = u.degraded + EXCLUDED.degraded,
			meter_overage_units = u.meter_overage_units + EXCLUDED.meter_overage_units`,
		customPlan, tenant, hour, meter, u, q, x, o, sh, dg, mo)
	if err != nil {
		return fmt.Errorf("billing: record usage: %w", err)
	}
	return nil
}

// isCorrection reports whether a pending row cannot stand as a ledger row of
// its own: it refunds units recorded by an earlier batch (negative units or
// overage), or more overage than its own units. Such rows are rare.
func isCorrection(row quota.PendingRow) bool {
	return row.Units < 0 || row.Overage < 0 || row.Requests < 0 || row.Rejected < 0 ||
		row.ShadowRefused < 0 || row.Degraded < 0 || row.Overage > row.Units || row.MeterOverage < 0
}

// correct applies the correction rows of the batches (newly recorded) to the
// ledger: the rows that exist get the deltas added, clamped at zero (overage
// at most the units); the others are inserted, clamped likewise. They cannot
// go through record's upsert: Postgres checks a proposed row's CHECK
// constraints (units >= 0, overage_units <= units) before ON CONFLICT.
// Another transaction may insert the same rows meanwhile only rarely (an
// API node's outage batch of the same tenant and hour, RecordOutage); ON
// CONFLICT guards that.
func correct(ctx context.Context, tx pgx.Tx, batches []quota.Batch) error {
	var (
		tenant, meter []string
		hour          []time.Time
		u, q, x, o    []int64
		s, dg, mo     []int64
	)
	for _, b := range batches {
		for _, row := range b.Rows {
			if isCorrection(row) {
				tenant, hour, meter = append(tenant, b.TenantID), append(hour, row.Hour), append(meter, row.Meter)
				u, q, x, o = append(u, row.Units), append(q, row.Requests), append(x, row.Rejected), append(o, row.Overage)
				s, dg = append(s, row.ShadowRefused), append(dg, row.Degraded)
				mo = append(mo, row.MeterOverage)
			}
		}
	}
	_, err := tx.Exec(ctx, `
		WITH d AS (
			SELECT t.id AS tenant_id, r.hour, r.meter, sum(r.units) AS units, sum(r.requests) AS requests,
			       sum(r.rejected) AS rejected, sum(r.overage) AS overage,
			       sum(r.shadow_refused) AS shadow_refused, sum(r.degraded) AS degraded,
			       sum(r.meter_overage) AS meter_overage
			FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[],
			            $8::bigint[], $9::bigint[], $10::bigint[])
			     AS r(tenant, hour, meter, units, requests, rejected, overage, shadow_refused, degraded, meter_overage)
			CROSS JOIN LATERAL (SELECT t.id FROM tenants t WHERE t.id = r.tenant OFFSET 0) t
			GROUP BY t.id, r.hour, r.meter
		), upd AS (
			UPDATE usage u SET
				units = greatest(u.units + d.units, 0), requests = greatest(u.requests + d.requests, 0),
				rejected = greatest(u.rejected + d.rejected, 0),
				overage_units = least(greatest(u.overage_units + d.overage, 0), greatest(u.units + d.units, 0)),
				shadow_refused = greatest(u.shadow_refused + d.shadow_refused, 0),
				degraded = greatest(u.degraded + d.degraded, 0),
				meter_overage_units = greatest(u.meter_overage_units + d.meter_overage, 0)
			FROM d WHERE u.tenant_id = d.tenant_id AND u.hour = d.hour AND u.meter = d.meter
			RETURNING u.tenant_id, u.hour, u.meter
		)
		INSERT INTO usage (tenant_id, hour, meter, units, requests, rejected, overage_units, shadow_refused, degraded,
		                   meter_overage_units)
		SELECT d.tenant_id, d.hour, d.meter, greatest(d.units, 0), greatest(d.requests, 0), greatest(d.rejected, 0),
		       least(greatest(d.overage, 0), greatest(d.units, 0)), greatest(d.shadow_refused, 0), greatest(d.degraded, 0),
		       greatest(d.meter_overage, 0)
		FROM d
		WHERE NOT EXISTS (SELECT 1 FROM upd WHERE upd.tenant_id = d.tenant_id AND upd.hour = d.hour AND upd.meter = d.meter)
		ON CONFLICT (tenant_id, hour, meter) DO NOTHING`,
		tenant, hour, meter, u, q, x, o, s, dg, mo)
	if err != nil {
		return fmt.Errorf("billing: record refunds: %w", err)
	}
	return nil
}

// prune deletes the ids of batches recorded longer ago than any batch can be
// replayed, oldest first, at most pruneStatements × pruneBatch per call; the
// next flush carries on.
func (r *Reconciler) prune(ctx context.Context) error {
	before := r.now().Add(-batchRetention)
	for range pruneStatements {
		tag, err := r.db.Exec(ctx, `
			DELETE FROM usage_batches WHERE batch_id IN (
				SELECT batch_id FROM usage_batches WHERE flushed_at < $1 ORDER BY flushed_at LIMIT $2)`, before, pruneBatch)
		if err != nil {
			return fmt.Errorf("billing: prune batch ids: %w", err)
		}
		if tag.RowsAffected() < pruneBatch {
			return nil
		}
	}
	return nil
}

// recordCrossings writes an alert for every tenant among ids whose usage
// this month reached 80 % or 100 % of its monthly quota (tier or override,
// plus the month's grants), once per tenant, threshold and month; and one
// for each meter quota of its tier (quota.MeterQuota) whose meter's usage
// this month reached 80 % or 100 % of the meter's monthly quota, once per
// tenant, meter, threshold and month. The month's usage is read from
// usage_month_totals (one row per tenant and meter), which the ledger's
// triggers keep equal to the sum of its hourly rows.
func (r *Reconciler) recordCrossings(ctx context.Context, tx pgx.Tx, ids []string) error {
	month := quota.MonthStart(r.now())
	_, err := tx.Exec(ctx, `
		-- Each tenant, its grants and its sums are looked up through their
		-- keys, one probe a tenant (OFFSET 0 keeps the planner from
		-- scanning whole tables for a chunk's 2,000 ids instead).
		WITH t AS MATERIALIZED (
			-- (each tenant looked up once, for both kinds of quota)
			SELECT t.id, t.overrides, tr.monthly_quota, tr.meter_quotas
			FROM unnest($1::uuid[]) AS ids(id)
			CROSS JOIN LATERAL (SELECT t.id, t.tier, t.overrides FROM tenants t WHERE t.id = ids.id OFFSET 0) t
			JOIN tiers tr ON tr.slug = t.tier
		), g AS (
			SELECT t.id AS tenant_id, g.units FROM t
			CROSS JOIN LATERAL (SELECT sum(g.units) AS units FROM grants g
			                    WHERE g.tenant_id = t.id AND g.period = 'month' AND g.period_start = $3::date) g
		), q AS (
			SELECT t.id,
			       CASE WHEN t.overrides ? 'monthly_quota' THEN (t.overrides->>'monthly_quota')::bigint
			            ELSE t.monthly_quota END + coalesce(g.units, 0) AS quota
			FROM t LEFT JOIN g ON g.tenant_id = t.id
		), mq AS (
			SELECT t.id, m->>'meter' AS meter, (m->>'monthly_quota')::bigint AS quota
			FROM t, jsonb_array_elements(t.meter_quotas) AS m
			WHERE m->>'monthly_quota' IS NOT NULL
		), tot AS MATERIALIZED (
			SELECT s.tenant_id, s.meter, s.units FROM t
			CROSS JOIN LATERAL (SELECT s.tenant_id, s.meter, s.units FROM usage_month_totals s
			                    WHERE s.tenant_id = t.id AND s.month = $2::timestamptz OFFSET 0) s
		), used AS (
			SELECT q.id, ''::text AS meter, q.quota, coalesce(sum(tot.units), 0)::bigint AS units
			FROM q LEFT JOIN tot ON tot.tenant_id = q.id
			WHERE q.quota IS NOT NULL AND q.quota > 0
			GROUP BY q.id, q.quota
			UNION ALL
			SELECT mq.id, mq.meter, mq.quota, coalesce(tot.units, 0)
			FROM mq LEFT JOIN tot ON tot.tenant_id = mq.id AND tot.meter = mq.meter
			WHERE mq.quota > 0
		)
		INSERT INTO alerts (tenant_id, period, threshold, units, quota, meter)
		SELECT used.id, $3::date, th.pct, used.units, used.quota, used.meter
		FROM used CROSS JOIN (VALUES (80), (100)) AS th(pct)
		WHERE used.units * 100 >= used.quota * th.pct
		ON CONFLICT (tenant_id, kind, period, meter, threshold) DO NOTHING`,
		customPlan, ids, month, month.Format(time.DateOnly))
	if err != nil {
		return fmt.Errorf("billing: record crossings: %w", err)
	}
	return nil
}

// Repair restores the quota counters of every tenant with usage or grants
// this month (units, grants, and the month's overage that the spend cap
// counts) when Redis lost data (on any master of a cluster: see
// the admission store's EpochLost), from the ledger plus what is still pending in
// Redis. Usage admitted during the last interval before the loss and not yet
// flushed is gone from billing, at most one interval's worth. A restore that
// fails is retried by the next call until one succeeds.
func (r *Reconciler) Repair(ctx context.Context) error {
	lost, err := r.rl.EpochLost(ctx)
	if err != nil || !lost {
		return err
	}
	// Until MarkRestored, the loss stays reported: a restore cut short by an
	// error (Postgres down, a timeout) is retried by the next cycle.
	if err := r.rl.MarkRestoring(ctx); err != nil {
		return err
	}
	now := r.now().UTC()
	day, month := quota.DayStart(now), quota.MonthStart(now)
	r.log.Warn("redis lost its data (or this is the first start): restoring quota counters from the ledger")
	rows, err := r.db.Query(ctx, `
		WITH u AS (
			SELECT tenant_id,
			       coalesce(sum(units) FILTER (WHERE hour >= $2), 0)::bigint AS day_units,
			       sum(units)::bigint AS month_units, sum(overage_units)::bigint AS month_overage
			FROM usage WHERE hour >= $1 AND hour < $3 GROUP BY tenant_id
		), g AS (
			SELECT tenant_id,
			       coalesce(sum(units) FILTER (WHERE period = 'day' AND period_start = $2::date), 0)::bigint AS day_grant,
			       coalesce(sum(units) FILTER (WHERE period = 'month' AND period_start = $1::date), 0)::bigint AS month_grant
			-- Only applied grants: an unapplied one is the grants step's
			-- to apply, once, by its id (restoring it here too would
			-- count it twice).
			FROM grants WHERE period_start >= $1::date AND applied_at IS NOT NULL GROUP BY tenant_id
		)
		SELECT coalesce(u.tenant_id, g.tenant_id)::text, coalesce(u.day_units, 0), coalesce(u.month_units, 0),
		       coalesce(g.day_grant, 0), coalesce(g.month_grant, 0), coalesce(u.month_overage, 0)
		FROM u FULL JOIN g ON g.tenant_id = u.tenant_id
		-- (tenants of another calendar: calendarRecords)
		WHERE NOT EXISTS (SELECT 1 FROM tenants t WHERE t.id = coalesce(u.tenant_id, g.tenant_id)
		                  AND (t.billing_anchor_day <> 1 OR t.time_zone <> 'UTC'))`, month, day, month.AddDate(0, 1, 0))
	if err != nil {
		return fmt.Errorf("billing: repair: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (quota.Recorded, error) {
		var rec quota.Recorded
		return rec, row.Scan(&rec.TenantID, &rec.DayUnits, &rec.MonthUnits, &rec.DayGrant, &rec.MonthGrant, &rec.MonthOverage)
	})
	if err != nil {
		return fmt.Errorf("billing: repair: %w", err)
	}
	cr, err := r.calendarRecords(ctx, now)
	if err != nil {
		return err
	}
	recs = append(recs, cr...)
	meters, err := r.meterRecords(ctx, now)
	if err != nil {
		return err
	}
	for k := range recs {
		recs[k].Meters = meters[recs[k].TenantID]
	}
	for start := 0; start < len(recs); start += chunk {
		if err := r.rl.Restore(ctx, now, recs[start:min(start+chunk, len(recs))]); err != nil {
			return err
		}
	}
	prepaid, err := r.prepaidRecords(ctx, now)
	if err != nil {
		return err
	}
	for start := 0; start < len(prepaid); start += chunk {
		if err := r.rl.RestorePrepaid(ctx, prepaid[start:min(start+chunk, len(prepaid))]); err != nil {
			return err
		}
	}
	if err := r.rl.MarkRestored(ctx); err != nil {
		return err
	}
	r.log.Info("quota counters restored", "tenants", len(recs), "prepaid", len(prepaid))
	return nil
}
