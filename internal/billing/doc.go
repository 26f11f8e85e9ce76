// Package billing is Tollgate's Postgres side of metering: the usage
// ledger, the exactly-once flush of pending usage from Redis into it,
// invoices, credits and prepaid balances, and threshold alerts with their
// webhooks. The worker drives it (internal/worker, wired by internal/app);
// the HTTP layer reads from it.
//
// It writes these tables: the ledger (usage and its monthly partitions,
// usage_monthly; usage_month_totals through usage's triggers; usage_flushed
// and usage_batches, which count each batch once), invoices, invoice_lines,
// invoice_period_totals and invoice_late_adjustments, credits and
// credit_draws, the alerts outbox, and its own entries in audit_log. Tiers,
// tenants, keys and grants are the catalog's (internal/catalogdb): billing
// reads them and never writes them; invoice_exports are
// internal/stripeexport's. It must not call Redis directly: what it needs of the
// admission side (pending usage to claim, counters to restore) it declares
// as interfaces (pendingUsage in reconcile.go), which the Redis adapter
// implements. It knows nothing of HTTP.
//
// Each concern has its files, each the one owner of its part:
//
//	reconcile.go          the flush: claim in Redis, record once in Postgres (each tenant's batch sequence), drop by the next claim; stuck batches; the quota check; pruning
//	repair_calendar.go    the repair of Redis' counters from the ledger after Redis lost data
//	outage.go             fail-open usage an API node admitted while Redis was away, recorded once
//	late.go               usage recorded after its period's invoice became final: credits on the next one
//	partitions.go         the ledger's monthly partitions, created ahead, and the hourly detail's retention
//	ledger.go             reads of the ledger and of invoices (usage pages, summaries, exports)
//	invoice.go            Invoicer: the worker's invoice step (sweeps, Refresh, closing months)
//	invoice_generate.go   a batch of tenants' invoices generated in one transaction, from the ledger
//	invoice_rate.go       Rate: an invoice's lines from its rating input, with no database
//	invoice_totals.go     each month's invoice count and total (the console's summary), kept exact
//	meterlines.go         the lines of meter quotas and their overage
//	anchors.go            billing calendars: each tenant's periods and their labels
//	credits.go            credits: granted, drawn by final invoices, expired, listed
//	balance.go            a prepaid tenant's balance: its credit less what its current period has used
//	alerts.go             quota threshold crossings, the alerts outbox and signed webhook deliveries
//	creditalerts.go       a prepaid tenant's low-balance alerts
//	cycle.go              the hand-off between the flush and the invoices within one worker cycle
package billing
