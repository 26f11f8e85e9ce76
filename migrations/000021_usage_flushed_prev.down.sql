ALTER TABLE usage_flushed DROP COLUMN prev;
