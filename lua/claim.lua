--[[ claim.lua: take a tenant's pending usage as one batch for the worker.

If a batch is already in flight (a worker died, or another one is flushing
it), that batch is returned again, unchanged, so that it is recorded in
Postgres exactly once under its id. Otherwise the pending usage is moved to
the flushing hash, tagged with the new batch id: the v1 pending hash is
renamed, and the "p" fields of the v2 state hash (state.lua) are moved
(summed into the same fields when both hold an hour and meter; a
"units,requests" field into its |u and |r) and deleted from it (each_pending, lua/pending_fields.lua, prepended). Admissions from
then on count from zero again. All in one script:
nothing is counted twice or lost between the two.

KEYS (the tenant's hash tag {t:<id>})
  KEYS[1] <prefix>:v1:{t:<id>}:pending   hash "<hour unix s>|<meter>|u|r|x|o" -> count
  KEYS[2] <prefix>:v1:{t:<id>}:flushing  hash: the same fields plus "batch" -> batch id
  KEYS[3] <prefix>:v2:{t:<id>}           the state hash: "p<hour>|<meter>|u" ... fields
ARGV
  [1] a new batch id (used only when no batch is in flight)
  [2] TTL of the flushing hash, ms (bounds an abandoned batch)
Return: {} when there is nothing to flush, else the flat HGETALL of the
flushing hash (its "batch" field names the batch).
]]
if redis.call('EXISTS', KEYS[2]) == 0 then
  local moved = {}
  local h = redis.call('HGETALL', KEYS[3])
  for i = 1, #h, 2 do
    if string.byte(h[i], 1) == 112 then -- 'p'
      moved[#moved + 1] = h[i]
    end
  end
  local v1 = redis.call('EXISTS', KEYS[1]) == 1
  if #moved == 0 and not v1 then
    return {}
  end
  if v1 then
    redis.call('RENAME', KEYS[1], KEYS[2])
  end
  each_pending(h, function(name, n)
    redis.call('HINCRBY', KEYS[2], name, n)
  end)
  if #moved > 0 then
    redis.call('HDEL', KEYS[3], unpack(moved))
  end
  redis.call('HSET', KEYS[2], 'batch', ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return redis.call('HGETALL', KEYS[2])
