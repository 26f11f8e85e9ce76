--[[ finish.lua: the library's function finish: drop a flushed batch, once
Postgres has recorded it. (The worker drops most batches in the tenant's
next claim instead, by the drop id claim.lua takes for each tenant; this
serves the batches it will not claim again: when it stops, and those of
another worker's tenants.)

KEYS[1] flushing hash of the tenant (see claim.lua)
ARGV[1] the batch id that was recorded
Return: 1 when the batch was dropped, 0 when the flushing hash holds another
batch (or none): then nothing is touched.
]]
function FN.finish()
if redis.call('HGET', KEYS[1], 'batch') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
end
