// Package redisdb opens Tollgate's Redis connection: one server, or a Redis
// Cluster when REDIS_URL lists several addresses.
//
// It holds no quota state: that is the Redis side's (internal/redisfn and the
// parts on it).
package redisdb

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func init() {
	// go-redis logs pool dial failures on its own; during an outage that is
	// one line per request. Send them to slog at debug level instead: the
	// callers log the errors they act on.
	redis.SetLogger(slogLogger{})
}

type slogLogger struct{}

func (slogLogger) Printf(ctx context.Context, format string, v ...any) {
	slog.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

// ParseURL parses a REDIS_URL value into client options. One URL
// (redis://[user:pass@]host:port/db) means a single server; several
// comma-separated URLs or host:port addresses mean a Redis Cluster.
func ParseURL(raw string) (*redis.UniversalOptions, error) {
	parts := strings.Split(raw, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
		if parts[i] == "" {
			return nil, fmt.Errorf("empty address in %q", raw)
		}
	}
	if len(parts) == 1 {
		o, err := redis.ParseURL(withScheme(parts[0]))
		if err != nil {
			return nil, err
		}
		return &redis.UniversalOptions{
			Addrs: []string{o.Addr}, DB: o.DB, Username: o.Username, Password: o.Password,
			TLSConfig: o.TLSConfig, Protocol: 2,
		}, nil
	}
	u := &redis.UniversalOptions{IsClusterMode: true, Protocol: 2}
	for _, p := range parts {
		o, err := redis.ParseURL(withScheme(p))
		if err != nil {
			return nil, err
		}
		if o.DB != 0 {
			return nil, fmt.Errorf("a Redis Cluster has only database 0, got %d in %q", o.DB, p)
		}
		u.Addrs = append(u.Addrs, o.Addr)
		u.Username, u.Password, u.TLSConfig = o.Username, o.Password, o.TLSConfig
	}
	return u, nil
}

func withScheme(s string) string {
	if strings.Contains(s, "://") {
		return s
	}
	return "redis://" + s
}

// Open connects to Redis as described by opts and checks that it answers.
// Timeouts are short because the admission path must fail fast when Redis is
// away, so that the tier's fail-open or fail-closed policy can take over.
func Open(ctx context.Context, opts *redis.UniversalOptions) (redis.UniversalClient, error) {
	o := *opts
	if o.DialTimeout == 0 {
		o.DialTimeout = 2 * time.Second
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = time.Second
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = time.Second
	}
	c := redis.NewUniversalClient(&o)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("redis: ping %v: %w", o.Addrs, err)
	}
	return c, nil
}
