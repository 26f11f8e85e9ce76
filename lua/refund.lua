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
prepended to this script with meterq.lua and adjust.lua (the changes it
shares with settle.lua). Units: integer units; times integer microseconds
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

local day, month, meter = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[5]
local cost, over = tonumber(ARGV[6]), tonumber(ARGV[7])
local s = load_state()
-- the admission's month: the state's, or the month before it (state.lua);
-- the meter's likewise (meterq.lua): what the request took, no more
local c = month_load(s, month)
local q, mback, price, tpp, mpp = nil, 0, -1, nil, 0
if KEYS[7] then
  q, mback, price = meterq_month(KEYS[7], meter, day, month), tonumber(ARGV[10]), tonumber(ARGV[8])
  if ARGV[9] ~= '' then
    local a, b = string.match(ARGV[9], '^(%d+),(%d+)$')
    tpp, mpp = a + 0, b + 0
  end
end
adjust_counters(s, c, q, KEYS[7], meter, day, month, -cost, -over, -mback, pxat, now)
if KEYS[7] then adjust_money(KEYS[7], month, -over, -mback, price, tpp, mpp) end
adjust_pending(s, KEYS[6], ARGV[4] .. '|' .. meter .. '|', -cost, -over, -mback)
return 1
