--[[ admit.lua: one admission decision for one tenant and one request.

It checks GCRA (requests), the token bucket (cost units), the daily quota and
the monthly quota together and commits all of them or none: every active limit
is checked first, and state is written only when all of them pass. A refused
request changes no limit state; it only counts a refusal in the pending usage.
internal/ratelimit runs it; internal/ratelimit/model.go is its pure-Go
reference, and the tests hold the two to identical answers. Needs Redis 6.2
or later (SET ... PXAT; TIME before writes relies on effects replication).

Units, epoch, precision
  Times are integer microseconds since the Unix epoch, UTC. Time is Redis
  TIME (sec*1e6 + usec) unless ARGV[1] gives an explicit time (tests only).
  Every quantity is an integer held in a Lua double, exact below 2^53: the
  Go side bounds limits by quota.MaxQuantity and every window (B*T, C*U) by
  2^50 us (~35 years), and now is ~2^50.6 us today, so sums stay below 2^53.
  Integer division is idiv (floor, corrected to be exact). Numbers written to
  Redis go through string.format('%d'), never tostring (which would print
  large numbers as 1e+15).

KEYS (the Go side builds them; every key carries the hash tag {t:<tenant id>},
so one call touches one Redis Cluster slot, and the format version v1)
  KEYS[1] <prefix>:v1:{t:<id>}:gcra    string: GCRA TAT, us
  KEYS[2] <prefix>:v1:{t:<id>}:bucket  string: time the bucket is full again, us
  KEYS[3] <prefix>:v1:{t:<id>}:day     hash: period (days since epoch), used,
                                       grant, overage (always 0: see below)
  KEYS[4] <prefix>:v1:{t:<id>}:month   hash: period (year*100+month), used,
                                       grant, overage
  KEYS[5] <prefix>:v1:{t:<id>}:pending hash: "<hour start, unix s>|<meter>|u"
                                       units, "|r" requests, "|x" refused
                                       requests, "|o" overage units
  KEYS[6] <prefix>:v1:{t:<id>}:idem:<sha256 hex of meter|idempotency key>
                                       string: the encoded first allowed
                                       decision (optional key)
  A key of an unlimited limit is passed but never read or written.

ARGV
  [1]  now_us      explicit time in us; 0 = Redis TIME
  [2]  mode        'admit' | 'dry' (decide, write nothing) | 'peek' (report
                   the current room without any request; the Go side passes
                   cost 1 and overage 'block')
  [3]  cost        cost units, 1..2^40
  [4]  meter       the route's meter, for pending usage fields
  [5]  overage     'block' | 'bill'
  [6]  gcra_T      GCRA emission interval T in us (0 = unlimited)
  [7]  gcra_B      GCRA burst B, requests
  [8]  bucket_U    token bucket interval U per unit in us (0 = unlimited)
  [9]  bucket_C    token bucket capacity C, units
  [10] daily       daily quota, units (-1 = unlimited)
  [11] monthly     monthly quota, units (-1 = unlimited)

Return: a flat array of 22 integers
  [1] allowed (1/0)
  [2] violated bitmask: 1 burst, 2 bucket, 4 daily, 8 monthly
  [3] retry after, us (0 when allowed; -1 = never: the cost exceeds a limit's
      whole size)
  [4] overage units admitted past the monthly quota (bill)
  [5] now, us
  [6] replayed (1 = the stored answer to an earlier idempotent request)
  then for burst, bucket, daily, monthly (in this order) four integers:
      active (1/0), limit, remaining, reset (absolute us)
  After an admission, remaining and reset describe the state after it; after
  a refusal, in dry-run refusals and in peek, the state as it is.

GCRA (counts requests, 1 per request whatever the cost)
  tat = max(TAT, now); new = tat + T; allowed iff new - now <= B*T.
  remaining = floor((B*T - (new - now)) / T), reset = new (full again),
  refusal retry = new - B*T - now. Never more than B + t/T requests are
  admitted in any window of length t. T is 1e6/rate rounded to a whole us, so
  the real rate is 1e6/T: off by at most 0.5/T relative to the configured one.

Token bucket (counts cost units), in virtual-scheduling form
  State FULL = the time the bucket is full again; U = us per unit of refill;
  C = capacity. This is exactly a continuously refilled bucket with
  tokens(now) = C - max(0, FULL - now) / U.
  f = max(FULL, now); new = f + cost*U; allowed iff new - now <= C*U
  (i.e. tokens >= cost); remaining = floor((C*U - (new - now)) / U);
  retry = new - C*U - now; cost > C never passes (retry -1).

Quotas (count cost units per UTC calendar day / month)
  A hash whose period is not the current one counts as empty. limit = quota
  + grant of the current period; remaining = max(0, limit - used); reset =
  start of the next period; refusal retry = next period start - now, or -1
  when cost > quota (a fresh period has no grant).
  Overage policy applies to the MONTHLY quota only: 'block' refuses past
  quota + grant; 'bill' admits and returns the units past quota + grant as
  overage (added to the month hash and to pending usage). The daily quota is
  always a hard cap, and GCRA and the bucket always refuse: overage billing
  is a promise about the month's volume, not a licence to burst.

Idempotency (KEYS[6] present, mode 'admit')
  A stored decision younger than 24 h (by its own now, so that explicit test
  times see the same window) is returned with replayed = 1 and nothing is
  counted. Only allowed decisions are stored: a refusal consumed nothing, so
  a retry with the same key is a new attempt. Dry runs and peeks ignore the
  key.

Expiry (each key lives no longer than its state needs)
  gcra/bucket: PEXPIREAT TAT/FULL rounded up to the ms (then it is full, the
  same as absent); day/month: end of period + 1 h; idem: 24 h; pending:
  14 days after its last write (the worker flushes it far sooner; the TTL
  only bounds what an abandoned tenant leaves behind). Expiries are absolute
  in script time; with an explicit now in the past they are shifted by
  (TIME - now), so that test state lives as long as it would have.
]]

local US = 1000000
local DAY_US = 86400 * US
local HOUR_US = 3600 * US
local IDEM_US = DAY_US
local PENDING_US = 14 * DAY_US

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
-- pxat turns an expiry in script time (us) into PEXPIREAT milliseconds,
-- rounded up so that a key never disappears before its state is empty.
local function pxat(us)
  return fmt(-idiv(-(us + shift), 1000))
end

local mode = ARGV[2]
local cost = tonumber(ARGV[3])
local meter = ARGV[4]
local bill = ARGV[5] == 'bill'
local gT, gB = tonumber(ARGV[6]), tonumber(ARGV[7])
local bU, bC = tonumber(ARGV[8]), tonumber(ARGV[9])
local dq, mq = tonumber(ARGV[10]), tonumber(ARGV[11])
local idem = KEYS[6]

if mode == 'admit' and idem then
  local s = redis.call('GET', idem)
  if s then
    local r = {}
    for v in string.gmatch(s, '[^,]+') do
      r[#r + 1] = tonumber(v)
    end
    if r[5] + IDEM_US > now then
      r[6] = 1
      return r
    end
  end
end

local ok, mask, retry = true, 0, 0
local function refuse(bit, wait)
  ok = false
  mask = mask + bit
  if retry ~= -1 then
    if wait < 0 or wait > retry then retry = wait end
  end
end

-- GCRA
local gtat, gnew
if gT > 0 then
  gtat = tonumber(redis.call('GET', KEYS[1]) or '0')
  if gtat < now then gtat = now end
  gnew = gtat + gT
  if gnew - now > gB * gT then refuse(1, gnew - gB * gT - now) end
end

-- token bucket
local bf, bnew
if bU > 0 then
  bf = tonumber(redis.call('GET', KEYS[2]) or '0')
  if bf < now then bf = now end
  if cost > bC then
    refuse(2, -1)
  else
    bnew = bf + cost * bU
    if bnew - now > bC * bU then refuse(2, bnew - bC * bU - now) end
  end
end

-- quotas
local day, dnext, month, mnext = periods(now)
local function load(key, id)
  local h = redis.call('HMGET', key, 'period', 'used', 'grant', 'overage')
  if tonumber(h[1]) ~= id then return 0, 0, 0 end
  return tonumber(h[2]) or 0, tonumber(h[3]) or 0, tonumber(h[4]) or 0
end

local dused, dgrant, dover
if dq >= 0 then
  dused, dgrant, dover = load(KEYS[3], day)
  if dused + cost > dq + dgrant then
    if cost > dq then refuse(4, -1) else refuse(4, dnext - now) end
  end
end

local mused, mgrant, mover
local overage = 0
if mq >= 0 then
  mused, mgrant, mover = load(KEYS[4], month)
  local limit = mq + mgrant
  if mused + cost > limit then
    if bill then
      overage = math.min(cost, mused + cost - limit)
    elseif cost > mq then
      refuse(8, -1)
    else
      refuse(8, mnext - now)
    end
  end
end
if not ok or mode == 'peek' then overage = 0 end

-- commit: only when every limit passed, only in admit mode
if ok and mode == 'admit' then
  if gT > 0 then redis.call('SET', KEYS[1], fmt(gnew), 'PXAT', pxat(gnew)) end
  if bU > 0 then redis.call('SET', KEYS[2], fmt(bnew), 'PXAT', pxat(bnew)) end
  if dq >= 0 then
    redis.call('HSET', KEYS[3], 'period', fmt(day), 'used', fmt(dused + cost),
      'grant', fmt(dgrant), 'overage', fmt(dover))
    redis.call('PEXPIREAT', KEYS[3], pxat(dnext + HOUR_US))
  end
  if mq >= 0 then
    redis.call('HSET', KEYS[4], 'period', fmt(month), 'used', fmt(mused + cost),
      'grant', fmt(mgrant), 'overage', fmt(mover + overage))
    redis.call('PEXPIREAT', KEYS[4], pxat(mnext + HOUR_US))
  end
end
if mode == 'admit' then
  local f = fmt(idiv(now, HOUR_US) * 3600) .. '|' .. meter .. '|'
  if ok then
    redis.call('HINCRBY', KEYS[5], f .. 'u', fmt(cost))
    redis.call('HINCRBY', KEYS[5], f .. 'r', 1)
    if overage > 0 then redis.call('HINCRBY', KEYS[5], f .. 'o', fmt(overage)) end
  else
    redis.call('HINCRBY', KEYS[5], f .. 'x', 1)
  end
  redis.call('PEXPIREAT', KEYS[5], pxat(now + PENDING_US))
end

-- report
local consumed = ok and mode ~= 'peek'
local res = {ok and 1 or 0, mask, ok and 0 or retry, overage, now, 0}
local function add(active, limit, remaining, reset)
  if remaining < 0 then remaining = 0 end
  res[#res + 1] = active
  res[#res + 1] = limit
  res[#res + 1] = remaining
  res[#res + 1] = reset
end

if gT == 0 then
  add(0, 0, 0, 0)
elseif consumed then
  add(1, gB, idiv(gB * gT - (gnew - now), gT), gnew)
else
  add(1, gB, idiv(gB * gT - (gtat - now), gT), gtat)
end

if bU == 0 then
  add(0, 0, 0, 0)
elseif consumed then
  add(1, bC, idiv(bC * bU - (bnew - now), bU), bnew)
else
  add(1, bC, idiv(bC * bU - (bf - now), bU), bf)
end

local spent = 0
if consumed then spent = cost end
if dq < 0 then
  add(0, 0, 0, 0)
else
  add(1, dq + dgrant, dq + dgrant - dused - spent, dnext)
end
if mq < 0 then
  add(0, 0, 0, 0)
else
  add(1, mq + mgrant, mq + mgrant - mused - spent, mnext)
end

if ok and mode == 'admit' and idem then
  local enc = {}
  for i = 1, #res do
    enc[i] = fmt(res[i])
  end
  redis.call('SET', idem, table.concat(enc, ','), 'PXAT', pxat(now + IDEM_US))
end
return res
