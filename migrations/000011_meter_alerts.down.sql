DELETE FROM alerts WHERE meter <> '';
ALTER TABLE alerts DROP CONSTRAINT alerts_tenant_id_period_meter_threshold_key;
ALTER TABLE alerts ADD CONSTRAINT alerts_tenant_id_period_threshold_key UNIQUE (tenant_id, period, threshold);
ALTER TABLE alerts DROP COLUMN meter;
