// Package ratelimit is the Redis side of admission, the limit algebra's
// side in Redis: it calls the functions of Tollgate's Redis Function
// library (internal/redisfn): admit, which checks a tenant's GCRA burst
// limit, token bucket, daily quota and monthly quota together and commits
// all of them or none in one FCALL (Admit, coalesced into pipelines:
// batch.go), its peeks (Peek, PeekIn, PeekMeterQuotas, PeekSpendCap,
// PeekPolicies), the policies (RunPolicies, ReleasePolicies, the leases
// and their releases), grants (Grant, ApplyGrant), quota resets
// (ResetQuotas), the usage of fail-open admissions (RecoverOutage), the
// deny cache's refusals (CountRefused) and the node's active set
// (ReportActive).
//
// It owns the limiting only. It must not flush, read or repair pending
// usage (internal/pending), settle reservations (internal/settlement) or
// store idempotent answers (internal/idempotency), and it imports none of
// them; internal/quotaredis joins them on one internal/redisfn.Store,
// whose package doc describes the key layout.
//
// internal/limits is the pure-Go reference of the scripts (the limit
// algebra), with the same integer arithmetic; the tests hold the scripts
// to it request by request, field by field of the state.
//
// # Semantics and the choices behind them
//
//   - GCRA counts requests (one per request whatever its cost): rate and
//     burst bound how often a tenant calls. The token bucket counts cost
//     units: it bounds how fast a tenant spends. Both always refuse when full.
//   - The overage policy applies to the monthly quota only. "bill" admits
//     past quota + grants and reports the units past it as overage; the
//     daily quota stays a hard cap, because it exists to spread a month's
//     volume, and a bill tier that could burn a month in an hour would defeat
//     it.
//   - A spend cap (Limits.MaxOverageCents with the request's overage price,
//     in units by quota.SpendCapUnits) bounds a bill tier's overage units a
//     month: a request whose overage would pass it is refused (Violated
//     spend_cap, mask 64), consuming nothing, until the month's end.
//   - All or nothing: every active limit is checked before any is written, so
//     a request refused by one limit consumes no room in the others. A
//     refusal only adds 1 to the pending "x" counter.
//   - A nil limit is skipped entirely: its key is neither read nor written
//     and it is absent from Decision.Limits.
//   - Idempotency keeps only allowed decisions (24 h, per tenant and key):
//     a refusal consumed nothing, so retrying it with the same key is a new
//     attempt, which is what a client retrying after Retry-After wants. A
//     repeat of the same request (fingerprint) replays the first decision
//     and, once stored, its answer, counting no quota but passing the burst
//     limits; a repeat while the first is in flight, or another request
//     under the key, decides nothing (IdemInFlight, IdemMismatch). Dry runs
//     and Peek ignore idempotency keys. A tenant's records are bounded in
//     number and bytes (quota.AnswerLimits): ClaimAnswer takes a record's
//     room before its admission (the Gate refuses past it), and storing,
//     releasing or unclaiming settles it.
//   - A change of limits starts GCRA and the bucket fresh where the new
//     rate and burst are each at least as large as those the state was
//     written under (kept beside it), and clamps the state to the worst
//     the new limits allow otherwise, so an upgrade never leaves an old
//     tier's debt behind and a move down waits at most one new interval.
//   - A spend cap bounds every unit billed as overage, whichever limit made
//     it overage (the tier's monthly quota or a billed meter quota), and a
//     quota reset empties used units only: a month never bills more
//     overage than its cap.
//   - Refunds and settlements move exactly what the request moved (its
//     units, its tier and meter overage, their money) in the hour, day and
//     month it was admitted in, also after the next month began (the state
//     keeps the month before beside the new one). The usage of fail-open
//     admissions (RecoverOutage) counts the same way, in its own month and
//     within that month's cap, and a repair after a Redis loss (Restore)
//     gives the month its overage back with its units: the cap's room is
//     never full again.
//   - A Redis failure is an error, never a refusal: the tier's fail-open or
//     fail-closed policy belongs to the caller.
//   - The daily and monthly quotas count the days and billing months of
//     the request's quota.Calendar (the tenant's anchor day and time zone;
//     UTC days and calendar months by default). The periods are the
//     script's, on Redis time: Go passes the calendar's Boundaries around
//     its own clock (calendar.go, cached per calendar for a local day) and
//     lua/calendar.lua picks the day and period of the script's now; the
//     default calendar passes nothing and costs nothing. The calendar tests
//     hold the script to quota.Calendar, as internal/limits follows it.
//
// # Time and units
//
// The functions read Redis TIME in microseconds since the Unix epoch (UTC), so
// every API node shares one clock. All arithmetic is on integers: rates
// become whole-microsecond intervals through quota.IntervalMicros, and limits
// are bounded (quota.MaxQuantity, and 2^50 us for a burst or bucket window)
// so that every value stays exact in a Lua double.
package ratelimit
