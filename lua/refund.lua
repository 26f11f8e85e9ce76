--[[ refund.lua: give back the units of an admitted request whose upstream
failed with a 5xx on a route that refunds.

The daily and monthly quotas get the cost back, and the month its overage
units, only while they are still in the period the request was admitted in
(a refund after the period rolled over changes nothing there). The pending
usage of the request's hour loses the units and overage units; the request
itself stays counted in "|r". GCRA and the token bucket are not refunded:
they protect against load, and the failed call was load.

Units: integer units; times integer microseconds since the Unix epoch, UTC.

KEYS (all with the tenant's hash tag {t:<id>} and the v1 version)
  KEYS[1] day     hash (see admit.lua): period, used, grant, overage
  KEYS[2] month   hash
  KEYS[3] pending hash: "<hour start, unix s>|<meter>|u", "|o", ...

ARGV
  [1] day id of the admission (days since epoch)
  [2] month id of the admission (year*100+month)
  [3] hour start of the admission, unix seconds
  [4] meter
  [5] cost, units
  [6] overage units of the admission

Return: 1.
]]

local cost = tonumber(ARGV[5])
local over = tonumber(ARGV[6])

local function give_back(key, period, field, n)
  if n <= 0 or redis.call('HGET', key, 'period') ~= period then
    return
  end
  local v = tonumber(redis.call('HGET', key, field) or '0')
  redis.call('HSET', key, field, string.format('%d', math.max(0, v - n)))
end

give_back(KEYS[1], ARGV[1], 'used', cost)
give_back(KEYS[2], ARGV[2], 'used', cost)
give_back(KEYS[2], ARGV[2], 'overage', over)

local f = ARGV[3] .. '|' .. ARGV[4] .. '|'
redis.call('HINCRBY', KEYS[3], f .. 'u', -cost)
if over > 0 then
  redis.call('HINCRBY', KEYS[3], f .. 'o', -over)
end
if redis.call('PTTL', KEYS[3]) < 0 then
  redis.call('PEXPIRE', KEYS[3], 14 * 86400 * 1000)
end
return 1
