package redisdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sessions keeps the web pages' sign-in sessions in Redis, each under
// <prefix>:v1:session:<key> until its TTL. The sessions of one owner (a
// tenant, or the admins) are bounded: a sorted set per owner,
// <prefix>:v1:sessions-of:<owner>, lists its live ones by expiry, and a new
// session past MaxPerOwner ends the owner's oldest, so that a holder of a
// valid key cannot fill Redis by signing in again and again.
type Sessions struct {
	rdb    redis.UniversalClient
	prefix string
	owners string
}

// MaxPerOwner is how many sessions one owner keeps at once.
const MaxPerOwner = 32

// NewSessions returns the sessions kept in rdb under prefix.
func NewSessions(rdb redis.UniversalClient, prefix string) *Sessions {
	return &Sessions{rdb: rdb, prefix: prefix + ":v1:session:", owners: prefix + ":v1:sessions-of:"}
}

// Put stores value under key for ttl, as one of owner's sessions: past
// MaxPerOwner live ones, the owner's oldest end. The session and its
// owner's list are in different cluster slots, so this is a few commands,
// not one atomic step: two sign-ins at once may leave the owner one or two
// sessions over the bound until its next sign-in; never unbounded.
func (s *Sessions) Put(ctx context.Context, owner, key string, value []byte, ttl time.Duration) error {
	now := time.Now()
	list := s.owners + owner
	var card *redis.IntCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, s.prefix+key, value, ttl)
		// Scored by their end in microseconds (exact in a float64): two
		// sign-ins within a millisecond still end in the order they came.
		// (Entries of a release that scored in milliseconds read as ended.)
		p.ZRemRangeByScore(ctx, list, "-inf", fmt.Sprint(now.UnixMicro()))
		p.ZAdd(ctx, list, redis.Z{Score: float64(now.Add(ttl).UnixMicro()), Member: key})
		p.PExpire(ctx, list, ttl)
		card = p.ZCard(ctx, list)
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisdb: store session: %w", err)
	}
	if over := card.Val() - MaxPerOwner; over > 0 {
		old, err := s.rdb.ZPopMin(ctx, list, over).Result()
		if err != nil {
			return fmt.Errorf("redisdb: end an owner's oldest sessions: %w", err)
		}
		for _, z := range old {
			if m, ok := z.Member.(string); ok {
				if err := s.rdb.Del(ctx, s.prefix+m).Err(); err != nil {
					return fmt.Errorf("redisdb: end an owner's oldest session: %w", err)
				}
			}
		}
	}
	return nil
}

// Get returns the value under key; found is false when there is none.
func (s *Sessions) Get(ctx context.Context, key string) ([]byte, bool, error) {
	b, err := s.rdb.Get(ctx, s.prefix+key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("redisdb: load session: %w", err)
	}
	return b, true, nil
}

// Delete removes the value under key.
func (s *Sessions) Delete(ctx context.Context, key string) error {
	if err := s.rdb.Del(ctx, s.prefix+key).Err(); err != nil {
		return fmt.Errorf("redisdb: end session: %w", err)
	}
	return nil
}
