ALTER TABLE usage_flushed DROP COLUMN lc_seq;
