DROP TABLE usage_flushed;
