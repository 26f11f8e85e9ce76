-- Export of final invoices to Stripe (docs/stripe.md): each tenant's Stripe
-- customer, created once, and one export row per final invoice that the
-- worker drives from pending to exported, retrying failures with backoff.
ALTER TABLE tenants
    ADD COLUMN stripe_customer_id text
        CONSTRAINT tenants_stripe_customer_id_check CHECK (stripe_customer_id ~ '^[A-Za-z0-9_]{1,255}$');

CREATE TABLE invoice_exports (
    invoice_id        uuid PRIMARY KEY REFERENCES invoices (id) ON DELETE RESTRICT,
    -- pending: not tried yet or in progress; failed: the last attempt
    -- failed and is retried at next_attempt_at; exported: done, for good.
    status            text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'failed', 'exported')),
    stripe_invoice_id text CHECK (stripe_invoice_id ~ '^[A-Za-z0-9_]{1,255}$'),
    -- the invoice lines already sent as invoice items, in line_no order
    lines_done        integer NOT NULL DEFAULT 0 CHECK (lines_done >= 0),
    attempts          integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error        text NOT NULL DEFAULT '' CHECK (length(last_error) <= 1000),
    -- when the export may next be tried; while a worker holds it, the end
    -- of that worker's lease
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    exported_at       timestamptz,
    CHECK ((status = 'exported') = (exported_at IS NOT NULL)),
    CHECK (status <> 'exported' OR stripe_invoice_id IS NOT NULL)
);
CREATE INDEX invoice_exports_due ON invoice_exports (next_attempt_at) WHERE status <> 'exported';
CREATE INDEX invoice_exports_failed ON invoice_exports (invoice_id) WHERE status = 'failed';
