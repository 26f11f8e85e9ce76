// Package billing is Tollgate's Postgres side of metering: the usage ledger,
// the exactly-once reconciliation of pending usage from Redis, invoices and
// threshold alerts. The worker drives it; the HTTP layer reads from it.
package billing
