--[[ grant.lua: extra units for a tenant's current UTC day or month.

Adds units to the grant of the period that contains now, so that the quota's
limit for that period becomes quota + grant. A hash whose period is not the
current one is stale: it is reset (used, grant and overage to 0) before the
grant is added, exactly as admit.lua treats it. The grant ends with its period:
the next period starts with none.

A grant with an id is applied once: its id is marked in the period's hash
(field g:<id>), and a grant whose id is marked adds nothing, so the API and
the worker's grants step may both send it, any number of times. A grant
with an id names its period (ARGV[5]) and is applied only while that period
is the current one (Redis time); otherwise nothing is written and the answer
says so. So a mark matters only within its own period: marks left in a hash
that admit.lua reset for a new period are never read again, and go with the
hash (it expires, or this script deletes a stale hash before resetting it).
Without an id (ARGV[4] empty) every call adds.

Units, epoch, precision: as in admit.lua (integer microseconds since the Unix
epoch, UTC; integers exact below 2^53; numbers written with '%d').

KEYS
  KEYS[1] <prefix>:v1:{t:<id>}:day or <prefix>:v1:{t:<id>}:month
          hash: period, used, grant, overage (see admit.lua), and
          g:<grant id> = units for each grant with an id applied in the
          period (admit.lua reads only its four fields)

ARGV
  [1] now_us  explicit time in us; 0 = Redis TIME
  [2] period  'day' | 'month'
  [3] units   units to add, 1..2^40
  [4] grant id, or '' (optional): apply this grant once
  [5] the grant's period id (days since epoch, or year*100+month); 0 or
      absent = the period that contains now

Return: a flat array of 7 integers
  [1] period id (days since epoch, or year*100+month)
  [2] used  [3] grant (after this call)  [4] overage
  [5] reset: start of the next period, us  [6] now, us
  [7] 1 = the units were added; 0 = this grant id was applied before;
      -1 = the grant's period is not the current one (nothing written)

Expiry: end of the period + 1 h, as admit.lua sets it (shifted by TIME - now
when an explicit now lies in the past).
]]

local US = 1000000
local DAY_US = 86400 * US
local HOUR_US = 3600 * US

-- idiv is exact floor division for integers below 2^53 and b > 0: the double
-- quotient can round across an integer, so it is corrected by one.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function fmt(x)
  return string.format('%d', x)
end

-- BEGIN periods (identical in admit.lua and grant.lua; a test compares them)
-- civil_from_days and days_from_civil are Howard Hinnant's algorithms for the
-- proleptic Gregorian calendar, as Go's time package uses for UTC.
local function civil_from_days(z)
  z = z + 719468
  local era = idiv(z, 146097)
  local doe = z - era * 146097
  local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
  local mp = idiv(5 * doy + 2, 153)
  local m = mp + 3
  if mp >= 10 then m = mp - 9 end
  if m <= 2 then y = y + 1 end
  return y, m
end

local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = idiv(y, 400)
  local yoe = y - era * 400
  local mp = m - 3
  if m <= 2 then mp = m + 9 end
  local doy = idiv(153 * mp + 2, 5) + d - 1
  local doe = yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + doy
  return era * 146097 + doe - 719468
end

-- periods returns the day id (days since epoch), the start of the next day,
-- the month id (year*100+month) and the start of the next month, all for
-- time now in us.
local function periods(now)
  local day = idiv(now, DAY_US)
  local y, m = civil_from_days(day)
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  return day, (day + 1) * DAY_US, y * 100 + m, days_from_civil(ny, nm, 1) * DAY_US
end
-- END periods

local t = redis.call('TIME')
local real = tonumber(t[1]) * US + tonumber(t[2])
local now = tonumber(ARGV[1])
if now <= 0 then now = real end
local shift = 0
if real > now then shift = real - now end

local day, dnext, month, mnext = periods(now)
local id, reset = day, dnext
if ARGV[2] == 'month' then id, reset = month, mnext end

local gid = ARGV[4] or ''
local want = tonumber(ARGV[5] or '0') or 0
local h = redis.call('HMGET', KEYS[1], 'period', 'used', 'grant', 'overage')
local used, grant, over = 0, 0, 0
local current = tonumber(h[1]) == id
if current then
  used, grant, over = tonumber(h[2]) or 0, tonumber(h[3]) or 0, tonumber(h[4]) or 0
end
if want ~= 0 and want ~= id then
  return {id, used, grant, over, reset, now, -1}
end
if gid ~= '' and current and redis.call('HEXISTS', KEYS[1], 'g:' .. gid) == 1 then
  return {id, used, grant, over, reset, now, 0}
end
if not current then
  redis.call('DEL', KEYS[1]) -- a past period's hash, with its grant marks
end
grant = grant + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'period', fmt(id), 'used', fmt(used), 'grant', fmt(grant),
  'overage', fmt(over))
if gid ~= '' then
  redis.call('HSET', KEYS[1], 'g:' .. gid, ARGV[3])
end
redis.call('PEXPIREAT', KEYS[1], fmt(-idiv(-(reset + HOUR_US + shift), 1000)))
return {id, used, grant, over, reset, now, 1}
