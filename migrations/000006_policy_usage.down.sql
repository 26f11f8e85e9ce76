-- (a column's checks go with it)
ALTER TABLE usage DROP COLUMN IF EXISTS shadow_refused, DROP COLUMN IF EXISTS degraded;
