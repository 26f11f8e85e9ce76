--[[ restore.lua: the library's function restore: repair a tenant's quota
counters after Redis lost data.

The counters are set to at least what Postgres has recorded for the period
plus the usage still pending in Redis for it; grants to at least Postgres'.
So is the month's overage (the tier's overage units, recorded and
pending), which the spend cap counts: a month never bills more overage
than its cap, whatever Redis lost. Taking the maximum makes the script
safe to run on counters that lost nothing: it never lowers one. A state
of an earlier day or month starts the repair's as admit.lua does (the
month it held becomes the month before: state.lua's month_roll); one
already in a later day or month (Redis's clock past the worker's at a
period's end) is left as it is, never rolled back.

The state's keys, layout and shared functions are lua/state.lua's.

KEYS
  KEYS[1] the state hash (state.lua)
  KEYS[2] the pending hash

ARGV (units are integer cost units; times Unix seconds, UTC)
  [1] day id (days since epoch)        [2] month id (year*100+month)
  [3] start of the day                 [4] start of the month
  [5] units recorded in Postgres today [6] units recorded this month
  [7] day grant from Postgres          [8] month grant from Postgres
  [9] the tier's overage units recorded this month
  [10] end of the day, [11] end of the month: for a tenant with a billing
       calendar (its local day and billing month, whose ids [1] and [2]
       are: see admit.lua, "Calendars"); absent for the default calendar

Return: {day used, month used, month overage} after the repair.
]]

do
-- count adds a pending count n of field name to the sums acc of the hours
-- from acc.from (unix s) on: units and overage units (each_pending's f).
local function count(acc, name, n)
  local hour, kind = string.match(name, '^(%d+)|.*|(%a)$')
  if tonumber(hour) >= acc.from then
    if kind == 'u' then
      acc.units = acc.units + n
    elseif kind == 'o' then
      acc.over = acc.over + n
    end
  end
end

-- pending_since sums the pending units and overage units of hours from
-- from (unix s) on, in the pending hash and in the state hash's "p" fields.
local function pending_since(from)
  local acc = {from = from, units = 0, over = 0}
  local h = redis.call('HGETALL', KEYS[2])
  for i = 1, #h, 2 do count(acc, h[i], tonumber(h[i + 1])) end
  each_pending(redis.call('HGETALL', KS), count, acc)
  return acc.units, acc.over
end

function FN.restore()
KS = KEYS[1]
local now = clock(0)

local s = load_state()
local day, month = tonumber(ARGV[1]), tonumber(ARGV[2])
local dused = tonumber(ARGV[5]) + pending_since(tonumber(ARGV[3]))
local mused, mover = pending_since(tonumber(ARGV[4]))
mused, mover = mused + tonumber(ARGV[6]), mover + tonumber(ARGV[9])
local parts = {}
if s.d < day then s.d, s.du, s.dg = day, 0, 0 end
if s.d == day then
  s.dn = (day + 1) * DAY_US
  if ARGV[10] then s.dn = tonumber(ARGV[10]) * US end
  s.du = math.max(s.du, dused)
  s.dg = math.max(s.dg, tonumber(ARGV[7]))
  parts[#parts + 1] = 'd'
end
local mstart = tonumber(ARGV[4]) * US
local _, _, nxt = month_at(mstart)
if ARGV[11] then nxt, s.cal = tonumber(ARGV[11]) * US, true end
if s.m < month then month_roll(s, month) end
if s.m == month then
  s.mn = nxt
  s.mu = math.max(s.mu, mused)
  s.mg = math.max(s.mg, tonumber(ARGV[8]))
  s.mo = math.max(s.mo, mover)
  parts[#parts + 1] = 'm'
end
if #parts > 0 then save_state(s, nxt + HOUR_US, nil, now) end
return {s.du, s.mu, s.mo}
end
end
