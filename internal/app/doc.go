// Package app is the start-up of Tollgate's binaries: RunAPI is the api
// (cmd/api) and RunWorker the worker (cmd/worker), and Main runs either as a
// process.
//
// It owns their common shape, once (run): load the configuration from the
// environment, make the logger, start the traces, open Postgres (migrated to
// the schema this binary expects) and Redis; then the binary's own wiring
// serves until its context ends (Main ends it on SIGINT or SIGTERM) and shuts
// down within its timeout; then everything opened closes, in reverse order,
// the last spans exported last. It also owns the api's gRPC and operations
// listeners, its readiness checks and the worker's metrics.
//
// It is wiring only: it builds the adapters and services and hands each its
// dependencies, and must not hold rules of the product (quotas, billing,
// HTTP handling), which belong to the packages it wires. Nothing but the
// binaries' mains and the end-to-end tests import it.
package app
