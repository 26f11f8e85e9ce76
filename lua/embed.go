// Package lua holds Tollgate's Redis scripts, embedded so that the binaries
// carry them and load them with SCRIPT LOAD / EVALSHA at run time.
//
// The scripts live here rather than next to their Go runner because go:embed
// cannot reach a parent directory. internal/ratelimit reads them from FS and
// joins each script to the preludes it needs (Redis scripts cannot include
// one another); cmd/loadgen reads them only to list the commands they run.
package lua

import "embed"

// FS holds the *.lua scripts. Some are preludes, prepended by
// internal/ratelimit: calendar.lua (a tenant's billing calendar: the day
// and period of the script's now) to admit.lua and grant.lua; state.lua
// (the limit state's keys and layouts, the clock, the UTC calendar) to
// admit.lua, grant.lua, refund.lua and restore.lua;
// pending_fields.lua (the pending usage a v2 state hash holds) to claim.lua,
// pending.lua and restore.lua. The others: admit.lua (the admission
// decision), grant.lua (extra units for the current day or month),
// refund.lua (units of a failed request given back), restore.lua (repair of
// the quota counters after Redis lost data), idem.lua (storing or releasing
// an idempotent answer), pending.lua (a tenant's usage not yet flushed), and
// the worker's claim.lua and finish.lua (exactly-once flushing).
//
//go:embed *.lua
var FS embed.FS
