// Package redisfn owns Tollgate's Redis Function library and how it is
// called, and the layout of the keys the functions work on: Store is a
// client under a key prefix with the library (library.go: loaded with
// FUNCTION LOAD on every master, called with FCALL, sent again only when
// Redis ran nothing), the tenant key layout (Key, StateKey, the active
// set, the epoch keys' slots), the node's active tenants (MarkActive,
// TakeActive) and the arguments the functions share (args.go).
//
// The parts of the Redis side embed the one Store of a node:
// internal/ratelimit (admission), internal/pending (pending usage and its
// repair), internal/settlement and internal/idempotency;
// internal/quotaredis joins them. This package must not decide, count or
// settle anything itself, and imports none of them.
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
//	                                  deny cache's refusals (ratelimit.Runner.CountRefused); 14 days
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
package redisfn
