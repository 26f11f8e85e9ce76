--[[ claim.lua: take a tenant's pending usage as one batch for the worker.

If a batch is already in flight (a worker died, or another one is flushing
it), that batch is returned again, unchanged, so that it is recorded in
Postgres exactly once under its id. Otherwise the pending hash is renamed to
the flushing hash, tagged with the new batch id: admissions from then on
start a fresh pending hash.

KEYS (the tenant's hash tag {t:<id>}, version v1)
  KEYS[1] pending  hash "<hour unix s>|<meter>|u|r|x|o" -> count (admit.lua)
  KEYS[2] flushing hash: the same fields plus "batch" -> batch id
ARGV
  [1] a new batch id (used only when no batch is in flight)
  [2] TTL of the flushing hash, ms (bounds an abandoned batch)
Return: {} when there is nothing to flush, else the flat HGETALL of the
flushing hash (its "batch" field names the batch).
]]
if redis.call('EXISTS', KEYS[2]) == 0 then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    return {}
  end
  redis.call('RENAME', KEYS[1], KEYS[2])
  redis.call('HSET', KEYS[2], 'batch', ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return redis.call('HGETALL', KEYS[2])
