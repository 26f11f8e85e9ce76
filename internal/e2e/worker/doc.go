// Package worker holds the worker's end-to-end tests and nothing else: each
// runs the worker in-process with app.RunWorker (or as processes, through
// app.Main, to kill them) on real Redis and Postgres, with the usage and
// invoices it works on written as the api would, and checks what it left in
// Postgres, Redis, its logs and metrics, and the Stripe API.
//
// It holds tests only: no package imports it.
package worker
