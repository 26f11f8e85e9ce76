package redisfn

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store is a Redis client under a key prefix, with the Function library it
// calls (library.go) and the tenants this node counted usage for since its
// last report. The Redis packages (internal/ratelimit, internal/pending,
// internal/settlement, internal/idempotency) each embed the one Store of a
// node. It is safe for concurrent use.
type Store struct {
	c      redis.UniversalClient
	prefix string
	lib    *library  // the Function library it calls (library.go)
	active activeSet // tenants with usage counted since the last TakeActive
}

// New returns a Store on c whose keys start with prefix (see the package
// doc for the layout). c may be a single server or a Redis Cluster. New
// panics when prefix holds a brace, which would move every key's hash tag;
// the configuration allows none.
func New(c redis.UniversalClient, prefix string) *Store {
	return newStore(c, prefix, lib)
}

// NewVersion is New with a library of its own: the same code under
// another version, named for salt. For tests, which may delete it from
// Redis without disturbing the others.
func NewVersion(c redis.UniversalClient, prefix, salt string) *Store {
	return newStore(c, prefix, buildLibrary(salt))
}

func newStore(c redis.UniversalClient, prefix string, l *library) *Store {
	if strings.ContainsAny(prefix, "{}") {
		panic(fmt.Sprintf("redisfn: key prefix %q must not contain braces", prefix))
	}
	return &Store{c: c, prefix: prefix, lib: l}
}

// Client is the store's Redis client.
func (r *Store) Client() redis.UniversalClient { return r.c }

// Prefix is the store's key prefix.
func (r *Store) Prefix() string { return r.prefix }

// Key returns the key of one piece of a tenant's state.
func (r *Store) Key(tenantID, name string) string {
	return r.prefix + ":v1:{t:" + tenantID + "}:" + name
}

// StateKeys returns the KEYS of a function of the state (lua/state.lua):
// the state hash, then extra.
func (r *Store) StateKeys(tenantID string, extra ...string) []string {
	k := make([]string, 1, 1+len(extra)+1)
	k[0] = r.StateKey(tenantID)
	for _, name := range extra {
		k = append(k, r.Key(tenantID, name))
	}
	return k
}

// StateKey is the tenant's state hash (lua/state.lua).
func (r *Store) StateKey(tenantID string) string {
	return r.prefix + ":v2:{t:" + tenantID + "}"
}

// PendingKeys are the KEYS of pending (lua/pending.lua, which reads pending
// usage wherever it lives): the pending hash, the state hash and the
// flushing hash.
func (r *Store) PendingKeys(tenantID string) []string {
	return []string{r.Key(tenantID, "pending"), r.StateKey(tenantID), r.Key(tenantID, "flushing")}
}

// ActiveKey is the set of tenants the API nodes reported active.
func (r *Store) ActiveKey() string { return r.prefix + ":v1:active" }

// ActiveTTL bounds the active-tenant set if no worker ever reads it, and
// the epoch keys' lives.
const ActiveTTL = 7 * 24 * time.Hour

// activeSet records the tenants this node admitted for since its last report.
type activeSet struct {
	mu sync.Mutex
	m  map[string]struct{}
}

func (a *activeSet) add(id string) {
	a.mu.Lock()
	if a.m == nil {
		a.m = map[string]struct{}{}
	}
	a.m[id] = struct{}{}
	a.mu.Unlock()
}

func (a *activeSet) take() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.m))
	for id := range a.m {
		out = append(out, id)
	}
	a.m = nil
	return out
}

// MarkActive notes that the tenant's pending usage changed on this node:
// TakeActive returns it.
func (r *Store) MarkActive(tenantID string) { r.active.add(tenantID) }

// TakeActive returns the tenants marked active since the last call, and
// forgets them.
func (r *Store) TakeActive() []string { return r.active.take() }

// Shard names the Redis node serving the tenant's hash slot: its address in
// a cluster (from the client's cached slot map, no round trip), "redis" for
// a single server, where every tenant shares the one node.
func (r *Store) Shard(tenantID string) string {
	cc, ok := r.c.(*redis.ClusterClient)
	if !ok {
		return "redis"
	}
	n, err := cc.MasterForKey(context.Background(), r.Key(tenantID, "pending"))
	if err != nil {
		return "slot-unknown"
	}
	return n.Options().Addr
}

// KeySlot returns the Redis Cluster slot of a key whose hash tag is tag (or
// of the key tag without braces): CRC16/XMODEM modulo 16384.
func KeySlot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
