-- Policies (API.md "Policies (v2)") count two more things per tenant, meter
-- and hour, flushed from Redis's pending usage with the rest (lua/admit.lua,
-- the pending fields "|s" and "|d"): requests a shadow policy would have
-- refused (admitted or not), and requests answered with a degrade policy's
-- fallback (not admitted, not charged, not counted in rejected). Rows from
-- before had neither: 0.
--
-- The checks are added NOT VALID: every existing row holds the default 0,
-- which passes them, and a validated check would scan the whole table
-- under this statement's ACCESS EXCLUSIVE lock (flushes and usage reads
-- wait meanwhile). Every row written from now on is checked all the same.
ALTER TABLE usage
    ADD COLUMN shadow_refused bigint NOT NULL DEFAULT 0,
    ADD COLUMN degraded       bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT usage_shadow_refused_check CHECK (shadow_refused >= 0) NOT VALID,
    ADD CONSTRAINT usage_degraded_check CHECK (degraded >= 0) NOT VALID;
