--[[ state.lua: the shared definition of a tenant's limit state, the clock
and the UTC calendar, for the library's functions that read or write the
state (admit, grant, refund, settle, reset, outage, restore; policy_run
uses the clock).

The layout: all of a tenant's limit state in one hash,
  <prefix>:v2:{t:<id>}  fields
    t, q, c  the state, packed in three fields of integers joined by ','
        (few listpack entries; each under hash-max-listpack-value, 64
        bytes, which a longer value would turn into a hash table):
          t = g,b       GCRA TAT, time the token bucket is full again: us
              after the start of the day d (shorter than since the
              epoch); empty for 0 (no state)
          q = d,du,dg,m,mu,mg,mo,gn   day id (days since the epoch), used,
              grant; month id (year*100+month), used, grant, overage; how
              many grant marks the hash holds
          c = x,mn      the hash's expiry (hours since the epoch, rounded
              up): PEXPIREAT is sent only when the state needs to live
              longer than that; the next month's start (days since the
              epoch), so that the calendar runs once a month, not on
              every call; 0 for a tenant with a billing calendar (its
              day and month ids are those of its calendar, from
              calendar.lua: see admit.lua, "Calendars")
    w = m,mu,mg,mo  the month before: its id, used, grant and overage
        units as they stood when the next month began (written with
        the state that starts it: month_roll), so that a refund or a
        settlement of a request admitted in it, or outage usage of it,
        arriving after the roll, moves that month's counters and rates
        its overage (month_load, month_store)
    L = T,B,U,C  the burst limits the state was written under (admit.lua,
        "Limit changes")
    g:<grant id>  grants already applied (grant.lua)
    lc  the sequence of the tenant's last batch claimed (claim.lua), which
        tells the ledger whether Redis went back to older data
    p<hours since the epoch>|<meter>|  the pending usage not yet flushed
        of an hour and meter, "units,requests" (one field, written by
        admit.lua; the hour short, as it is in most of the hash's bytes)
    p<hour start, unix s>|<meter>|u, |x, |o, |m, |d, |s  more of it: units
        given back (refund.lua, negative), refused requests, overage
        units, ...: the fields of the pending hash (below), with a "p"
        before them.
        The worker's claim.lua moves all of them out, summed.
  One HMGET reads it (the hour's pending fields included), one HSET writes
  it. It lives 14 days after its last admission (the pending usage's
  bound, as the pending hash has), at least to the end of its month + 1 h.
  A tenant without the hash (or whose hash holds pending usage only) has
  no state: load_state reads it as empty, and its first write of the
  state (save_state) creates it.
The pending hash <prefix>:v1:{t:<id>}:pending holds the pending usage of a
tenant that has no state hash (a refusal, a refund of a state that
expired), and the deny cache's refusals (internal/ratelimit's
CountRefused): "<hour start, unix s>|<meter>|<kind>" -> count, 14 days;
claim.lua flushes it with the hash's. (Releases before the Function
library could also keep the state in four v1 keys, :gcra, :bucket, :day
and :month; this one neither reads nor writes them: README.md, "Redis
state, and upgrading it".)

KS, the state hash, is KEYS[1] of every function that uses the state; it
sets KS at its entry.

Units, epoch, precision: integer microseconds since the Unix epoch, UTC;
every quantity an integer in a Lua double, exact below 2^53 (see admit.lua).
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

-- fmt writes an integer for Redis: tostring would print 2^50 as 1.1e+15.
local function fmt(x)
  return string.format('%d', x)
end

-- civil_from_days and days_from_civil are Howard Hinnant's algorithms for
-- the proleptic Gregorian calendar, as Go's time package uses for UTC.
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

-- month_at returns the month id (year*100+month), its start and the next
-- month's start (us) for time now (us). It runs about once a month per
-- tenant (see month_of).
local function month_at(now)
  local y, m = civil_from_days(idiv(now, DAY_US))
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  return y * 100 + m, days_from_civil(y, m, 1) * DAY_US, days_from_civil(ny, nm, 1) * DAY_US
end

-- SHIFT is the shift of the call running (see clock), for pxat: set by
-- clock, which every function that writes an expiry calls first.
local SHIFT = 0

-- clock returns now (us) and the shift that moves an expiry written at an
-- explicit past time (tests) to as long as it would have lived: Redis TIME
-- unless explicit > 0. It keeps the shift in SHIFT.
local function clock(explicit)
  local t = redis.call('TIME')
  local real = t[1] * US + t[2] -- (arithmetic converts a string once; tonumber twice)
  local now = explicit
  if now <= 0 then now = real end
  local shift = 0
  if real > now then shift = real - now end
  SHIFT = shift
  return now, shift
end

-- pxat turns an expiry in script time (us) into PEXPIREAT milliseconds,
-- rounded up so that a key never disappears before its state is empty.
local function pxat(us)
  return fmt(-idiv(-(us + SHIFT), 1000))
end

-- KS is the state hash of the call running (KEYS[1], set at the entry of
-- the functions that use the state).
local KS

-- load_state reads the tenant's state from the hash: empty (d and m -1: no
-- period; held false) when the hash holds none. pk, when given, is a
-- pending field of the hash read in the same HMGET (admit's
-- "units,requests" of the hour and meter), as s[pk] (nil when absent).
-- h, when given, is that HMGET's answer, already read.
local function load_state(pk, h)
  if h then
  elseif pk then
    h = redis.call('HMGET', KS, 't', 'q', 'c', pk)
  else
    h = redis.call('HMGET', KS, 't', 'q', 'c')
  end
  if h[1] then
    local g, b = string.match(h[1], '^(%-?%d*),(%-?%d*)$')
    local d, du, dg, m, mu, mg, mo, gn = string.match(h[2],
      '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+)$')
    local x, mn = string.match(h[3], '^(%-?%d+),(%-?%d+)$')
    -- (the matches are decimal integers: arithmetic converts each, and
    -- once, where tonumber, a function call, converts twice)
    local day0 = d * DAY_US
    if g ~= '' then g = g + day0 else g = 0 end
    if b ~= '' then b = b + day0 else b = 0 end
    local s = {held = true, x = x * HOUR_US, g = g, b = b, d = d + 0,
      du = du + 0, dg = dg + 0, m = m + 0, mu = mu + 0, mg = mg + 0,
      mo = mo + 0, mn = mn * DAY_US, gn = gn + 0}
    if pk and h[4] then s[pk] = h[4] end
    return s
  end
  return {held = false, x = 0, g = 0, b = 0, d = -1, du = 0, dg = 0,
    m = -1, mu = 0, mg = 0, mo = 0, mn = 0, gn = 0}
end

-- month_pack is the field w of a month's counters (see the layout).
local function month_pack(m, mu, mg, mo)
  return string.format('%d,%d,%d,%d', m, mu, mg, mo)
end

-- month_roll starts the state s's month id, empty; the month it held, when
-- earlier, becomes the month before (s.w, written by save_state).
local function month_roll(s, id)
  if s.m >= 0 and s.m < id then s.w = month_pack(s.m, s.mu, s.mg, s.mo) end
  s.m, s.mu, s.mg, s.mo, s.rolled = id, 0, 0, 0, true
end

-- month_load returns the counters of the month id that the state s holds:
-- {mu, mg, mo} of its own month, or of the month before it (field w, then
-- with w = true; s.w when this script rolled the month, not saved yet);
-- nil when it holds neither (a Redis data loss, or a state two months on).
local function month_load(s, id)
  if s.m == id then return {mu = s.mu, mg = s.mg, mo = s.mo} end
  local v = s.w
  if not v then v = redis.call('HGET', KS, 'w') end
  if not v then return nil end
  local m, mu, mg, mo = string.match(v, '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+)$')
  if not m or m + 0 ~= id then return nil end
  return {mu = mu + 0, mg = mg + 0, mo = mo + 0, w = true}
end

-- month_store writes back c, month_load's counters of the month id: the
-- month before at once (field w; into s.w, with 'm' added to parts, when
-- this call rolled the month: save_state writes it with the month), the
-- state's own month into s, with 'm' added to parts for save_state
-- (parts lists what changed: 'd' the day, 'm' the month).
local function month_store(s, id, c, parts)
  if c.w and s.w then
    s.w = month_pack(id, c.mu, c.mg, c.mo)
    parts[#parts + 1] = 'm'
    return
  end
  if c.w then
    redis.call('HSET', KS, 'w', month_pack(id, c.mu, c.mg, c.mo))
    return
  end
  s.mu, s.mg, s.mo = c.mu, c.mg, c.mo
  parts[#parts + 1] = 'm'
end

-- month_of returns the month id and the next month's start for now, from
-- the state's cached bounds when now is inside them (the calendar runs
-- only when it is not), and caches the bounds of the month of now.
local function month_of(s, now)
  -- (a month is at most 31 days: a clock set back past the month's start
  -- is caught unless it moved less than that)
  if now < s.mn and now >= s.mn - 31 * DAY_US and s.m >= 0 then
    return s.m, s.mn
  end
  local id, _, nxt = month_at(now)
  if id ~= s.m then month_roll(s, id) end
  s.mn = nxt
  return id, nxt
end

-- day_of returns the day id and the next day's start for now, resetting the
-- state's day when it is another.
local function day_of(s, now)
  local id = idiv(now, DAY_US)
  if id ~= s.d then
    s.d, s.du, s.dg = id, 0, 0
  end
  s.dn = (id + 1) * DAY_US
  return id, s.dn
end

-- Beside the fields of the layout, a state s may hold: dn, the next day's
-- start (us) when the call knows it (calls that only change a day they did
-- not compute, refund and settle, leave it unset), and cal, true for a
-- tenant with a billing calendar (admit.lua, "Calendars"), whose ids are
-- local days and anchored months: its mn is written as 0.

-- packed returns the hash's fields t, q and c for the state s (see the
-- layout above).
local function packed(s)
  local g, b = '', ''
  if s.g ~= 0 then g = fmt(s.g - s.d * DAY_US) end
  if s.b ~= 0 then b = fmt(s.b - s.d * DAY_US) end
  return g .. ',' .. b,
    string.format('%d,%d,%d,%d,%d,%d,%d,%d', s.d, s.du, s.dg, s.m, s.mu, s.mg, s.mo, s.gn),
    string.format('%d,%d', -idiv(-s.x, HOUR_US), s.cal and 0 or idiv(s.mn, DAY_US))
end

-- state_need is when the state s is empty again as of now (us): the end of
-- its day and month + 1 h, its TAT and FULL. A state new to the hash
-- expires no sooner.
local function state_need(s, now)
  local need = now + HOUR_US
  if s.g > need then need = s.g end
  if s.b > need then need = s.b end
  local dn = s.dn or (s.d + 1) * DAY_US
  if s.d >= 0 and dn + HOUR_US > need then need = dn + HOUR_US end
  if s.m >= 0 then
    local mn = s.mn
    if mn == 0 then
      local id, _, nxt = month_at(now)
      if id == s.m then mn = nxt end
    end
    if mn + HOUR_US > need then need = mn + HOUR_US end
  end
  return need
end

-- save_state writes s, which needs to live until need (us; at least
-- state_need when it is new to the hash). extra lists fields beside the
-- state that changed in s (admit's pending usage: s[name] is the value).
local function save_state(s, need, extra, now)
  local was = s.x
  if s.held and not s.rolled and (not extra or #extra == 1) then
    -- the common case, without a table for HSET's arguments
    if need > s.x then s.x = -idiv(-(need + DAY_US), HOUR_US) * HOUR_US end
    local t, q, c = packed(s)
    if extra then
      redis.call('HSET', KS, 't', t, 'q', q, 'c', c, extra[1], s[extra[1]])
    else
      redis.call('HSET', KS, 't', t, 'q', q, 'c', c)
    end
    if s.x ~= was then redis.call('PEXPIREAT', KS, pxat(s.x)) end
    return
  end
  local args = {'t', '', 'q', '', 'c', ''}
  if extra then
    for _, f in ipairs(extra) do
      args[#args + 1] = f
      args[#args + 1] = s[f]
    end
  end
  if s.w then
    args[#args + 1] = 'w'
    args[#args + 1] = s.w
  end
  if not s.held then
    local sn = state_need(s, now)
    if sn > need then need = sn end
  end
  if s.held and s.rolled and s.gn > 0 then
    -- a new month: the grant marks of the past ones go
    local h = redis.call('HGETALL', KS)
    for i = 1, #h, 2 do
      if string.sub(h[i], 1, 2) == 'g:' then redis.call('HDEL', KS, h[i]) end
    end
    s.gn = 0
  end
  if need > s.x then
    -- a day's slack, so that PEXPIREAT goes about once a day, not on
    -- every call (an admission's pending usage pushes need to now + 14 d)
    s.x = -idiv(-(need + DAY_US), HOUR_US) * HOUR_US
  end
  args[2], args[4], args[6] = packed(s)
  redis.call('HSET', KS, unpack(args))
  if s.x ~= was or not s.held then
    redis.call('PEXPIREAT', KS, pxat(s.x))
  end
  s.held = true
end
