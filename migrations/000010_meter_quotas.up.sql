-- Quotas per meter (API.md "Plans (v2)"; quota.MeterQuota): a tier's list
-- of {meter, daily_quota, monthly_quota, overage, overage_price_cents_per_1k},
-- validated by the application (quota.ValidateMeterQuotas); existing tiers
-- have none, which is today's behaviour.
ALTER TABLE tiers
    ADD COLUMN meter_quotas jsonb NOT NULL DEFAULT '[]'::jsonb
        CONSTRAINT tiers_meter_quotas_check CHECK (jsonb_typeof(meter_quotas) = 'array');

-- The units admitted past a meter's own monthly quota (billed at the
-- meter's price, on its own invoice line), flushed from Redis's pending
-- usage with the rest (lua/admit.lua, the pending field "|m"). Such units
-- are not in overage_units (no unit is billed twice). Rows from before had
-- none: 0. NOT VALID for the reason 000006 gives.
ALTER TABLE usage
    ADD COLUMN meter_overage_units bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT usage_meter_overage_units_check CHECK (meter_overage_units >= 0) NOT VALID;
