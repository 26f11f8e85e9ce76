DROP INDEX invoices_period_end_idx;
DROP TABLE invoice_late_adjustments;
