-- Spend caps (issue 15, point 5): the most a month's overage may cost a
-- tenant of a bill tier, in cents; null is no cap. A tenant's own cap is an
-- override (tenants.overrides, JSON: max_overage_cents), like its other
-- limits. A block tier has no overage, so no cap.
ALTER TABLE tiers
    ADD COLUMN IF NOT EXISTS max_overage_cents bigint
        CONSTRAINT tiers_max_overage_cents_check CHECK (max_overage_cents BETWEEN 0 AND 1099511627776),
    ADD CONSTRAINT tiers_max_overage_cents_bill_check CHECK (max_overage_cents IS NULL OR overage = 'bill');
