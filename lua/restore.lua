--[[ restore.lua: repair a tenant's quota counters after Redis lost data.

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

The state's keys, layouts and shared functions are lua/state.lua's,
prepended to this script.

KEYS
  KEYS[1..5] the state (state.lua)
  KEYS[6] pending hash

ARGV (units are integer cost units; times Unix seconds, UTC)
  [1] layout 'v2' | 'v1' (state.lua)
  [2] day id (days since epoch)        [3] month id (year*100+month)
  [4] start of the day                 [5] start of the month
  [6] units recorded in Postgres today [7] units recorded this month
  [8] day grant from Postgres          [9] month grant from Postgres
  [10] the tier's overage units recorded this month
  [11] end of the day, [12] end of the month: for a tenant with a billing
       calendar (its local day and billing month, whose ids [2] and [3]
       are: see admit.lua, "Calendars"); absent for the default calendar

Return: {day used, month used, month overage} after the repair.
]]

local now, shift = clock(0)
local function pxat(us)
  return fmt(-idiv(-(us + shift), 1000))
end

-- pending_since sums the pending units and overage units of hours from
-- from (unix s) on, in the v1 pending hash and in the v2 hash's "p" fields.
local function pending_since(from)
  local units, over = 0, 0
  local function count(name, n)
    local hour, kind = string.match(name, '^(%d+)|.*|(%a)$')
    if tonumber(hour) >= from then
      if kind == 'u' then
        units = units + n
      elseif kind == 'o' then
        over = over + n
      end
    end
  end
  local h = redis.call('HGETALL', KEYS[6])
  for i = 1, #h, 2 do count(h[i], tonumber(h[i + 1])) end
  each_pending(redis.call('HGETALL', KS), count)
  return units, over
end

local s = load_state()
local day, month = tonumber(ARGV[2]), tonumber(ARGV[3])
local dused = tonumber(ARGV[6]) + pending_since(tonumber(ARGV[4]))
local mused, mover = pending_since(tonumber(ARGV[5]))
mused, mover = mused + tonumber(ARGV[7]), mover + tonumber(ARGV[10])
local parts = {}
if s.d < day then s.d, s.du, s.dg, s.dov = day, 0, 0, 0 end
if s.d == day then
  s.dn = (day + 1) * DAY_US
  if ARGV[11] then s.dn = tonumber(ARGV[11]) * US end
  s.du = math.max(s.du, dused)
  s.dg = math.max(s.dg, tonumber(ARGV[8]))
  parts[#parts + 1] = 'd'
end
local mstart = tonumber(ARGV[5]) * US
local _, _, nxt = month_at(mstart)
if ARGV[12] then nxt, s.cal = tonumber(ARGV[12]) * US, true end
if s.m < month then month_roll(s, month) end
if s.m == month then
  s.mn = nxt
  s.mu = math.max(s.mu, mused)
  s.mg = math.max(s.mg, tonumber(ARGV[9]))
  s.mo = math.max(s.mo, mover)
  parts[#parts + 1] = 'm'
end
if #parts > 0 then save_state(s, nxt + HOUR_US, nil, parts, pxat, now) end
return {s.du, s.mu, s.mo}
