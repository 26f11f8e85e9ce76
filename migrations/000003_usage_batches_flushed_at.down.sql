DROP INDEX IF EXISTS usage_batches_flushed_at;
