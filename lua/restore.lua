--[[ restore.lua: repair a tenant's quota counters after Redis lost data.

The counters are set to at least what Postgres has recorded for the period
plus the usage still pending in Redis for it; grants to at least Postgres'.
Taking the maximum makes the script safe to run on counters that lost
nothing: it never lowers one.

KEYS (the tenant's hash tag {t:<id>}, version v1)
  KEYS[1] day hash (admit.lua): period, used, grant, overage
  KEYS[2] month hash
  KEYS[3] pending hash
ARGV (units are integer cost units; times Unix seconds, UTC)
  [1] day id (days since epoch)        [2] month id (year*100+month)
  [3] start of the day                 [4] start of the month
  [5] units recorded in Postgres today [6] units recorded this month
  [7] day grant from Postgres          [8] month grant from Postgres
  [9] expiry of the day hash, ms since epoch  [10] of the month hash
Return: {day used, month used} after the repair.
]]
local function pending_since(from)
  local sum = 0
  local h = redis.call('HGETALL', KEYS[3])
  for i = 1, #h, 2 do
    local hour, kind = string.match(h[i], '^(%d+)|.*|(%a)$')
    if kind == 'u' and tonumber(hour) >= from then
      sum = sum + tonumber(h[i + 1])
    end
  end
  return sum
end

local function repair(key, period, used, grant, pexpireat)
  local cur = redis.call('HMGET', key, 'period', 'used', 'grant')
  local u, g = 0, 0
  if cur[1] == period then
    u, g = tonumber(cur[2] or '0'), tonumber(cur[3] or '0')
  end
  u = math.max(u, used)
  g = math.max(g, grant)
  redis.call('HSET', key, 'period', period, 'used', string.format('%d', u), 'grant', string.format('%d', g))
  redis.call('PEXPIREAT', key, pexpireat)
  return u
end

local d = repair(KEYS[1], ARGV[1], tonumber(ARGV[5]) + pending_since(tonumber(ARGV[3])), tonumber(ARGV[7]), ARGV[9])
local m = repair(KEYS[2], ARGV[2], tonumber(ARGV[6]) + pending_since(tonumber(ARGV[4])), tonumber(ARGV[8]), ARGV[10])
return {d, m}
