ALTER TABLE usage DROP COLUMN IF EXISTS meter_overage_units;
ALTER TABLE tiers DROP COLUMN IF EXISTS meter_quotas;
