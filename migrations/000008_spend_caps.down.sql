-- (a column's checks go with it; tenants' overrides keep a
-- max_overage_cents member, which the versions before ignore)
ALTER TABLE tiers DROP COLUMN IF EXISTS max_overage_cents;
