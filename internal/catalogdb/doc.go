// Package catalogdb is the catalog's store in Postgres: tiers and their
// price history, tenants with their plan changes and quota resets, API keys,
// policies, grants, and the audit log. Public methods of Store open their
// transaction and write each change with its audit entry.
//
// It never writes usage, invoices or credits: those are internal/billing's.
// It opens no pool and applies no migration (internal/pgdb's), and it keeps
// no cache: internal/catalog caches what it reads and invalidates every
// node's copy after a write.
package catalogdb
