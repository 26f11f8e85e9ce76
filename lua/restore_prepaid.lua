--[[ restore_prepaid.lua: the library's function restore_prepaid: give a
prepaid tenant's credit draws (admit.lua, "Prepaid": the field 'P' of the
meter quotas' hash, "m,mc,pm,pmc") back from the ledger after Redis lost
data (internal/billing's Repair).

Each period keeps the larger of the field's draws and the ledger's (draws
since the loss are in the field, those before it in the ledger: the larger
never counts a millicent twice, and may miss what was pending at the loss,
as restore.lua does). A field of the previous period (no draw since the
period changed) counts as that period's. A field of a later period than
the repair's (Redis's clock past the worker's at a period's end) is left
as it is: its draws are newer than the ledger's, and never rolled back.
The hash lives at least 40 days past the period's end, as admit.lua keeps
it for a prepaid tenant.

KEYS[1] <prefix>:v1:{t:<id>}:mq
ARGV [1] the period id, [2] its draws by the ledger, [3] the previous
     period's id, [4] its draws, [5] the period's end + 40 days, unix ms
Return: 1, or 0 when a later period's field was left as it is
]]
function FN.restore_prepaid()
local m, mc, pm, pmc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = redis.call('HGET', KEYS[1], 'P')
if cur then
  local s1, s2, s3, s4 = string.match(cur, '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+)$')
  if s1 then
    s1, s2, s3, s4 = tonumber(s1), tonumber(s2), tonumber(s3), tonumber(s4)
    if s1 > m then
      return 0
    elseif s1 == m then
      mc = math.max(mc, s2)
      if s3 == pm then pmc = math.max(pmc, s4) end
    elseif s1 == pm then
      pmc = math.max(pmc, s2)
    end
  end
end
redis.call('HSET', KEYS[1], 'P', string.format('%d,%d,%d,%d', m, mc, pm, pmc))
local ttl = redis.call('PTTL', KEYS[1])
local at = tonumber(ARGV[5])
if ttl < 0 or redis.call('TIME')[1] * 1000 + ttl < at then
  redis.call('PEXPIREAT', KEYS[1], ARGV[5])
end
return 1
end
