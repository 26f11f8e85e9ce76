-- Grants become exactly-once. An admin's Idempotency-Key names one grant of
-- a tenant (a retried POST answers it instead of granting again); applied_at
-- says when the grant reached the tenant's counter in Redis: NULL until the
-- API, or else the worker's grants step, has applied it (Redis applies a
-- grant id once, whoever sends it).
ALTER TABLE grants
    ADD COLUMN idempotency_key text CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    ADD COLUMN applied_at timestamptz;
-- Older grants were applied when they were made, or reported as failed then:
-- the worker must not apply them now (Redis knows no ids for them).
UPDATE grants SET applied_at = created_at;
CREATE UNIQUE INDEX grants_tenant_idempotency_key_idx ON grants (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX grants_unapplied_idx ON grants (period_start) WHERE applied_at IS NULL;
