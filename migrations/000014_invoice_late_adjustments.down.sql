DROP TABLE invoice_late_adjustments;
