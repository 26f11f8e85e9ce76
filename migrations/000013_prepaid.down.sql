DELETE FROM alerts WHERE kind = 'credit';
ALTER TABLE alerts DROP CONSTRAINT alerts_tenant_id_kind_period_meter_threshold_key;
ALTER TABLE alerts ADD CONSTRAINT alerts_tenant_id_period_meter_threshold_key UNIQUE (tenant_id, period, meter, threshold);
ALTER TABLE alerts DROP COLUMN kind;
ALTER TABLE tiers DROP COLUMN top_up_url, DROP COLUMN billing;
