DROP TRIGGER invoice_period_totals_truncate ON invoices;
DROP TRIGGER invoice_period_totals_delete ON invoices;
DROP TRIGGER invoice_period_totals_update ON invoices;
DROP TRIGGER invoice_period_totals_insert ON invoices;
DROP FUNCTION invoice_period_totals_truncate();
DROP FUNCTION invoice_period_totals_track();
DROP TABLE invoice_period_totals;
