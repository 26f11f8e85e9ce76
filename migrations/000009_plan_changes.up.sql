-- Plan changes (issue 15, points 2 and 3).
--
-- Each tenant's billing calendar: the day of the month its billing months
-- start (1..28, so that every month has it) and its IANA time zone (checked
-- by the application with Go's time.LoadLocation; 64 bytes at most). Stored
-- only: billing does not read them yet.
ALTER TABLE tenants
    ADD COLUMN billing_anchor_day integer NOT NULL DEFAULT 1
        CONSTRAINT tenants_billing_anchor_day_check CHECK (billing_anchor_day BETWEEN 1 AND 28),
    ADD COLUMN time_zone text NOT NULL DEFAULT 'UTC'
        CONSTRAINT tenants_time_zone_check CHECK (length(time_zone) BETWEEN 1 AND 64),
    -- A tier change asked for the next billing period: applied by the worker
    -- once pending_effective_at has passed; all four set, or none.
    ADD COLUMN pending_tier text REFERENCES tiers (slug) ON UPDATE CASCADE ON DELETE RESTRICT,
    ADD COLUMN pending_effective_at timestamptz,
    ADD COLUMN pending_quota text CHECK (pending_quota IN ('carry', 'reset')),
    ADD COLUMN pending_requested_at timestamptz,
    ADD CONSTRAINT tenants_pending_change_check CHECK (
        (pending_tier IS NULL) = (pending_effective_at IS NULL)
        AND (pending_tier IS NULL) = (pending_quota IS NULL)
        AND (pending_tier IS NULL) = (pending_requested_at IS NULL));
CREATE INDEX tenants_pending_due_idx ON tenants (pending_effective_at) WHERE pending_tier IS NOT NULL;

-- Quota resets of plan changes made with quota "reset": recorded in the
-- change's transaction, applied to the live counters in Redis after the
-- commit, and by the worker when Redis did not answer then. at is the
-- change's time: the reset's id in Redis (applied once) and the day and
-- month it empties.
CREATE TABLE quota_resets (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id  uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    at         timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    applied_at timestamptz
);
CREATE INDEX quota_resets_unapplied_idx ON quota_resets (at) WHERE applied_at IS NULL;

-- Each tier's prices over time, [valid_from, valid_to): invoices prorate
-- the subscription at the price in force in each stretch. A tier's first
-- row starts far in the past, so that any stretch of its history has a
-- price; a price change closes the open row and opens the next at the
-- change's transaction time.
CREATE TABLE tier_prices (
    tier                       text NOT NULL REFERENCES tiers (slug) ON UPDATE CASCADE ON DELETE CASCADE,
    price_cents                bigint NOT NULL CHECK (price_cents >= 0),
    overage_price_cents_per_1k bigint NOT NULL CHECK (overage_price_cents_per_1k >= 0),
    valid_from                 timestamptz NOT NULL,
    valid_to                   timestamptz,
    PRIMARY KEY (tier, valid_from),
    CHECK (valid_to IS NULL OR valid_to > valid_from)
);
CREATE UNIQUE INDEX tier_prices_open_idx ON tier_prices (tier) WHERE valid_to IS NULL;
INSERT INTO tier_prices (tier, price_cents, overage_price_cents_per_1k, valid_from)
SELECT slug, price_cents, overage_price_cents_per_1k, '1970-01-01T00:00:00Z' FROM tiers;
