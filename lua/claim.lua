--[[ claim.lua: the library's function claim: take a tenant's pending usage
as one batch for the worker.

If a batch is already in flight (a worker died, or another one is flushing
it), that batch is returned again, unchanged, so that it is recorded in
Postgres exactly once under its id. Otherwise the pending usage is moved to
the flushing hash, tagged with the new batch id: the pending hash is
renamed, and the "p" fields of the state hash (state.lua) are moved
(summed into the same fields when both hold an hour and meter; a
"units,requests" field into its |u and |r) and deleted from it
(each_pending, lua/pending_fields.lua). Admissions from then on count
from zero again. All in one call: nothing is counted twice or lost
between the two.

KEYS (the tenant's hash tag {t:<id>})
  KEYS[1] <prefix>:v1:{t:<id>}:pending   hash "<hour unix s>|<meter>|u|r|x|o" -> count
  KEYS[2] <prefix>:v1:{t:<id>}:flushing  hash: the same fields plus "batch" -> batch id
  KEYS[3] <prefix>:v2:{t:<id>}           the state hash: "p<hour>|<meter>|" ... fields
ARGV
  [1] a new batch id (used only when no batch is in flight)
  [2] TTL of the flushing hash, ms (bounds an abandoned batch)
Return: {} when there is nothing to flush, else the flat HGETALL of the
flushing hash (its "batch" field names the batch).
]]
do
-- hincrby adds n to field name of the hash key (each_pending's f).
local function hincrby(key, name, n)
  redis.call('HINCRBY', key, name, n)
end

function FN.claim()
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
  redis.call('HSET', KEYS[2], 'batch', ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return redis.call('HGETALL', KEYS[2])
end
end
