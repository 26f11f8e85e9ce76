DROP TABLE invoice_exports;
ALTER TABLE tenants DROP COLUMN stripe_customer_id;
