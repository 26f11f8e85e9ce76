--[[ claim.lua: the library's function claim: take a tenant's pending usage
as one batch for the worker.

If a batch is already in flight (a worker died, or another one is flushing
it), that batch is returned again, unchanged, so that it is recorded in
Postgres exactly once (by its sequence, below). Otherwise the pending usage
is moved to the flushing hash, tagged with the new batch id and sequence:
the pending hash is
renamed, and the "p" fields of the state hash (state.lua) are moved
(summed into the same fields when both hold an hour and meter; a
"units,requests" field into its |u and |r) and deleted from it
(each_pending, lua/pending_fields.lua). Admissions from then on count
from zero again. All in one call: nothing is counted twice or lost
between the two.

KEYS (the tenant's hash tag {t:<id>})
  KEYS[1] <prefix>:v1:{t:<id>}:pending   hash "<hour unix s>|<meter>|u|r|x|o" -> count
  KEYS[2] <prefix>:v1:{t:<id>}:flushing  hash: the same fields plus "batch" -> batch id, "seq" -> sequence
  KEYS[3] <prefix>:v2:{t:<id>}           the state hash: "p<hour>|<meter>|" ... fields
ARGV
  [1] a new batch id (used only when no batch is in flight)
  [2] TTL of the flushing hash, ms (bounds an abandoned batch)
  [3] optional: the id of a batch of this tenant that Postgres recorded and
      the worker has not dropped yet; if it is the batch in flight, it is
      dropped first (as finish.lua would), so the claim takes what is
      pending since. The worker drops the batches it recorded this way, in
      its next claim of the tenant, rather than by a call of their own.
Return: {} when there is nothing to flush, else the flat HGETALL of the
flushing hash (its "batch" field names the batch, its "seq" field is the
batch's sequence).

The sequence orders a tenant's batches for the ledger, which remembers the
last it recorded of each tenant (usage_flushed) and records a batch, once,
only if its sequence is greater: Redis' clock in microseconds, which grows
from one batch of a tenant to the next (a batch is claimed only after the
one before it was recorded and dropped). Should the clock go back, the
ledger still records a batch it finds in flight and has not recorded
(internal/billing, rescue). A batch claimed by a release before sequences
has no "seq": the ledger records it by its id, in usage_batches, as that
release did.
]]
do
-- hincrby adds n to field name of the hash key (each_pending's f).
local function hincrby(key, name, n)
  redis.call('HINCRBY', key, name, n)
end

function FN.claim()
if ARGV[3] and redis.call('HGET', KEYS[2], 'batch') == ARGV[3] then
  redis.call('DEL', KEYS[2])
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  local moved = {}
  local h = redis.call('HGETALL', KEYS[3])
  for i = 1, #h, 2 do
    if string.byte(h[i], 1) == 112 then -- 'p'
      moved[#moved + 1] = h[i]
    end
  end
  local pending = redis.call('EXISTS', KEYS[1]) == 1
  if #moved == 0 and not pending then
    return {}
  end
  if pending then
    redis.call('RENAME', KEYS[1], KEYS[2])
  end
  each_pending(h, hincrby, KEYS[2])
  if #moved > 0 then
    redis.call('HDEL', KEYS[3], unpack(moved))
  end
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[2], 'batch', ARGV[1], 'seq', t[1] .. string.format('%06d', tonumber(t[2])))
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return redis.call('HGETALL', KEYS[2])
end
end
