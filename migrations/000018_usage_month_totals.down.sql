DO $$
DECLARE
    p regclass;
BEGIN
    FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'usage'::regclass LOOP
        EXECUTE format('ALTER TABLE %s RESET (fillfactor)', p);
    END LOOP;
END $$;
DROP TRIGGER usage_month_totals_truncate ON usage;
DROP TRIGGER usage_month_totals_delete ON usage;
DROP TRIGGER usage_month_totals_update ON usage;
DROP TRIGGER usage_month_totals_insert ON usage;
DROP FUNCTION usage_month_totals_truncate();
DROP FUNCTION usage_month_totals_track();
DROP TABLE usage_month_totals;
