// Package ratelimit is the Redis side of admission: it calls the functions
// of Tollgate's Redis Function library (lua/, loaded by library.go): admit,
// which checks a tenant's GCRA burst limit, token bucket, daily quota and
// monthly quota together and commits all of them or none in one FCALL,
// grant, which adds units to the current day or month, and the others.
//
// internal/limits is the pure-Go reference of the scripts (the limit
// algebra), with the same integer arithmetic; the tests hold the scripts
// to it request by request, field by field of the state.
//
// # Keys
//
// Every key of a tenant carries the hash tag {t:<tenant id>}, so that one
// script call touches one Redis Cluster slot, and a state-format version, so
// that a change of format bumps the prefix instead of migrating Redis:
//
//	<prefix>:v2:{t:<id>}              the limit state (GCRA, bucket and their limits, day, month
//	                                  and the month before, grant marks) and
//	                                  the pending usage ("p" fields), one hash (lua/state.lua);
//	                                  14 days after the last admission, at least to the month's end + 1 h
//	<prefix>:v1:{t:<id>}:pending      pending usage of a tenant without state (a refusal), and the
//	                                  deny cache's refusals (CountRefused); 14 days
//	<prefix>:v1:{t:<id>}:flushing     the batch the worker claimed (claim.lua)
//	<prefix>:v1:{t:<id>}:idem2:<hex>  idempotency record: fingerprint, state, first decision, stored answer; 24 h
//	<prefix>:v1:{t:<id>}:idemroom     the room of the tenant's records: claim id -> ms it frees (sorted set)
//	<prefix>:v1:{t:<id>}:idembytes    claim id -> bytes held, '$' -> their sum (lua/idem.lua); both
//	                                  live as long as the latest claim
//	<prefix>:v1:{t:<id>}:mq           the meter quotas, their overage millicents and a prepaid
//	                                  tenant's credit draws (lua/admit.lua, "Meter quotas", "Prepaid")
//
// Pending usage fields are "<hour start, unix s>|<meter>|u" (units), "|r"
// (admitted requests), "|x" (refused requests) and "|o" (overage units),
// each a counter the worker reads and subtracts.
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
