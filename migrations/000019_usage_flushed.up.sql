-- The last usage batch the flush recorded of each tenant: its sequence
-- (lua/claim.lua) and id, and the sequences of the last 16 recorded. A
-- batch is recorded only if its sequence is greater than the tenant's
-- here, in the transaction that adds its rows, so a batch recorded again (a
-- worker that died before dropping it from Redis, two workers on the same
-- tenant, a batch Redis holds in flight again after it went back to older
-- data) counts once. One row per tenant, updated in place, whatever the
-- number of batches: usage_batches, which keeps one row per batch id, now
-- records only the batches claimed by an earlier release and the API
-- nodes' outage batches.
CREATE TABLE usage_flushed (
    tenant_id  uuid PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    seq        bigint NOT NULL CHECK (seq > 0),
    batch_id   text NOT NULL CHECK (length(batch_id) BETWEEN 1 AND 200),
    recent     bigint[] NOT NULL DEFAULT '{}' CHECK (cardinality(recent) <= 16),
    flushed_at timestamptz NOT NULL
) WITH (fillfactor = 70); -- (room on each page, so that updates stay HOT)
