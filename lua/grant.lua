--[[ grant.lua: extra units for a tenant's current day or month (UTC, or
of the tenant's billing calendar: ARGV[7]).

Adds units to the grant of the period that contains now, so that the quota's
limit for that period becomes quota + grant. A stale period is reset (used,
grant and overage to 0) before the grant is added, exactly as admit.lua
treats it. The grant ends with its period: the next period starts with none.

A grant with an id is applied once: its id is marked where the state lives
(field g:<id> of the v2 hash, or of the v1 period hash), and a grant whose id
is marked adds nothing, so the API and the worker's grants step may both
send it, any number of times. A grant with an id names its period (ARGV[6])
and is applied only while that period is the current one (Redis time);
otherwise nothing is written and the answer says so. Marks of past months
are dropped when the v2 hash enters a new month (state.lua); a v1 period
hash is deleted before it is reset. Without an id (ARGV[5] empty) every call
adds.

The state's keys, layouts and shared functions are lua/state.lua's,
prepended to this script. Units, epoch, precision: as in admit.lua.

KEYS[1..5] the state (state.lua)

ARGV
  [1] layout  'v2' | 'v1' (state.lua)
  [2] now_us  explicit time in us; 0 = Redis TIME
  [3] period  'day' | 'month'
  [4] units   units to add, 1..2^40
  [5] grant id, or '' (optional): apply this grant once
  [6] the grant's period id (days since epoch, or year*100+month); 0 or
      absent = the period that contains now
  [7] the tenant's calendar: '' or absent = the default (UTC days and
      months); else quota.Calendar.Boundaries (calendar.lua, prepended to
      this script; see admit.lua, "Calendars"): the period ids are then
      local dates and the year*100+month of a period's anchor day

Return: an error reply "CALENDAR <now us>" when ARGV[7] does not reach
now (Go's and Redis's clocks too far apart: nothing was written); else a
flat array of 7 integers
  [1] period id (days since epoch, or year*100+month)
  [2] used  [3] grant (after this call)  [4] overage
  [5] reset: start of the next period, us  [6] now, us
  [7] 1 = the units were added; 0 = this grant id was applied before;
      -1 = the grant's period is not the current one: nothing was written
]]

local now, shift = clock(tonumber(ARGV[2]))
local function pxat(us)
  return fmt(-idiv(-(us + shift), 1000))
end

local s = load_state()
local isday = ARGV[3] == 'day'
local wasday, wasmonth = s.d, s.m
local day, dnext, month, mnext
local cal = ARGV[7]
if cal and cal ~= '' then
  local _
  day, _, dnext, month, _, mnext = cal_at(cal, now)
  if not day then return redis.error_reply('CALENDAR ' .. fmt(now)) end
  if day ~= s.d then s.d, s.du, s.dg, s.dov = day, 0, 0, 0 end
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
local gid = ARGV[5] or ''
local want = tonumber(ARGV[6] or '0') or 0
if want ~= 0 and want ~= id then
  return {id, used, grant, over, reset, now, -1}
end

local v2 = s.v2 or LAYOUT == 'v2'
local current = (isday and wasday == day) or (not isday and wasmonth == month)
local marks = KS
if not v2 then
  marks = KM
  if isday then marks = KD end
end
if gid ~= '' and (v2 or current) and redis.call('HEXISTS', marks, 'g:' .. gid) == 1 then
  return {id, used, grant, over, reset, now, 0}
end
if not v2 and not current then
  redis.call('DEL', marks) -- a past period's hash, with its grant marks
end

grant = grant + tonumber(ARGV[4])
local parts = {'d'}
if isday then
  s.dg = grant
else
  s.mg = grant
  parts = {'m'}
end
local extra
if gid ~= '' and v2 then
  s.gn = s.gn + 1
  s['g:' .. gid] = ARGV[4]
  extra = {'g:' .. gid}
end
save_state(s, reset + HOUR_US, extra, parts, pxat, now)
if gid ~= '' and not v2 then
  redis.call('HSET', marks, 'g:' .. gid, ARGV[4])
end
return {id, used, grant, over, reset, now, 1}
