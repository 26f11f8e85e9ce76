package redisdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sessions keeps the web pages' sign-in sessions in Redis, each under
// <prefix>:v1:session:<key> until its TTL.
type Sessions struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewSessions returns the sessions kept in rdb under prefix.
func NewSessions(rdb redis.UniversalClient, prefix string) *Sessions {
	return &Sessions{rdb: rdb, prefix: prefix + ":v1:session:"}
}

// Put stores value under key for ttl.
func (s *Sessions) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if err := s.rdb.Set(ctx, s.prefix+key, value, ttl).Err(); err != nil {
		return fmt.Errorf("redisdb: store session: %w", err)
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
