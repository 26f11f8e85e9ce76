-- Usage that reaches the ledger after its billing period's invoice is final
-- (a refund or a settlement of a request of the period, flushed late) never
-- changes that invoice; what it gives back becomes a credit on the tenant's
-- next invoice (billing.lateAdjust), in the transaction that records it.
--
-- One row per final invoice that late usage has reached. base_cents is what
-- the period rated to (its lines before credit draws) just before the first
-- late usage reached it; rerated_cents what it rates to with all the late
-- usage so far; credited_cents the sum of the credits given back for it.
-- Each late batch re-rates the period and credits
-- max(0, base_cents - rerated_cents) - credited_cents when positive, so
-- that several give-backs credit exactly the re-rated difference, and a
-- rounding cent is never credited twice. Late usage that raises a period
-- is not billed: credited_cents never goes down.
CREATE TABLE invoice_late_adjustments (
    invoice_id     uuid PRIMARY KEY REFERENCES invoices (id) ON DELETE CASCADE,
    base_cents     bigint NOT NULL CHECK (base_cents >= 0),
    rerated_cents  bigint NOT NULL CHECK (rerated_cents >= 0),
    credited_cents bigint NOT NULL DEFAULT 0 CHECK (credited_cents BETWEEN 0 AND base_cents),
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL
);

-- Each flush asks whether any period ended between its earliest row and now
-- (almost never: only around period ends, or for late rows), before it
-- looks for the ended invoices of its tenants.
CREATE INDEX invoices_period_end_idx ON invoices (period_end);
