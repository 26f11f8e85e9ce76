--[[ grant.lua: the library's function grant: extra units for a tenant's
current day or month (UTC, or of the tenant's billing calendar: ARGV[6]).

Adds units to the grant of the period that contains now, so that the quota's
limit for that period becomes quota + grant. A stale period is reset (used,
grant and overage to 0) before the grant is added, exactly as admit.lua
treats it. The grant ends with its period: the next period starts with none.

A grant with an id is applied once: its id is marked in the state hash
(field g:<id>), and a grant whose id is marked adds nothing, so the API and
the worker's grants step may both send it, any number of times. A grant
with an id names its period (ARGV[5]) and is applied only while that
period is the current one (Redis time); otherwise nothing is written and
the answer says so. Marks of past months are dropped when the hash enters
a new month (state.lua). Without an id (ARGV[4] empty) every call adds.

The state's keys, layout and shared functions are lua/state.lua's.
Units, epoch, precision: as in admit.lua.

KEYS[1] the state hash (state.lua)

ARGV
  [1] now_us  explicit time in us; 0 = Redis TIME
  [2] period  'day' | 'month'
  [3] units   units to add, 1..2^40
  [4] grant id, or '' (optional): apply this grant once
  [5] the grant's period id (days since epoch, or year*100+month); 0 or
      absent = the period that contains now
  [6] the tenant's calendar: '' or absent = the default (UTC days and
      months); else quota.Calendar.Boundaries (calendar.lua; see
      admit.lua, "Calendars"): the period ids are then local dates and
      the year*100+month of a period's anchor day

Return: an error reply "CALENDAR <now us>" when ARGV[6] does not reach
now (Go's and Redis's clocks too far apart: nothing was written); else a
flat array of 7 integers
  [1] period id (days since epoch, or year*100+month)
  [2] used  [3] grant (after this call)  [4] overage
  [5] reset: start of the next period, us  [6] now, us
  [7] 1 = the units were added; 0 = this grant id was applied before;
      -1 = the grant's period is not the current one: nothing was written
]]

function FN.grant()
KS = KEYS[1]
local now = clock(tonumber(ARGV[1]))

local s = load_state()
local isday = ARGV[2] == 'day'
local day, dnext, month, mnext
local cal = ARGV[6]
if cal and cal ~= '' then
  local _
  day, _, dnext, month, _, mnext = cal_at(cal, now)
  if not day then return redis.error_reply('CALENDAR ' .. fmt(now)) end
  if day ~= s.d then s.d, s.du, s.dg = day, 0, 0 end
  if month ~= s.m then month_roll(s, month) end
  s.dn, s.mn, s.cal = dnext, mnext, true
else
  day, dnext = day_of(s, now)
  month, mnext = month_of(s, now)
end
local id, reset = day, dnext
local used, grant, over = s.du, s.dg, 0
if not isday then
  id, reset = month, mnext
  used, grant, over = s.mu, s.mg, s.mo
end
local gid = ARGV[4] or ''
local want = tonumber(ARGV[5] or '0') or 0
if want ~= 0 and want ~= id then
  return {id, used, grant, over, reset, now, -1}
end

if gid ~= '' and redis.call('HEXISTS', KS, 'g:' .. gid) == 1 then
  return {id, used, grant, over, reset, now, 0}
end

grant = grant + tonumber(ARGV[3])
if isday then
  s.dg = grant
else
  s.mg = grant
end
local extra
if gid ~= '' then
  s.gn = s.gn + 1
  s['g:' .. gid] = ARGV[3]
  extra = {'g:' .. gid}
end
save_state(s, reset + HOUR_US, extra, now)
return {id, used, grant, over, reset, now, 1}
end
