// Package lua holds Tollgate's Redis scripts, embedded so that the binaries
// carry them and load them with SCRIPT LOAD / EVALSHA at run time.
//
// The scripts live here rather than next to their Go runner because go:embed
// cannot reach a parent directory; internal/ratelimit reads them from FS.
package lua

import "embed"

// FS holds the *.lua scripts: state.lua (the prelude of the scripts that
// touch limit state: layouts, clock, calendar), pending_fields.lua (the
// prelude of those that read the pending usage a state hash holds), admit.lua (the admission
// decision), grant.lua, refund.lua and restore.lua (grants, refunds and
// repair of the quota counters), idem.lua (idempotent answers), and the
// worker's claim.lua and finish.lua (exactly-once flushing), and pending.lua
// (reading pending usage).
//
//go:embed *.lua
var FS embed.FS
