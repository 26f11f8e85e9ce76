-- Back to one usage table with every row: the partitions' rows, and the
-- monthly totals of the months whose detail the retention dropped, each as
-- one row at its month's first hour (the month's totals are kept; its
-- hourly detail was gone already).
DROP VIEW usage_ledger;
ALTER TABLE usage RENAME TO usage_partitioned;
ALTER TABLE usage_partitioned RENAME CONSTRAINT usage_pkey TO usage_partitioned_pkey;

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
);

INSERT INTO usage (tenant_id, hour, meter, units, requests, rejected, overage_units, shadow_refused, degraded, meter_overage_units)
SELECT tenant_id, hour, meter, units, requests, rejected, overage_units, shadow_refused, degraded, meter_overage_units
FROM usage_partitioned;
INSERT INTO usage AS u (tenant_id, hour, meter, units, requests, rejected, overage_units, shadow_refused, degraded, meter_overage_units)
SELECT tenant_id, month, meter, units, requests, rejected, overage_units, shadow_refused, degraded, meter_overage_units
FROM usage_monthly
ON CONFLICT (tenant_id, hour, meter) DO UPDATE SET
    units = u.units + EXCLUDED.units, requests = u.requests + EXCLUDED.requests,
    rejected = u.rejected + EXCLUDED.rejected, overage_units = u.overage_units + EXCLUDED.overage_units,
    shadow_refused = u.shadow_refused + EXCLUDED.shadow_refused, degraded = u.degraded + EXCLUDED.degraded,
    meter_overage_units = u.meter_overage_units + EXCLUDED.meter_overage_units;

DROP TABLE usage_monthly;
DROP TABLE usage_partitioned; -- with its partitions

-- (pg_trgm stays: other objects of the database may use it.)
DROP INDEX IF EXISTS tenants_name_trgm_idx;
DROP INDEX IF EXISTS tenants_created_idx;
DROP INDEX IF EXISTS tenants_id_text_idx;
CREATE INDEX IF NOT EXISTS invoices_period_idx ON invoices (period);
DROP INDEX IF EXISTS invoices_period_tenant_idx;
