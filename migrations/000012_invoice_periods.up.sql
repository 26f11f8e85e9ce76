-- Invoices follow each tenant's billing calendar (issue 15, point 2).
--
-- invoices.period stays the invoice's label: the first day of the month its
-- billing period is named after (the month of the period's first local
-- date, as admission's period ids and grants name it; for the default
-- calendar, anchor 1 in UTC, the calendar month itself). period_start and
-- period_end are the period the invoice covers, [start, end) as instants:
-- local midnight of the anchor day to that of the next month, 23 or 25
-- hours off a whole number of days across a DST change. Invoices from
-- before cover their label's UTC month.
ALTER TABLE invoices ADD COLUMN period_start timestamptz, ADD COLUMN period_end timestamptz;
UPDATE invoices SET period_start = period::timestamp AT TIME ZONE 'UTC',
                    period_end = (period + interval '1 month')::timestamp AT TIME ZONE 'UTC';
ALTER TABLE invoices
    ALTER COLUMN period_start SET NOT NULL,
    ALTER COLUMN period_end SET NOT NULL,
    ADD CONSTRAINT invoices_period_bounds_check CHECK (period_end > period_start);
-- A writer that names no bounds (an older binary during a rolling deploy)
-- gets the label's UTC month, as before calendars.
CREATE FUNCTION invoices_default_bounds() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.period_start := coalesce(NEW.period_start, NEW.period::timestamp AT TIME ZONE 'UTC');
    NEW.period_end := coalesce(NEW.period_end, (NEW.period + interval '1 month')::timestamp AT TIME ZONE 'UTC');
    RETURN NEW;
END $$;
CREATE TRIGGER invoices_default_bounds BEFORE INSERT ON invoices
    FOR EACH ROW EXECUTE FUNCTION invoices_default_bounds();
-- The closing step finds the drafts whose period is over by their end.
CREATE INDEX invoices_draft_end_idx ON invoices (period_end) WHERE status = 'draft';

-- A month grant's period_start is its period's first local date: the
-- anchor day (1..28), no longer always the 1st.
ALTER TABLE grants DROP CONSTRAINT IF EXISTS grants_check;
ALTER TABLE grants ADD CONSTRAINT grants_period_start_check
    CHECK (period = 'day' OR extract(day FROM period_start) BETWEEN 1 AND 28);
