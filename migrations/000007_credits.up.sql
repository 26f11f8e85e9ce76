-- Prepaid credits (API.md "Plans (v2)", Credits): a ledger per tenant of
-- credits granted by an admin and of their draws onto invoices.
--
-- credits holds what was granted; drawn_cents is how much of it invoices have
-- drawn so far. It is the sum of the credit's credit_draws, kept on the row on
-- purpose: finalizing an invoice locks the tenant's credit rows (FOR UPDATE)
-- and raises drawn_cents in the same transaction that inserts the draws and
-- makes the invoice final, so the row is both the lock that serializes two
-- finalizers and the place where the schema itself refuses an overdraw
-- (drawn_cents <= amount_cents). created_at comes from the application's
-- clock: a credit pays the invoices of the months it was valid at the end of.
CREATE TABLE credits (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id       uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    amount_cents    bigint NOT NULL CHECK (amount_cents BETWEEN 1 AND 1099511627776),
    drawn_cents     bigint NOT NULL DEFAULT 0,
    reason          text NOT NULL CHECK (length(reason) BETWEEN 1 AND 200),
    expires_at      timestamptz,
    created_at      timestamptz NOT NULL,
    -- An admin's Idempotency-Key names one credit of a tenant, for good.
    idempotency_key text CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    CHECK (drawn_cents BETWEEN 0 AND amount_cents),
    CHECK (expires_at IS NULL OR expires_at > created_at)
);
CREATE INDEX credits_tenant_idx ON credits (tenant_id, created_at);
CREATE UNIQUE INDEX credits_tenant_idempotency_key_idx ON credits (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- One draw of a credit onto a final invoice (drafts only show what they
-- would draw). A credit is drawn at most once per invoice; an invoice with
-- draws is final, and final invoices are never deleted.
CREATE TABLE credit_draws (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    credit_id    uuid NOT NULL REFERENCES credits (id) ON DELETE CASCADE,
    invoice_id   uuid NOT NULL REFERENCES invoices (id) ON DELETE RESTRICT,
    amount_cents bigint NOT NULL CHECK (amount_cents > 0),
    created_at   timestamptz NOT NULL,
    UNIQUE (credit_id, invoice_id)
);
CREATE INDEX credit_draws_invoice_idx ON credit_draws (invoice_id);

-- A draw is a negative line of kind credit on its invoice; every other line
-- stays at or above zero (and an invoice's total, already checked, too).
-- The new checks are added NOT VALID: they are looser than the ones they
-- replace, so every existing line passes them, and validating would scan the
-- whole table under this statement's ACCESS EXCLUSIVE lock. Every line
-- written from now on is checked all the same.
ALTER TABLE invoice_lines
    DROP CONSTRAINT invoice_lines_kind_check,
    DROP CONSTRAINT invoice_lines_amount_cents_check,
    ADD CONSTRAINT invoice_lines_kind_check
        CHECK (kind IN ('subscription', 'included', 'overage', 'grant', 'credit')) NOT VALID,
    ADD CONSTRAINT invoice_lines_amount_cents_check
        CHECK (CASE WHEN kind = 'credit' THEN amount_cents < 0 ELSE amount_cents >= 0 END) NOT VALID;
