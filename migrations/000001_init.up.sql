-- Tollgate's initial schema. Money is integer cents, quantities integer units,
-- times timestamptz (UTC). NULL limits mean unlimited.

CREATE TABLE tiers (
    slug                       text PRIMARY KEY
                               CHECK (slug ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    name                       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    rank                       integer NOT NULL UNIQUE CHECK (rank >= 0),
    price_cents                bigint NOT NULL CHECK (price_cents >= 0),
    burst_rate                 double precision CHECK (burst_rate > 0),
    burst                      bigint CHECK (burst > 0),
    bucket_capacity            bigint CHECK (bucket_capacity > 0),
    bucket_refill_per_sec      double precision CHECK (bucket_refill_per_sec > 0),
    daily_quota                bigint CHECK (daily_quota >= 0),
    monthly_quota              bigint CHECK (monthly_quota >= 0),
    overage                    text NOT NULL DEFAULT 'block' CHECK (overage IN ('block', 'bill')),
    overage_price_cents_per_1k bigint NOT NULL DEFAULT 0 CHECK (overage_price_cents_per_1k >= 0),
    fail_open                  boolean NOT NULL DEFAULT false,
    upgrade_url                text NOT NULL DEFAULT '',
    created_at                 timestamptz NOT NULL DEFAULT now(),
    updated_at                 timestamptz NOT NULL DEFAULT now(),
    CHECK ((burst_rate IS NULL) = (burst IS NULL)),
    CHECK ((bucket_capacity IS NULL) = (bucket_refill_per_sec IS NULL)),
    CHECK (overage = 'block' OR overage_price_cents_per_1k > 0)
);

CREATE TABLE tenants (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name           text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    tier           text NOT NULL REFERENCES tiers (slug) ON UPDATE CASCADE ON DELETE RESTRICT,
    status         text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended')),
    -- per-tenant overrides of any tier limit: {"daily_quota": 5000, "burst": null, ...}
    overrides      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(overrides) = 'object'),
    webhook_url    text NOT NULL DEFAULT '',
    -- Standard Webhooks signing secret (raw bytes; shown base64 as whsec_...)
    webhook_secret bytea NOT NULL CHECK (length(webhook_secret) >= 24),
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tenants_tier_idx ON tenants (tier);

-- Which tier a tenant was on when: invoices prorate the price by it.
CREATE TABLE tenant_tier_history (
    tenant_id  uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    tier       text NOT NULL REFERENCES tiers (slug) ON UPDATE CASCADE ON DELETE RESTRICT,
    valid_from timestamptz NOT NULL,
    valid_to   timestamptz,
    PRIMARY KEY (tenant_id, valid_from),
    CHECK (valid_to IS NULL OR valid_to > valid_from)
);
CREATE UNIQUE INDEX tenant_tier_history_open_idx ON tenant_tier_history (tenant_id) WHERE valid_to IS NULL;

CREATE TABLE api_keys (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id     uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    prefix        text NOT NULL UNIQUE CHECK (length(prefix) BETWEEN 8 AND 64),
    -- SHA-256 of the whole secret; the secret itself is never stored
    secret_sha256 bytea NOT NULL UNIQUE CHECK (length(secret_sha256) = 32),
    name          text NOT NULL DEFAULT '' CHECK (length(name) <= 200),
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz,
    expires_at    timestamptz
);
CREATE INDEX api_keys_tenant_idx ON api_keys (tenant_id);

-- Extra units for a tenant's day or month.
CREATE TABLE grants (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id    uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    period       text NOT NULL CHECK (period IN ('day', 'month')),
    period_start date NOT NULL,
    units        bigint NOT NULL CHECK (units > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    CHECK (period = 'day' OR extract(day FROM period_start) = 1)
);
CREATE INDEX grants_tenant_period_idx ON grants (tenant_id, period, period_start);

-- Usage per tenant, meter and UTC hour, flushed from Redis by the worker.
CREATE TABLE usage (
    tenant_id     uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    hour          timestamptz NOT NULL CHECK (extract(epoch FROM hour)::bigint % 3600 = 0),
    meter         text NOT NULL CHECK (length(meter) BETWEEN 1 AND 64),
    units         bigint NOT NULL DEFAULT 0 CHECK (units >= 0),
    requests      bigint NOT NULL DEFAULT 0 CHECK (requests >= 0),
    rejected      bigint NOT NULL DEFAULT 0 CHECK (rejected >= 0),
    overage_units bigint NOT NULL DEFAULT 0 CHECK (overage_units >= 0 AND overage_units <= units),
    PRIMARY KEY (tenant_id, hour, meter)
);

-- Ids of flushed batches: recorded in the same transaction as their usage rows,
-- so that a batch is counted exactly once.
CREATE TABLE usage_batches (
    batch_id   text PRIMARY KEY CHECK (length(batch_id) BETWEEN 1 AND 200),
    tenant_id  uuid NOT NULL,
    units      bigint NOT NULL CHECK (units >= 0),
    requests   bigint NOT NULL CHECK (requests >= 0),
    flushed_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE invoices (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id      uuid NOT NULL REFERENCES tenants (id) ON DELETE RESTRICT,
    period         date NOT NULL CHECK (extract(day FROM period) = 1),
    status         text NOT NULL DEFAULT 'draft' CHECK (status IN ('draft', 'final')),
    currency       text NOT NULL DEFAULT 'usd' CHECK (currency ~ '^[a-z]{3}$'),
    total_cents    bigint NOT NULL DEFAULT 0 CHECK (total_cents >= 0),
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    finalized_at   timestamptz,
    UNIQUE (tenant_id, period),
    CHECK ((status = 'final') = (finalized_at IS NOT NULL))
);
CREATE INDEX invoices_period_idx ON invoices (period);

CREATE TABLE invoice_lines (
    invoice_id       uuid NOT NULL REFERENCES invoices (id) ON DELETE CASCADE,
    line_no          integer NOT NULL CHECK (line_no >= 1),
    kind             text NOT NULL CHECK (kind IN ('subscription', 'included', 'overage', 'grant')),
    description      text NOT NULL,
    quantity         bigint NOT NULL CHECK (quantity >= 0),
    amount_cents     bigint NOT NULL CHECK (amount_cents >= 0),
    PRIMARY KEY (invoice_id, line_no)
);

-- Threshold crossings (80 %, 100 % of the monthly quota): an outbox of webhooks.
CREATE TABLE alerts (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id       uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    period          date NOT NULL,
    threshold       integer NOT NULL CHECK (threshold IN (80, 100)),
    units           bigint NOT NULL CHECK (units >= 0),
    quota           bigint NOT NULL CHECK (quota >= 0),
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed', 'skipped')),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    UNIQUE (tenant_id, period, threshold)
);
CREATE INDEX alerts_pending_idx ON alerts (next_attempt_at) WHERE status = 'pending';

-- Every admin change: what, when, before and after; written in the change's transaction.
CREATE TABLE audit_log (
    id        bigserial PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text NOT NULL,
    action    text NOT NULL CHECK (action IN ('create', 'update', 'delete')),
    entity    text NOT NULL,
    entity_id text NOT NULL,
    before    jsonb,
    after     jsonb
);
CREATE INDEX audit_log_entity_idx ON audit_log (entity, entity_id);

INSERT INTO tiers (slug, name, rank, price_cents, burst_rate, burst, bucket_capacity, bucket_refill_per_sec,
                   daily_quota, monthly_quota, overage, overage_price_cents_per_1k, fail_open, upgrade_url)
VALUES
    ('free', 'Free', 0, 0, 5, 10, 60, 2, 1000, 10000, 'block', 0, false,
     'https://tollgate.example/pricing?upgrade=pro'),
    ('pro', 'Pro', 10, 4900, 50, 100, 1000, 20, 50000, 1000000, 'bill', 50, true,
     'https://tollgate.example/pricing?upgrade=enterprise'),
    ('enterprise', 'Enterprise', 20, 49900, 500, 1000, 20000, 400, NULL, 20000000, 'bill', 20, true,
     'https://tollgate.example/contact-sales');
