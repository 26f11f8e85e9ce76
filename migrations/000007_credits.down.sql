-- Reverting credits removes them from invoices too: each invoice gets back
-- the amount its credit lines took off, so that its total is again the sum
-- of its lines, and the old checks hold again.
UPDATE invoices i SET total_cents = i.total_cents - l.credited
FROM (SELECT invoice_id, sum(amount_cents) AS credited FROM invoice_lines WHERE kind = 'credit' GROUP BY invoice_id) l
WHERE i.id = l.invoice_id;
DELETE FROM invoice_lines WHERE kind = 'credit';
ALTER TABLE invoice_lines
    DROP CONSTRAINT IF EXISTS invoice_lines_kind_check,
    DROP CONSTRAINT IF EXISTS invoice_lines_amount_cents_check,
    ADD CONSTRAINT invoice_lines_kind_check CHECK (kind IN ('subscription', 'included', 'overage', 'grant')),
    ADD CONSTRAINT invoice_lines_amount_cents_check CHECK (amount_cents >= 0);
DROP TABLE IF EXISTS credit_draws;
DROP TABLE IF EXISTS credits;
