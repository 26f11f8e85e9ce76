-- The worker prunes usage_batches by age (ids of batches too old to be
-- replayed): an index on flushed_at keeps each bounded delete a range scan.
-- A plain CREATE INDEX blocks writes to usage_batches while it builds, which
-- only delays the worker's flush; the API never writes here.
CREATE INDEX IF NOT EXISTS usage_batches_flushed_at ON usage_batches (flushed_at);
