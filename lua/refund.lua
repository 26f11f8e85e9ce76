--[[ refund.lua: give back the units of an admitted request whose upstream
failed with a 5xx on a route that refunds.

It gives back exactly what the request took: the daily and monthly quotas
get the cost back, and the month the overage units the request was
admitted with, in the day and month the request was admitted in: the
day only while the state is still in it, the month while it is the
state's or the month before it (state.lua's month_load; a refund after
the next month began moves the month it was admitted in, never the new
one). The pending usage of the request's hour loses the units and overage
units, whenever the refund arrives (the worker nets a negative pending
count against the recorded usage of that hour); the request itself stays
counted in "|r". GCRA and the token bucket are not refunded:
they protect against load, and the failed call was load.

The state's keys, layouts and shared functions are lua/state.lua's,
prepended to this script. Units: integer units; times integer microseconds
since the Unix epoch, UTC.

KEYS
  KEYS[1..5] the state (state.lua)
  KEYS[6] <prefix>:v1:{t:<id>}:pending hash: "<hour start, unix s>|<meter>|u", "|o", ...
          (used while the state is in v1 keys; else the v2 hash's "p" fields)
  KEYS[7] (when the meter has a quota, or the tenant is prepaid)
          <prefix>:v1:{t:<id>}:mq, the meter quotas' hash (admit.lua,
          "Meter quotas"; meterq.lua): the meter's day and month get the
          cost back the same way, and the month the meter overage units
          the request took (ARGV[10], no more: a later request's overage
          stays billed), with the pending "|m" of the admission's hour
          and, when ARGV[8] >= 0, their price off the month's millicents
          ('$' or '$w': the spend cap's of the admission's month, never a
          later month's)

ARGV
  [1] layout 'v2' | 'v1' (state.lua)
  [2] day id of the admission (days since epoch)
  [3] month id of the admission (year*100+month)
  [4] hour start of the admission, unix seconds
  [5] meter
  [6] cost, units
  [7] the tier's overage units of the admission (quota.Decision.OverageUnits)
  [8] (with KEYS[7]) the meter's overage price per 1,000 units when the
      spend cap counts it, else -1
  [9] (with KEYS[7]) a prepaid tenant's "<tier's overage price>,<meter's
      overage price, 0 when not billed>", else '': the overage given back
      is given back to the admission month's credit draws too (meterq.lua's
      prepaid_adjust)
  [10] (with KEYS[7]) the meter overage units of the admission
      (quota.Decision.MeterOverageUnits)

Return: 1.
]]

local now, shift = clock(0)
local function pxat(us)
  return fmt(-idiv(-(us + shift), 1000))
end

local day, month = tonumber(ARGV[2]), tonumber(ARGV[3])
local cost = tonumber(ARGV[6])
local over = tonumber(ARGV[7])
local s = load_state()
local parts = {}
if cost > 0 and s.d == day then
  s.du = math.max(0, s.du - cost)
  parts[#parts + 1] = 'd'
end
-- the admission's month: the state's, or the month before it (state.lua)
local c = (cost > 0 or over > 0) and month_load(s, month)
if c then
  c.mu = math.max(0, c.mu - cost)
  c.mo = math.max(0, c.mo - over)
  month_store(s, month, c, parts)
end
if #parts > 0 then
  save_state(s, 0, nil, parts, pxat, now)
end

local f = ARGV[4] .. '|' .. ARGV[5] .. '|'
-- the meter quota (KEYS[7]; meterq.lua): what the request took, no more
local mback = 0
if KEYS[7] then
  local price = tonumber(ARGV[8])
  mback = tonumber(ARGV[10])
  local q = meterq_month(KEYS[7], ARGV[5], day, month)
  if q then
    if q.today then q.du = math.max(0, q.du - cost) end
    q.mu = math.max(0, q.mu - cost)
    q.mo = math.max(0, q.mo - mback)
    meterq_store(KEYS[7], ARGV[5], month, q)
  end
  if price >= 0 then meterq_spend(KEYS[7], month, -mback * price) end
  if ARGV[9] ~= '' then
    local tpp, mpp = string.match(ARGV[9], '^(%d+),(%d+)$')
    prepaid_adjust(KEYS[7], month, -(over * tpp + mback * mpp))
  end
end
if s.v2 then
  -- the pending usage lives in the v2 hash (state.lua), which lives 14 days
  -- after the admission refunded here
  redis.call('HINCRBY', KS, 'p' .. f .. 'u', -cost)
  if over > 0 then redis.call('HINCRBY', KS, 'p' .. f .. 'o', -over) end
  if mback > 0 then redis.call('HINCRBY', KS, 'p' .. f .. 'm', -mback) end
  return 1
end
redis.call('HINCRBY', KEYS[6], f .. 'u', -cost)
if over > 0 then
  redis.call('HINCRBY', KEYS[6], f .. 'o', -over)
end
if mback > 0 then
  redis.call('HINCRBY', KEYS[6], f .. 'm', -mback)
end
if redis.call('PTTL', KEYS[6]) < 0 then
  redis.call('PEXPIRE', KEYS[6], 14 * 86400 * 1000)
end
return 1
