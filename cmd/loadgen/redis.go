package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/lua"
)

// cmdStat is one command's line of INFO commandstats: calls and total
// microseconds spent executing them (server side, excluding network and
// queueing).
type cmdStat struct{ calls, usec int64 }

// cmdStats maps "evalsha", "get"… to their counters, summed over masters.
type cmdStats map[string]cmdStat

// sub returns s − before per command: what ran in between.
func (s cmdStats) sub(before cmdStats) cmdStats {
	d := cmdStats{}
	for name, v := range s {
		b := before[name]
		if v.calls != b.calls || v.usec != b.usec {
			d[name] = cmdStat{v.calls - b.calls, v.usec - b.usec}
		}
	}
	return d
}

// total sums every command but INFO, which is the measurement's own, and
// but those in skip.
func (s cmdStats) total(skip map[string]bool) cmdStat {
	var t cmdStat
	for name, v := range s {
		if name != "info" && !skip[name] {
			t.calls += v.calls
			t.usec += v.usec
		}
	}
	return t
}

// scriptCall is a command a Lua script runs: redis.call('HSET', ….
var scriptCall = regexp.MustCompile(`redis\.p?call\(\s*['"]([A-Za-z_]+)['"]`)

// scriptedCommands are the commands our scripts (lua/*.lua) and redis_rate's
// run. Redis counts them in commandstats on their own, and once more within
// the usec of the EVALSHA that ran them: a sum of usec over every command
// counts them twice. Leaving them out leaves what Redis spent on the
// commands clients sent (the only top-level ones among them during the
// bench are a few a second, next to thousands of admissions).
func scriptedCommands() (map[string]bool, error) {
	names := map[string]bool{"get": true, "set": true, "time": true} // redis_rate's lua.go
	entries, err := fs.Glob(lua.FS, "*.lua")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		src, err := fs.ReadFile(lua.FS, e)
		if err != nil {
			return nil, err
		}
		for _, m := range scriptCall.FindAllSubmatch(src, -1) {
			names[strings.ToLower(string(m[1]))] = true
		}
	}
	return names, nil
}

// parseCommandStats reads the text of INFO commandstats: lines such as
// "cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=0".
func parseCommandStats(info string, into cmdStats) error {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue // "# Commandstats", blank lines
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok {
			return fmt.Errorf("INFO commandstats: %q has no fields", line)
		}
		var st cmdStat
		var got int
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			var dst *int64
			switch k {
			case "calls":
				dst = &st.calls
			case "usec":
				dst = &st.usec
			default:
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("INFO commandstats: %q: %w", line, err)
			}
			*dst = n
			got++
		}
		if got != 2 {
			return fmt.Errorf("INFO commandstats: %q has no calls and usec", line)
		}
		v := into[name]
		into[name] = cmdStat{v.calls + st.calls, v.usec + st.usec}
	}
	return sc.Err()
}

// commandStats reads INFO commandstats of every master.
func commandStats(ctx context.Context, rdb redis.UniversalClient) (cmdStats, error) {
	out := cmdStats{}
	var mu sync.Mutex
	err := forEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return fmt.Errorf("INFO commandstats on %s: %w", c.Options().Addr, err)
		}
		mu.Lock()
		defer mu.Unlock()
		return parseCommandStats(info, out)
	})
	return out, err
}

// tenantMemory sums MEMORY USAGE over the tenant's keys
// (<prefix>:*{t:<id>}*, the hash tag of internal/ratelimit) on every master.
func tenantMemory(ctx context.Context, rdb redis.UniversalClient, prefix, tenantID string) (bytes int64, keys int, err error) {
	return keysMemory(ctx, rdb, prefix+":*{t:"+tenantID+"}*")
}

// tenantsMemory sums MEMORY USAGE over the keys of the tenants with these
// ids on every master, in one SCAN of the prefix's tenant keys.
func tenantsMemory(ctx context.Context, rdb redis.UniversalClient, prefix string, ids []string) (bytes int64, keys int, err error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	return scanMemory(ctx, rdb, prefix+":*{t:*}*", func(key string) bool { return want[tenantOf(key)] })
}

// tenantOf is the tenant id of a key's hash tag {t:<id>}, or "".
func tenantOf(key string) string {
	_, rest, ok := strings.Cut(key, "{t:")
	if !ok {
		return ""
	}
	id, _, ok := strings.Cut(rest, "}")
	if !ok {
		return ""
	}
	return id
}

// keysMemory sums MEMORY USAGE over the keys that match the SCAN pattern
// on every master.
func keysMemory(ctx context.Context, rdb redis.UniversalClient, pattern string) (bytes int64, keys int, err error) {
	return scanMemory(ctx, rdb, pattern, nil)
}

// scanMemory sums MEMORY USAGE over the keys that match the SCAN pattern
// on every master, and that keep accepts (nil: all).
func scanMemory(ctx context.Context, rdb redis.UniversalClient, pattern string, keep func(string) bool) (bytes int64, keys int, err error) {
	var mu sync.Mutex
	err = forEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			if keep != nil && !keep(iter.Val()) {
				continue
			}
			n, err := c.MemoryUsage(ctx, iter.Val()).Result()
			if errors.Is(err, redis.Nil) {
				continue // expired since SCAN saw it
			}
			if err != nil {
				return fmt.Errorf("MEMORY USAGE %s: %w", iter.Val(), err)
			}
			mu.Lock()
			bytes += n
			keys++
			mu.Unlock()
		}
		return iter.Err()
	})
	return bytes, keys, err
}

// forEachMaster calls fn with the one server, or with every master of a
// Redis Cluster, as internal/redisdb opens them.
func forEachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(context.Context, *redis.Client) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("unexpected Redis client %T", rdb)
}
