--[[ refund.lua: give back the units of an admitted request whose upstream
failed with a 5xx on a route that refunds.

The daily and monthly quotas get the cost back, and the month its overage
units, only while they are still in the period the request was admitted in
(a refund after the period rolled over changes nothing there). The pending
usage of the request's hour loses the units and overage units (the worker
nets a negative pending count against the recorded usage); the request
itself stays counted in "|r". GCRA and the token bucket are not refunded:
they protect against load, and the failed call was load.

The state's keys, layouts and shared functions are lua/state.lua's,
prepended to this script. Units: integer units; times integer microseconds
since the Unix epoch, UTC.

KEYS
  KEYS[1..5] the state (state.lua)
  KEYS[6] <prefix>:v1:{t:<id>}:pending hash: "<hour start, unix s>|<meter>|u", "|o", ...
          (used while the state is in v1 keys; else the v2 hash's "p" fields)
  KEYS[7] (when the meter has a quota) <prefix>:v1:{t:<id>}:mq, the meter
          quotas' hash (admit.lua, "Meter quotas"): the meter's day and
          month get the cost back the same way, its overage units first
          (min(cost, the month's meter overage): the last units admitted
          are the overage), with the pending "|m" of the admission's hour
          and, when ARGV[8] >= 0, the month's millicents '$' (the spend
          cap's) the overage's price

ARGV
  [1] layout 'v2' | 'v1' (state.lua)
  [2] day id of the admission (days since epoch)
  [3] month id of the admission (year*100+month)
  [4] hour start of the admission, unix seconds
  [5] meter
  [6] cost, units
  [7] overage units of the admission
  [8] (with KEYS[7]) the meter's overage price per 1,000 units when the
      spend cap counts it, else -1
  [9] (with KEYS[7]) a prepaid tenant's "<tier's overage price>,<meter's
      overage price, 0 when not billed>": the overage given back is given
      back to its credit draws too (meterq.lua's prepaid_adjust); KEYS[7]
      is then passed even when the meter has no quota

Return: 1.
]]

local now, shift = clock(0)
local function pxat(us)
  return fmt(-idiv(-(us + shift), 1000))
end

local cost = tonumber(ARGV[6])
local over = tonumber(ARGV[7])
local s = load_state()
local parts = {}
if cost > 0 and s.d == tonumber(ARGV[2]) then
  s.du = math.max(0, s.du - cost)
  parts[#parts + 1] = 'd'
end
if s.m == tonumber(ARGV[3]) and (cost > 0 or over > 0) then
  s.mu = math.max(0, s.mu - cost)
  s.mo = math.max(0, s.mo - over)
  parts[#parts + 1] = 'm'
end
if #parts > 0 then
  save_state(s, 0, nil, parts, pxat, now)
end

local f = ARGV[4] .. '|' .. ARGV[5] .. '|'
-- the meter quota (KEYS[7]; meterq.lua)
local mback = 0
if KEYS[7] then
  local price = tonumber(ARGV[8])
  mback = -meterq_adjust(KEYS[7], ARGV[5], tonumber(ARGV[2]), tonumber(ARGV[3]), -cost, -1, price, price >= 0)
  if ARGV[9] then
    local tpp, mpp = string.match(ARGV[9], '^(%d+),(%d+)$')
    prepaid_adjust(KEYS[7], tonumber(ARGV[3]), -(over * tpp + mback * mpp))
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
