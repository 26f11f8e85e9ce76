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
// internal/ratelimit: calendar.lua (a tenant's billing calendar: the day and
// period of the script's now) to admit.lua and grant.lua; state.lua (the
// limit state's keys and layouts, the clock, the UTC calendar, the month
// before) to admit.lua, grant.lua, refund.lua, settle.lua, reset.lua,
// outage.lua, restore.lua and policy_run.lua; meterq.lua (the meter quotas'
// counters, the spend cap's and the credit's money, month by month) to
// refund.lua, settle.lua, outage.lua, reset.lua and restore_meters.lua;
// adjust.lua (units counted after their admission, in its day and month) to
// refund.lua, settle.lua and outage.lua; pending_fields.lua (the pending
// usage a v2 state hash holds) to claim.lua, pending.lua and restore.lua;
// the policies' (policy.lua and its algorithms policy_windows.lua and
// policy_rates.lua, or policy_none.lua for none) to admit.lua, and to
// policy_run.lua. The others: admit.lua (the admission decision), grant.lua
// (extra units for the current day or month), refund.lua (units of a failed
// request given back), settle.lua (a request settled to its actual cost),
// reset.lua (a tier change's quota reset), outage.lua (usage admitted in
// process while Redis was away), restore.lua, restore_meters.lua and
// restore_prepaid.lua (repair of the counters after Redis lost data),
// idem.lua (storing or releasing an idempotent answer), pending.lua (a
// tenant's usage not yet flushed), and the worker's claim.lua and finish.lua
// (exactly-once flushing).
//
//go:embed *.lua
var FS embed.FS
