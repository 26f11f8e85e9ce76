-- The sequence of the batch Redis claimed of the tenant before the one
-- recorded last (lua/claim.lua's "prev"; NULL when Redis did not know it).
-- A batch is recorded only if its prev, when known, is not below the last
-- sequence recorded: one below it comes from Redis gone back to older data,
-- and holds usage recorded already (internal/billing, newBatches).
ALTER TABLE usage_flushed ADD COLUMN prev bigint;
