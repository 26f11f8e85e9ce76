DROP INDEX IF EXISTS grants_unapplied_idx;
DROP INDEX IF EXISTS grants_tenant_idempotency_key_idx;
ALTER TABLE grants DROP COLUMN IF EXISTS applied_at, DROP COLUMN IF EXISTS idempotency_key;
