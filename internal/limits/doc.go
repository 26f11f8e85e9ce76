// Package limits is the limit algebra: the kinds of limit, a tenant's
// compiled list of entries, and their decisions in Go. It must not do
// I/O: no Redis, no clock (time is an argument, µs since the Unix
// epoch), no logging.
//
// A request meets a List of entries (Compile makes it from a tier's
// limits, its meter quotas, spend cap, credit and calendar, for one
// meter). Each entry is of a Kind: Rate (GCRA), Bucket (token bucket),
// Quota (a day's or billing month's units, tenant-wide or of one meter,
// blocking or billing past its limit: its overage claim), Cap and Credit
// (money: the spend cap and a prepaid tenant's credit, fed by the quota
// entries' billed overage, units × their price), Policy (a Redis-side
// algorithm, opaque here: internal/policyalg is its reference). A State
// mirrors what Redis holds of the tenant, field by field (Parse, Format).
// The operations: Decide (admit, dry run, peek; all or nothing, with
// idempotency records), GiveBack (refund, settle down), Charge (settle
// up), Grant, Reset (a plan change's quota reset) and Report.
//
// It is the reference the Lua scripts are held to, step by step and field
// by field (internal/ratelimit's property tests), and the engine of the
// in-process fail-open limiter (internal/locallimit). The semantics are
// the scripts' (lua/admit.lua, refund.lua, settle.lua, adjust.lua,
// meterq.lua, grant.lua, reset.lua, state.lua, calendar.lua): where a
// function here says "as the script does", that script's header is the
// longer description.
//
// A List's wire form (Wire, Decode) is one string, one argument of a
// script call; Functions names every argument, key and answer item of
// the admission library's functions once, for Go and for Lua
// (PositionsLua).
//
// Units, epoch, precision: times are integer µs since the Unix epoch, UTC;
// quantities are units; money is millicents (1/1000 cent; a price per
// 1,000 units in cents is millicents per unit). Every value is an int64
// that the scripts hold exactly in a double (below 2^53).
package limits
