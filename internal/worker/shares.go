package worker

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Shards is how many shares the tenants are split into: a tenant belongs to
// shard ShardOf(id), and each shard is flushed by the one worker holding it.
// Beyond Shards workers, the extra ones hold none (they stand by).
const Shards = 64

// Advisory lock namespaces (the first key of pg_try_advisory_lock(int, int)):
// a member's slot, a shard, the leader.
const (
	nsMember = 0x746c6701
	nsShard  = 0x746c6702
	nsLeader = 0x746c6703
	// maxMembers bounds the member slots tried.
	maxMembers = 1024
)

// ShardOf returns the shard of a tenant: FNV-1a of its id modulo Shards.
func ShardOf(tenantID string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(tenantID))
	return int(h.Sum32() % Shards)
}

// Shares splits the tenants between the workers running at once against one
// Postgres database, with session advisory locks on a connection of its own:
//
//   - membership: each worker holds one member lock; the workers alive are
//     the member locks granted in the database (pg_locks).
//   - ownership: each worker holds the locks of the shards it flushes, at
//     most ceil(Shards/alive). On each Sync it gives back the shards above
//     that and takes free ones up to it, so the shards of a worker that died
//     are taken by the others on their next Sync, within one interval.
//   - leader: one worker holds the leader lock and runs the steps that are
//     not split by tenant (the sweep of the keyspace, grants, plans, repair,
//     alerts, the Stripe export).
//
// Postgres releases a session's locks when the session ends: a worker that
// exits or is killed hands its shards over at once; one whose host vanished,
// once Postgres ends its idle session (IdleTimeout). Ownership only spreads
// the work: exactly-once does not depend on it (two workers flushing the
// same tenant record its batch once), so a moment of overlap, as when a
// worker's session was ended while it still flushed, costs nothing but
// duplicate work. A shard given back by one worker and not yet taken by the
// one that joined waits at most one interval, its usage kept in Redis.
//
// Sync is a worker step (the first of the cycle); Owns and Leads are safe to
// call concurrently with it.
type Shares struct {
	cfg *pgx.ConnConfig
	log *slog.Logger
	// IdleTimeout is the idle_session_timeout of the lock session: Postgres
	// ends it, and so releases its locks, when the worker has not synced
	// for that long (its host vanished). It must exceed the longest cycle;
	// zero leaves the server's setting.
	IdleTimeout time.Duration

	mu     sync.Mutex // serializes Sync and Close; guards conn and member
	conn   *pgx.Conn
	member int

	owned  atomic.Uint64 // bit s: shard s held
	gained atomic.Uint64 // shards taken, ever
	leader atomic.Bool
	alive  atomic.Int64
}

// NewShares returns the Shares of a worker on pool's database. It holds no
// lock until the first Sync. It logs the changes of its share on log (nil:
// none).
func NewShares(pool *pgxpool.Pool, log *slog.Logger) *Shares {
	return &Shares{cfg: pool.Config().ConnConfig.Copy(), log: log, member: -1}
}

// Owns reports whether this worker holds tenantID's shard.
func (s *Shares) Owns(tenantID string) bool {
	return s.owned.Load()&(1<<ShardOf(tenantID)) != 0
}

// Leads reports whether this worker holds the leader lock.
func (s *Shares) Leads() bool { return s.leader.Load() }

// Owned returns the shards this worker holds, ascending.
func (s *Shares) Owned() []int {
	var out []int
	for m := s.owned.Load(); m != 0; m &= m - 1 {
		out = append(out, bits.TrailingZeros64(m))
	}
	return out
}

// Gained counts the shards this worker has taken since it started: when
// it changes, tenants were added to its share, so a pass over its tenants
// that began before (the closing of a month: billing.Invoicer) may have
// left some of them out.
func (s *Shares) Gained() uint64 { return s.gained.Load() }

// syncTimeout bounds a Sync, whatever its caller's deadline.
const syncTimeout = 10 * time.Second

// Alive returns how many workers the last Sync counted (this one included).
func (s *Shares) Alive() int { return int(s.alive.Load()) }

// Sync renews this worker's membership and rebalances its shards: it counts
// the workers alive, gives back the shards above its share and takes free
// ones up to it, and takes the leader lock if no one holds it. On an error
// it drops its session, and with it every lock, and holds nothing until a
// later Sync succeeds.
func (s *Shares) Sync(ctx context.Context) error {
	// A Sync runs to its end past the step's deadline if it must (within
	// syncTimeout), though not past the worker's stop: a Sync cut short
	// drops the session and every lock, so one always cut short (a Postgres
	// slow to accept connections, the round trips that take the shards, on
	// a loaded host) would never hold any.
	step := ctx
	if err := step.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("worker: shares: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(step), syncTimeout)
	defer cancel()
	defer context.AfterFunc(step, func() {
		if !errors.Is(step.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})()
	s.mu.Lock()
	defer s.mu.Unlock()
	owned, leads := s.owned.Load(), s.leader.Load()
	err := s.sync(ctx)
	if err != nil {
		s.drop()
	}
	if s.log != nil && (s.owned.Load() != owned || s.leader.Load() != leads) {
		s.log.Info("worker share changed", "shards", bits.OnesCount64(s.owned.Load()), "leader", s.leader.Load(),
			"workers", s.alive.Load())
	}
	if err != nil {
		return fmt.Errorf("worker: shares: %w", err)
	}
	return nil
}

func (s *Shares) sync(ctx context.Context) error {
	if s.conn == nil {
		c, err := pgx.ConnectConfig(ctx, s.cfg)
		if err != nil {
			return err
		}
		s.conn = c
		if s.IdleTimeout > 0 {
			if _, err := c.Exec(ctx, fmt.Sprintf("SET idle_session_timeout = %d", s.IdleTimeout.Milliseconds())); err != nil {
				return err
			}
		}
	}
	if s.member < 0 {
		for k := range maxMembers {
			var ok bool
			if err := s.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, nsMember, k).Scan(&ok); err != nil {
				return err
			}
			if ok {
				s.member = k
				break
			}
		}
		if s.member < 0 {
			return fmt.Errorf("all %d member slots taken", maxMembers)
		}
	}
	// The shard locks held by anyone, and the members alive, in this
	// database.
	var alive int64
	var held []int32
	if err := s.conn.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE classid = $1::int8::oid),
		       coalesce(array_agg(objid::int8::int4) FILTER (WHERE classid = $2::int8::oid), '{}')
		FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 2
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		int64(nsMember), int64(nsShard)).Scan(&alive, &held); err != nil {
		return err
	}
	alive = max(alive, 1)
	s.alive.Store(alive)
	share := int((Shards + alive - 1) / alive)
	owned := s.owned.Load()
	// Above its share: give back the highest shards.
	for n := bits.OnesCount64(owned); n > share; n-- {
		sh := 63 - bits.LeadingZeros64(owned)
		if _, err := s.conn.Exec(ctx, `SELECT pg_advisory_unlock($1, $2)`, nsShard, sh); err != nil {
			return err
		}
		owned &^= 1 << sh
		s.owned.Store(owned)
	}
	// Below it: take free shards, starting at a place of the member's own
	// so that workers joining together try different shards first.
	var taken uint64
	for _, h := range held {
		if h >= 0 && h < 64 {
			taken |= 1 << h
		}
	}
	for i := 0; i < Shards && bits.OnesCount64(owned) < share; i++ {
		sh := (s.member*Shards/8 + i) % Shards
		if owned&(1<<sh) != 0 || taken&(1<<sh) != 0 {
			continue
		}
		var ok bool
		if err := s.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, nsShard, sh).Scan(&ok); err != nil {
			return err
		}
		if ok {
			owned |= 1 << sh
			s.owned.Store(owned)
			s.gained.Add(1)
		}
	}
	if !s.leader.Load() {
		var ok bool
		if err := s.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, 0)`, nsLeader).Scan(&ok); err != nil {
			return err
		}
		s.leader.Store(ok)
	}
	return nil
}

// drop ends the lock session, which releases its locks, and forgets them.
func (s *Shares) drop() {
	s.owned.Store(0)
	s.leader.Store(false)
	s.member = -1
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.conn.Close(ctx)
		cancel()
		s.conn = nil
	}
}

// Close ends the lock session: the shards and the leader lock go to the
// other workers on their next Sync.
func (s *Shares) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop()
}
