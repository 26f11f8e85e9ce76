-- The console's invoices page shows each month's number of invoices and the
-- sum of their totals. Summing a month's invoices reads every one of them
-- (100,000 at 100,000 tenants); this table keeps the sums instead, exact in
-- the transaction of every write to invoices, whoever makes it.
--
-- Each statement that inserts, updates or deletes invoices adds one row per
-- label it changed: the change in count and in the sum of total_cents. The
-- rows are only ever inserted by writers, so concurrent writers of the same
-- month never wait for each other here. A month's figures are the sum of its
-- rows; the invoicer folds each month's rows into one after its runs
-- (DELETE ... RETURNING and INSERT in one statement, exact under concurrent
-- writers).
CREATE TABLE invoice_period_totals (
    period      date NOT NULL,
    invoices    bigint NOT NULL,
    total_cents numeric NOT NULL
);
CREATE INDEX invoice_period_totals_period_idx ON invoice_period_totals (period);

CREATE FUNCTION invoice_period_totals_track() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO invoice_period_totals (period, invoices, total_cents)
        SELECT period, count(*), sum(total_cents) FROM new_invoices GROUP BY period;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO invoice_period_totals (period, invoices, total_cents)
        SELECT period, -count(*), -sum(total_cents) FROM old_invoices GROUP BY period;
    ELSE
        INSERT INTO invoice_period_totals (period, invoices, total_cents)
        SELECT period, sum(n), sum(c) FROM (
            SELECT period, 1 AS n, total_cents::numeric AS c FROM new_invoices
            UNION ALL
            SELECT period, -1, -total_cents::numeric FROM old_invoices
        ) d
        GROUP BY period HAVING sum(n) <> 0 OR sum(c) <> 0;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION invoice_period_totals_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM invoice_period_totals;
    RETURN NULL;
END $$;

-- Creating the triggers locks invoices against writes until this
-- migration commits, so the sums filled below miss no write.
CREATE TRIGGER invoice_period_totals_insert AFTER INSERT ON invoices
    REFERENCING NEW TABLE AS new_invoices
    FOR EACH STATEMENT EXECUTE FUNCTION invoice_period_totals_track();
CREATE TRIGGER invoice_period_totals_update AFTER UPDATE ON invoices
    REFERENCING OLD TABLE AS old_invoices NEW TABLE AS new_invoices
    FOR EACH STATEMENT EXECUTE FUNCTION invoice_period_totals_track();
CREATE TRIGGER invoice_period_totals_delete AFTER DELETE ON invoices
    REFERENCING OLD TABLE AS old_invoices
    FOR EACH STATEMENT EXECUTE FUNCTION invoice_period_totals_track();
CREATE TRIGGER invoice_period_totals_truncate AFTER TRUNCATE ON invoices
    FOR EACH STATEMENT EXECUTE FUNCTION invoice_period_totals_truncate();

INSERT INTO invoice_period_totals (period, invoices, total_cents)
SELECT period, count(*), sum(total_cents) FROM invoices GROUP BY period;
