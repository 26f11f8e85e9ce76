-- The "prev" of the tenant's last recorded batch: the sequence of the
-- batch Redis claimed of the tenant before it (lua/claim.lua, which marks
-- each claim in the tenant's state hash; 0 for none), or NULL when the
-- claim left no mark (a release before, or a tenant without limit state in
-- Redis). When it is not NULL, Redis' mark names the last recorded batch
-- (recent[1]), and a batch claimed after another one must follow it; one
-- that follows an earlier recorded batch was claimed from older data Redis
-- went back to, and holds usage recorded already (internal/billing,
-- newBatches).
ALTER TABLE usage_flushed ADD COLUMN prev bigint CHECK (prev >= 0);
