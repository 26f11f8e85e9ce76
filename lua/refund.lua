--[[ refund.lua: the library's function refund: give back the units of an
admitted request whose upstream failed with a 5xx on a route that refunds.

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

The state's keys, layout and shared functions are lua/state.lua's, with
meterq.lua's and adjust.lua's (the changes it shares with settle.lua).
Units: integer units; times integer microseconds since the Unix epoch, UTC.

KEYS
  KEYS[1] the state hash (state.lua)
  KEYS[2] <prefix>:v1:{t:<id>}:pending hash: "<hour start, unix s>|<meter>|u", "|o", ...
          (used while the tenant has no state; else the state hash's "p" fields)
  KEYS[3] (when the meter has a quota, or the tenant is prepaid)
          <prefix>:v1:{t:<id>}:mq, the meter quotas' hash (admit.lua,
          "Meter quotas"; meterq.lua): the meter's day and month, when it
          has a quota (ARGV[10]), get the cost back the same way, and the month the meter overage units
          the request took (ARGV[9], no more: a later request's overage
          stays billed), with the pending "|m" of the admission's hour
          and, when ARGV[7] >= 0, their price off the month's millicents
          ('$' or '$w': the spend cap's of the admission's month, never a
          later month's)

ARGV
  [1] day id of the admission (days since epoch)
  [2] month id of the admission (year*100+month)
  [3] hour start of the admission, unix seconds
  [4] meter
  [5] cost, units
  [6] the tier's overage units of the admission (quota.Decision.OverageUnits)
  [7] (with KEYS[3]) the meter's overage price per 1,000 units when the
      spend cap counts it, else -1
  [8] (with KEYS[3]) a prepaid tenant's "<tier's overage price>,<meter's
      overage price, 0 when not billed>", else '': the overage given back
      is given back to the admission month's credit draws too (meterq.lua's
      prepaid_adjust)
  [9] (with KEYS[3]) the meter overage units of the admission
      (quota.Decision.MeterOverageUnits)
  [10] (with KEYS[3]) 1 when the meter has a quota, else 0 (a prepaid
      tenant's request of a meter without one counted nothing there)

Return: 1.
]]

function FN.refund()
KS = KEYS[1]
local now = clock(0)

local day, month, meter = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[4]
local cost, over = tonumber(ARGV[5]), tonumber(ARGV[6])
local s = load_state()
-- the admission's month: the state's, or the month before it (state.lua);
-- the meter's likewise (meterq.lua): what the request took, no more
local c = month_load(s, month)
local q, mback, price, tpp, mpp = nil, 0, -1, nil, 0
if KEYS[3] then
  mback, price = tonumber(ARGV[9]), tonumber(ARGV[7])
  if ARGV[10] == '1' then q = meterq_month(KEYS[3], meter, day, month) end
  if ARGV[8] ~= '' then
    local a, b = string.match(ARGV[8], '^(%d+),(%d+)$')
    tpp, mpp = a + 0, b + 0
  end
end
adjust_counters(s, c, q, KEYS[3], meter, day, month, -cost, -over, -mback, now)
if KEYS[3] then adjust_money(KEYS[3], month, -over, -mback, price, tpp, mpp) end
adjust_pending(s, KEYS[2], ARGV[3] .. '|' .. meter .. '|', -cost, -over, -mback)
return 1
end
