ALTER TABLE usage_flushed DROP COLUMN prev, DROP COLUMN prev_of;
