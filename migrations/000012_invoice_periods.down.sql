-- Month grants of anchored periods stay (NOT VALID: older versions read
-- only the grants of the 1st); new ones must start on the 1st again.
ALTER TABLE grants DROP CONSTRAINT IF EXISTS grants_period_start_check;
ALTER TABLE grants ADD CONSTRAINT grants_check
    CHECK (period = 'day' OR extract(day FROM period_start) = 1) NOT VALID;
DROP INDEX IF EXISTS invoices_draft_end_idx;
DROP TRIGGER IF EXISTS invoices_default_bounds ON invoices;
DROP FUNCTION IF EXISTS invoices_default_bounds();
ALTER TABLE invoices DROP CONSTRAINT IF EXISTS invoices_period_bounds_check,
    DROP COLUMN IF EXISTS period_start, DROP COLUMN IF EXISTS period_end;
