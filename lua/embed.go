// Package lua holds Tollgate's Redis Function library, as the Lua files it
// is made of, embedded so that the binaries carry them.
//
// The files live here rather than next to their Go runner because go:embed
// cannot reach a parent directory. internal/ratelimit (library.go) joins
// them into one library, tollgate_<v> (v: the first 12 hex digits of the
// SHA-256 of its text), loads it with FUNCTION LOAD (Redis 7.0 or later)
// and calls its functions, tg<v>_<name>, with FCALL; cmd/loadgen reads the
// files only to list the commands they run.
//
// The library holds, in this order: a header (KEYS and ARGV, which each
// function sets at its entry, and FN, the functions by name); the code the
// functions share: calendar.lua (a tenant's billing calendar: the day and
// period of a function's now), state.lua (the limit state's hash, the
// clock, the UTC calendar, the month before), pending_fields.lua (the
// pending usage a state hash holds), meterq.lua (the meter quotas'
// counters, the spend cap's and the credit's money, month by month),
// adjust.lua (units counted after their admission, in its day and month),
// policy.lua with policy_windows.lua and policy_rates.lua (the policies'
// framework and algorithms); then the functions, one file each but the
// two peeks: admit (admit.lua: the admission decision), grant (extra units
// for the current day or month), refund (units of a failed request given
// back), settle (a request settled to its actual cost), reset (a tier
// change's quota reset), outage (usage admitted in process while Redis was
// away), restore, restore_meters and restore_prepaid (repair of the
// counters after Redis lost data), idem (storing or releasing an
// idempotent answer, and the tenant's room for them), pending (a tenant's
// usage not yet flushed), claim and finish (the worker's exactly-once
// flushing), policy_run (policies decided outside an admission),
// meter_peek and spend_peek (peek.lua: the meter quotas and the spend cap
// as they stand); and last the registration of each, named for the
// version (pending and the peeks flagged no-writes).
//
// A function's definitions are made once, when the library is loaded:
// the files define their helpers at the library's top level (each
// function's private ones in a do ... end block of its file) and per-call
// values are set at a function's entry (Redis runs one function at a
// time). Lua 5.1 bounds a function to 200 locals (the library's chunk
// included) and 60 upvalues.
package lua

import "embed"

// FS holds the *.lua files.
//
//go:embed *.lua
var FS embed.FS
