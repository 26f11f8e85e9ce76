-- Threshold alerts of meter quotas (API.md "Plans (v2)"): a crossing of 80 %
-- or 100 % of a meter's monthly quota is an alert of its own, with the
-- meter's name; '' is the tier-wide monthly quota, as every alert so far.
ALTER TABLE alerts
    ADD COLUMN meter text NOT NULL DEFAULT ''
        CONSTRAINT alerts_meter_check CHECK (length(meter) <= 64);
ALTER TABLE alerts DROP CONSTRAINT alerts_tenant_id_period_threshold_key;
ALTER TABLE alerts ADD CONSTRAINT alerts_tenant_id_period_meter_threshold_key UNIQUE (tenant_id, period, meter, threshold);
