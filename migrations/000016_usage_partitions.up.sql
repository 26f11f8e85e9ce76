-- The usage ledger partitioned by UTC month (RANGE on hour), so that a
-- month's rows live in a table of their own: reads of a period touch only
-- its months, and hourly detail past the retention
-- (TOLLGATE_USAGE_RETENTION) is dropped a month at a time instead of
-- deleted row by row. The worker creates the partitions of the coming
-- months ahead (billing.Partitions); a row whose month has no partition
-- yet lands in usage_default, and is moved into its month's partition when
-- that is created, so no write ever fails for want of a partition.
--
-- The primary key (tenant_id, hour, meter) already holds the partition key,
-- so it stays the key the flush's upserts (ON CONFLICT) rely on. The
-- existing rows are moved in this migration's transaction; usage reads and
-- flushes wait for it (ACCESS EXCLUSIVE on the old table).
ALTER TABLE usage RENAME TO usage_unpartitioned;
ALTER TABLE usage_unpartitioned RENAME CONSTRAINT usage_pkey TO usage_unpartitioned_pkey;

CREATE TABLE usage (
    tenant_id           uuid NOT NULL CONSTRAINT usage_tenant_id_fkey REFERENCES tenants (id) ON DELETE CASCADE,
    hour                timestamptz NOT NULL CONSTRAINT usage_hour_check CHECK (extract(epoch FROM hour)::bigint % 3600 = 0),
    meter               text NOT NULL CONSTRAINT usage_meter_check CHECK (length(meter) BETWEEN 1 AND 64),
    units               bigint NOT NULL DEFAULT 0 CONSTRAINT usage_units_check CHECK (units >= 0),
    requests            bigint NOT NULL DEFAULT 0 CONSTRAINT usage_requests_check CHECK (requests >= 0),
    rejected            bigint NOT NULL DEFAULT 0 CONSTRAINT usage_rejected_check CHECK (rejected >= 0),
    overage_units       bigint NOT NULL DEFAULT 0 CONSTRAINT usage_check CHECK (overage_units >= 0 AND overage_units <= units),
    shadow_refused      bigint NOT NULL DEFAULT 0 CONSTRAINT usage_shadow_refused_check CHECK (shadow_refused >= 0),
    degraded            bigint NOT NULL DEFAULT 0 CONSTRAINT usage_degraded_check CHECK (degraded >= 0),
    meter_overage_units bigint NOT NULL DEFAULT 0 CONSTRAINT usage_meter_overage_units_check CHECK (meter_overage_units >= 0),
    PRIMARY KEY (tenant_id, hour, meter)
) PARTITION BY RANGE (hour);

CREATE TABLE usage_default PARTITION OF usage DEFAULT;

-- One partition per month that has rows, and the current month with the
-- next two (the worker keeps creating them ahead from here on).
DO $$
DECLARE
    m timestamp;
BEGIN
    FOR m IN
        SELECT DISTINCT date_trunc('month', hour AT TIME ZONE 'UTC') FROM usage_unpartitioned
        UNION
        SELECT date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => k) FROM generate_series(0, 2) AS k
    LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF usage FOR VALUES FROM (%L) TO (%L)',
                       'usage_p' || to_char(m, 'YYYYMM'),
                       (m AT TIME ZONE 'UTC')::text, ((m + interval '1 month') AT TIME ZONE 'UTC')::text);
    END LOOP;
END $$;

INSERT INTO usage (tenant_id, hour, meter, units, requests, rejected, overage_units, shadow_refused, degraded, meter_overage_units)
SELECT tenant_id, hour, meter, units, requests, rejected, overage_units, shadow_refused, degraded, meter_overage_units
FROM usage_unpartitioned;
DROP TABLE usage_unpartitioned;

-- Monthly totals of the months whose hourly detail the retention dropped:
-- filled from a month's rows in the transaction that drops them, so every
-- unit is in exactly one of usage and usage_monthly. month is the UTC
-- month's first instant.
CREATE TABLE usage_monthly (
    tenant_id           uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    month               timestamptz NOT NULL CHECK (month = date_trunc('month', month AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'),
    meter               text NOT NULL CHECK (length(meter) BETWEEN 1 AND 64),
    units               bigint NOT NULL CHECK (units >= 0),
    requests            bigint NOT NULL CHECK (requests >= 0),
    rejected            bigint NOT NULL CHECK (rejected >= 0),
    overage_units       bigint NOT NULL CHECK (overage_units >= 0 AND overage_units <= units),
    shadow_refused      bigint NOT NULL CHECK (shadow_refused >= 0),
    degraded            bigint NOT NULL CHECK (degraded >= 0),
    meter_overage_units bigint NOT NULL CHECK (meter_overage_units >= 0),
    PRIMARY KEY (tenant_id, month, meter)
);

-- Every unit of the ledger, for the readers of past periods (/v1/usage,
-- the console's totals, invoices and their rerating): the hourly rows, and
-- each rolled-up month's totals as one row at the month's first instant.
CREATE VIEW usage_ledger AS
    SELECT tenant_id, hour, meter, units, requests, rejected, overage_units, shadow_refused, degraded, meter_overage_units
    FROM usage
    UNION ALL
    SELECT tenant_id, month, meter, units, requests, rejected, overage_units, shadow_refused, degraded, meter_overage_units
    FROM usage_monthly;

-- Indexes for 100,000 tenants and more. Tenants are looked up by id given
-- as text (id::text = $1: input that is not a UUID finds nothing instead
-- of failing), which without this index is a scan of every tenant on each
-- lookup (invoice generation, credits, the admin API). The console lists
-- tenants oldest first, a page at a time, and searches them by a substring
-- of the name (ILIKE '%...%', which a trigram index serves; pg_trgm is a
-- trusted extension, which the database's owner may create).
CREATE INDEX tenants_id_text_idx ON tenants ((id::text));
CREATE INDEX tenants_created_idx ON tenants (created_at, id);
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX tenants_name_trgm_idx ON tenants USING gin (name gin_trgm_ops);

-- Invoices of a month by tenant: the console's invoices page (a month's
-- invoices by tenant id, a page at a time) and the invoice sweeps' probe
-- of one tenant's invoice of a month. It replaces the index on period
-- alone, which the planner takes for that probe while a month's invoices
-- are being created faster than their statistics follow (filtering every
-- invoice of the month for each tenant).
CREATE INDEX invoices_period_tenant_idx ON invoices (period, tenant_id);
DROP INDEX invoices_period_idx;
