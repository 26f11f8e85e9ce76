--[[ pending.lua: the library's function pending: a tenant's usage not yet
flushed, or whether it has any (read only).

Pending usage lives in the "p" fields of the state hash, and in the
pending hash while the tenant has no state (state.lua; read by
each_pending, lua/pending_fields.lua); a batch the worker claimed waits
in the flushing hash.

KEYS (the tenant's hash tag {t:<id>})
  KEYS[1] <prefix>:v1:{t:<id>}:pending
  KEYS[2] <prefix>:v2:{t:<id>}
  KEYS[3] <prefix>:v1:{t:<id>}:flushing
ARGV
  [1] 'get': the pending fields of both hashes, summed, as a flat list of
      "<hour unix s>|<meter>|<u|r|x|o>", count (the flushing batch is not
      included); 'any': 1 when anything is pending or in flight, else 0
]]
do
-- add adds count v to field f of the sums acc (each_pending's f).
local function add(acc, f, v)
  local sum = acc.sum
  if not sum[f] then acc.order[#acc.order + 1] = f; sum[f] = 0 end
  sum[f] = sum[f] + tonumber(v)
end

function FN.pending()
if ARGV[1] == 'any' then
  if redis.call('EXISTS', KEYS[1], KEYS[3]) > 0 then return 1 end
  local h = redis.call('HGETALL', KEYS[2])
  for i = 1, #h, 2 do
    if string.byte(h[i], 1) == 112 then return 1 end -- 'p'
  end
  return 0
end
local acc = {sum = {}, order = {}}
local h = redis.call('HGETALL', KEYS[1])
for i = 1, #h, 2 do add(acc, h[i], h[i + 1]) end
each_pending(redis.call('HGETALL', KEYS[2]), add, acc)
local out = {}
for _, f in ipairs(acc.order) do
  out[#out + 1] = f
  out[#out + 1] = string.format('%d', acc.sum[f])
end
return out
end
end
