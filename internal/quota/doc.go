// Package quota is Tollgate's domain: tiers and their limits, quota periods,
// admission decisions, remaining quota and upgrade hints, and the small
// interfaces the domain consumes (such as Admitter).
//
// It imports nothing of Tollgate's and knows nothing of Redis, Postgres or
// HTTP; the adapters in internal/ratelimit, internal/billing and the HTTP layer
// import it, never the other way round.
package quota
