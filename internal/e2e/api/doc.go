// Package api holds the api's end-to-end tests and nothing else: each starts
// the api in-process with app.RunAPI (or as a process, through app.Main) on
// real Redis and Postgres, and drives it over HTTP, gRPC or a headless
// browser as its clients do.
//
// It holds tests only: no package imports it, and what it checks is what a
// client sees, never a package's internals.
package api
