-- How far the flush of usage into the ledger has come, for every worker:
-- all usage counted in Redis before flushed_through is in the ledger. The
-- leading worker, which sweeps the whole keyspace, raises it after each
-- complete sweep (never lowers it: what it says stays true); the others
-- read it before they close the months of the tenants they own, so that
-- no invoice is finalized while usage of its period may still wait in
-- Redis. One row.
CREATE TABLE flush_watermark (
    id              boolean PRIMARY KEY DEFAULT true CHECK (id),
    flushed_through timestamptz NOT NULL
);
