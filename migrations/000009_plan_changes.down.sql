DROP TABLE IF EXISTS tier_prices;
DROP TABLE IF EXISTS quota_resets;
DROP INDEX IF EXISTS tenants_pending_due_idx;
ALTER TABLE tenants
    DROP CONSTRAINT IF EXISTS tenants_pending_change_check,
    DROP COLUMN IF EXISTS pending_requested_at,
    DROP COLUMN IF EXISTS pending_quota,
    DROP COLUMN IF EXISTS pending_effective_at,
    DROP COLUMN IF EXISTS pending_tier,
    DROP COLUMN IF EXISTS time_zone,
    DROP COLUMN IF EXISTS billing_anchor_day;
