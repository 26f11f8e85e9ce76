-- What the workers tell each other through Postgres. One row.
--
-- flushed_through: all usage counted in Redis before it is in the ledger.
-- The leading worker, which sweeps the whole keyspace, raises it after each
-- complete sweep (never lowers it: what it says stays true); the others
-- read it before they close the months of the tenants they own, so that no
-- invoice is finalized while usage of its period may still wait in Redis.
-- NULL until the first sweep.
--
-- redis_generation: the last generation the leading worker wrote to every
-- Redis master's epoch key and then recorded here, one more each cycle. A
-- master whose key holds a lower one went back to older data (a restart
-- from files behind its last writes, a failover to a replica that lagged):
-- the worker then drops what Redis holds unflushed, which was recorded
-- already, and restores the counters from the ledger.
CREATE TABLE worker_marks (
    id               boolean PRIMARY KEY DEFAULT true CHECK (id),
    flushed_through  timestamptz,
    redis_generation bigint NOT NULL DEFAULT 0 CHECK (redis_generation >= 0)
);
INSERT INTO worker_marks DEFAULT VALUES;
