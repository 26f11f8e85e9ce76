-- Each tenant's usage of each UTC month and meter, summed: the worker's
-- flush checks every flushed tenant's monthly quotas (the 80 % and 100 %
-- alerts) against it, reading one row per tenant and meter instead of the
-- month's hourly rows (up to 744 of them per meter).
--
-- Statement triggers on usage keep it exact in the transaction of every
-- write to the ledger, whoever makes it: the flush's upserts, refunds'
-- corrections, deletions (a tenant's, by cascade). A row is locked only by
-- writes of its own tenant: the flush's, one after the other, and rarely an
-- API node's outage batch (two such writers of several meters at once may
-- deadlock; Postgres then fails one, which is retried). The months whose
-- hourly detail the retention rolls up into usage_monthly leave this table
-- with it (billing.Partitions.DropBefore).
CREATE TABLE usage_month_totals (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    month     timestamptz NOT NULL CHECK (month = date_trunc('month', month, 'UTC')),
    meter     text NOT NULL,
    units     bigint NOT NULL,
    PRIMARY KEY (tenant_id, month, meter)
) WITH (fillfactor = 70); -- (room on each page, so that updates stay HOT)

CREATE FUNCTION usage_month_totals_track() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Each statement's change of each month's sum, added to its row. The
    -- inserts and updates (the flush's) are upserts: each row is found
    -- through the primary key, whatever the statistics say of this table
    -- or of the transition tables.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO usage_month_totals AS s (tenant_id, month, meter, units)
        SELECT tenant_id, date_trunc('month', hour, 'UTC'), meter, sum(units)
        FROM new_usage GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (tenant_id, month, meter) DO UPDATE SET units = s.units + EXCLUDED.units;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO usage_month_totals AS s (tenant_id, month, meter, units)
        SELECT tenant_id, date_trunc('month', hour, 'UTC'), meter, sum(units) FROM (
            SELECT tenant_id, hour, meter, units FROM new_usage
            UNION ALL
            SELECT tenant_id, hour, meter, -units FROM old_usage
        ) c
        GROUP BY 1, 2, 3 HAVING sum(units) <> 0 ORDER BY 1, 2, 3
        ON CONFLICT (tenant_id, month, meter) DO UPDATE SET units = s.units + EXCLUDED.units;
    ELSE
        -- DELETE: rows that exist only (a tenant's deletion may have taken
        -- its sums already, by cascade).
        UPDATE usage_month_totals s SET units = s.units - d.units
        FROM (SELECT tenant_id, date_trunc('month', hour, 'UTC') AS month, meter, sum(units) AS units
              FROM old_usage GROUP BY 1, 2, 3) d
        WHERE s.tenant_id = d.tenant_id AND s.month = d.month AND s.meter = d.meter AND d.units <> 0;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION usage_month_totals_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM usage_month_totals;
    RETURN NULL;
END $$;

-- Creating the triggers locks usage against writes until this migration
-- commits, so the sums filled below miss no write.
CREATE TRIGGER usage_month_totals_insert AFTER INSERT ON usage
    REFERENCING NEW TABLE AS new_usage
    FOR EACH STATEMENT EXECUTE FUNCTION usage_month_totals_track();
CREATE TRIGGER usage_month_totals_update AFTER UPDATE ON usage
    REFERENCING OLD TABLE AS old_usage NEW TABLE AS new_usage
    FOR EACH STATEMENT EXECUTE FUNCTION usage_month_totals_track();
CREATE TRIGGER usage_month_totals_delete AFTER DELETE ON usage
    REFERENCING OLD TABLE AS old_usage
    FOR EACH STATEMENT EXECUTE FUNCTION usage_month_totals_track();
CREATE TRIGGER usage_month_totals_truncate AFTER TRUNCATE ON usage
    FOR EACH STATEMENT EXECUTE FUNCTION usage_month_totals_truncate();

INSERT INTO usage_month_totals (tenant_id, month, meter, units)
SELECT tenant_id, date_trunc('month', hour, 'UTC'), meter, sum(units) FROM usage GROUP BY 1, 2, 3;

-- The usage partitions leave room on each page, so that the flush's
-- updates of a row of the current hour stay HOT (a new version on the same
-- page, no new index entry); billing.Partitions creates the later ones
-- likewise. Pages already full fill only as rows are inserted anew.
DO $$
DECLARE
    p regclass;
BEGIN
    FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'usage'::regclass LOOP
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 70)', p);
    END LOOP;
END $$;
