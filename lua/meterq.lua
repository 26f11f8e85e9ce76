--[[ meterq.lua: shared by the library's functions that change a meter
quota's counters outside admission (refund.lua, settle.lua, outage.lua,
reset.lua, restore_meters.lua; admit.lua reads and writes them inline):
the meter quotas' hash of admit.lua ("Meter quotas"), one field per meter "d,du,m,mu,mo"
(day id and used units; month id, used and overage units) and '$' =
"m,mc", the month's millicents of all meters' overage (the spend cap's);
and a prepaid tenant's credit draws 'P' = "m,mc,pm,pmc" (admit.lua,
"Prepaid").

The month before: when a meter's field starts a new month (admit.lua, or
meterq_month with open: outage.lua's usage, restore_meters.lua's repair),
the month that ends is kept in the field "<meter>|w" = "m,mu,mo" ('|' is
in no meter name), and when '$' does (admit.lua, meterq_spend), the month
that ends in '$w' = "m,mc"; so that a refund, a settlement or outage usage
of that month, arriving after the roll, moves that month's numbers, never
the new month's.
]]

-- meterq_get reads a meter's field v: day id, day units, month id, month
-- units, month overage units; nil for a malformed or absent field.
local function meterq_get(v)
  if not v then return nil end
  local a1, a2, a3, a4, a5 = string.match(v, '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+)$')
  if not a1 then return nil end
  return a1 + 0, a2 + 0, a3 + 0, a4 + 0, a5 + 0
end

-- meterq_put writes a meter's field.
local function meterq_put(key, meter, qd, qdu, qm, qmu, qmo)
  redis.call('HSET', key, meter, string.format('%d,%d,%d,%d,%d', qd, qdu, qm, qmu, qmo))
end

-- meterq_month returns meter's counters of the month id month in the hash
-- key: {mu, mo} and, while the meter's field is still in that month, its
-- field's {d, du, m} with today = (d == day); else those of the month
-- before (field "<meter>|w", then prev = true); nil when the hash holds
-- neither. With open (usage counted as an admission counts it: outage.lua,
-- restore_meters.lua), a field of an earlier month, or none, starts month
-- as admit.lua starts it (fresh = true; the month it held becomes the
-- month before, w, written by meterq_store), and a field of an earlier day
-- of month starts day.
local function meterq_month(key, meter, day, month, open)
  local v = redis.call('HMGET', key, meter, meter .. '|w')
  local qd, qdu, qm, qmu, qmo = meterq_get(v[1])
  if qd and qm == month then
    if open and qd < day then qd, qdu = day, 0 end
    return {d = qd, du = qdu, m = qm, mu = qmu, mo = qmo, today = qd == day}
  end
  if v[2] then
    local pm, pmu, pmo = string.match(v[2], '^(%-?%d+),(%-?%d+),(%-?%d+)$')
    if pm and pm + 0 == month then return {mu = pmu + 0, mo = pmo + 0, prev = true} end
  end
  if open and not (qd and qm > month) then
    local q = {d = day, du = 0, m = month, mu = 0, mo = 0, today = true, fresh = true}
    if qd and qm >= 0 then q.w = string.format('%d,%d,%d', qm, qmu, qmo) end
    return q
  end
  return nil
end

-- meterq_store writes back q, meterq_month's counters of meter for month.
local function meterq_store(key, meter, month, q)
  if q.prev then
    redis.call('HSET', key, meter .. '|w', string.format('%d,%d,%d', month, q.mu, q.mo))
  else
    meterq_put(key, meter, q.d, q.du, q.m, q.mu, q.mo)
    if q.w then
      redis.call('HSET', key, meter .. '|w', q.w)
      q.w = nil
    end
  end
end

-- meterq_spent returns the millicents of the meters' overage of month
-- ('$', or '$w' for the month before; 0 when neither holds it).
local function meterq_spent(key, month)
  local v = redis.call('HMGET', key, '$', '$w')
  for i = 1, 2 do
    if v[i] then
      local m, mc = string.match(v[i], '^(%-?%d+),(%-?%d+)$')
      if m and m + 0 == month then return mc + 0 end
    end
  end
  return 0
end

-- meterq_spend adds dmc millicents (negative: given back, never below 0)
-- to the meters' overage of month: in '$' or '$w', whichever holds it. A
-- charge of a month neither holds takes the place of an earlier one ('$'
-- when it is later than '$', which moves to '$w'; else '$w'); a month
-- earlier than both, and a give-back of a month neither holds, change
-- nothing: a later month's total is never written over.
local function meterq_spend(key, month, dmc)
  if dmc == 0 then return end
  local v = redis.call('HMGET', key, '$', '$w')
  local m, c = {-1, -1}, {0, 0}
  for i = 1, 2 do
    if v[i] then
      local s1, s2 = string.match(v[i], '^(%-?%d+),(%-?%d+)$')
      if s1 then m[i], c[i] = s1 + 0, s2 + 0 end
    end
  end
  if m[1] == month then
    redis.call('HSET', key, '$', string.format('%d,%d', month, math.max(0, c[1] + dmc)))
  elseif m[2] == month then
    redis.call('HSET', key, '$w', string.format('%d,%d', month, math.max(0, c[2] + dmc)))
  elseif dmc > 0 and month > m[1] then
    if v[1] then
      redis.call('HSET', key, '$', string.format('%d,%d', month, dmc), '$w', v[1])
    else
      redis.call('HSET', key, '$', string.format('%d,%d', month, dmc))
    end
  elseif dmc > 0 and month > m[2] then
    redis.call('HSET', key, '$w', string.format('%d,%d', month, dmc))
  end
end

-- prepaid_adjust changes a prepaid tenant's credit draws ('P') of the
-- period month by dmc millicents: given back (dmc < 0, never below 0) or
-- charged (a settled cost past the admitted one: it may pass the balance,
-- and later requests are then refused). A field holding neither the
-- period nor the one before leaves nothing to give back; a charge of a
-- later period than the field's starts that period's count, and one of a
-- period between the field's two (a period that drew nothing until its
-- settlement arrived after the next one began) takes the earlier one's
-- place, as admit.lua's draws do. While it holds draws the hash lives at
-- least as long as admit.lua keeps it.
local PREPAID_KEEP_MS = (31 + 40) * 86400 * 1000
local function prepaid_adjust(key, month, dmc)
  if dmc == 0 then return end
  local m, mc, pm, pmc = -1, 0, -1, 0
  local v = redis.call('HGET', key, 'P')
  if v then
    local s1, s2, s3, s4 = string.match(v, '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+)$')
    if s1 then m, mc, pm, pmc = s1 + 0, s2 + 0, s3 + 0, s4 + 0 end
  end
  if m == month then
    mc = math.max(0, mc + dmc)
  elseif pm == month then
    pmc = math.max(0, pmc + dmc)
  elseif dmc > 0 and month > m then
    m, mc, pm, pmc = month, dmc, m, mc
  elseif dmc > 0 and month > pm then
    pm, pmc = month, dmc
  else
    return
  end
  redis.call('HSET', key, 'P', string.format('%d,%d,%d,%d', m, mc, pm, pmc))
  local ttl = redis.call('PTTL', key)
  if ttl >= 0 and ttl < PREPAID_KEEP_MS then redis.call('PEXPIRE', key, PREPAID_KEEP_MS) end
end
