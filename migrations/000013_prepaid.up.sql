-- Prepaid billing (API.md "Plans (v2)", Credits; quota.BillingPrepaid): a
-- tier's billing mode and the top-up URL its credit refusals (402) point
-- to. Existing tiers are postpaid, today's behaviour.
ALTER TABLE tiers
    ADD COLUMN billing text NOT NULL DEFAULT 'postpaid'
        CONSTRAINT tiers_billing_check CHECK (billing IN ('postpaid', 'prepaid')),
    ADD COLUMN top_up_url text NOT NULL DEFAULT ''
        CONSTRAINT tiers_top_up_url_check CHECK (length(top_up_url) <= 2048);

-- Low-balance alerts of prepaid tenants go through the same outbox and
-- signed webhooks as the quota thresholds, as alerts of kind 'credit':
-- threshold 80 when 80 % of the credit balance is spent by usage no
-- invoice has drawn yet, 100 when none is left; period is the UTC date of
-- the tenant's latest credit, so that a top-up arms them again. Existing
-- alerts are of kind 'quota'.
ALTER TABLE alerts
    ADD COLUMN kind text NOT NULL DEFAULT 'quota'
        CONSTRAINT alerts_kind_check CHECK (kind IN ('quota', 'credit'));
ALTER TABLE alerts DROP CONSTRAINT alerts_tenant_id_period_meter_threshold_key;
ALTER TABLE alerts ADD CONSTRAINT alerts_tenant_id_kind_period_meter_threshold_key
    UNIQUE (tenant_id, kind, period, meter, threshold);
