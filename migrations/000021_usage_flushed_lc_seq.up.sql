-- The sequence of the last batch of the tenant that a release knowing
-- claim sequences in the state hash recorded (lua/claim.lua's "lc"): when
-- it is the tenant's last recorded batch (recent[1]), a batch Redis
-- claimed after another one (its "prev") must follow that last one; one
-- that follows an earlier recorded batch was claimed from older data Redis
-- went back to, and holds usage recorded already (internal/billing,
-- newBatches). A release before writes recent but not this: after its
-- records the check waits for this release's next one.
ALTER TABLE usage_flushed ADD COLUMN lc_seq bigint;
