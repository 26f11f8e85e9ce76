--[[ meterq.lua: the prelude of the scripts that change a meter quota's
counters outside admission (refund.lua, settle.lua, reset.lua,
restore_meters.lua; admit.lua reads and writes them inline): the meter quotas'
hash of admit.lua ("Meter quotas"), one field per meter "d,du,m,mu,mo"
(day id and used units; month id, used and overage units) and '$' =
"m,mc", the month's millicents of all meters' overage (the spend cap's);
and a prepaid tenant's credit draws 'P' = "m,mc,pm,pmc" (admit.lua,
"Prepaid").
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

-- meterq_adjust changes meter's counters in the hash key by delta units
-- (negative: given back) for an admission of day id day and month id month,
-- each period only while the field is still in it. Units given back are
-- the meter's overage first (they were the last admitted); units charged
-- past the monthly quota qmq (>= 0) are overage when billed (price >= 0).
-- With price >= 0 and capped true, '$' follows the overage at price.
-- Returns the change of the meter's overage units (0 without a field).
local function meterq_adjust(key, meter, day, month, delta, qmq, price, capped)
  local qd, qdu, qm, qmu, qmo = meterq_get(redis.call('HGET', key, meter))
  if not qd then return 0 end
  local dov = 0
  if qd == day then qdu = math.max(0, qdu + delta) end
  if qm == month then
    if delta < 0 then
      dov = -math.min(-delta, qmo)
      qmu = math.max(0, qmu + delta)
    else
      if price >= 0 and qmq >= 0 and qmu + delta > qmq then
        dov = math.min(delta, qmu + delta - qmq)
      end
      qmu = qmu + delta
    end
    qmo = qmo + dov
  end
  meterq_put(key, meter, qd, qdu, qm, qmu, qmo)
  if dov ~= 0 and capped then
    local c = redis.call('HGET', key, '$')
    local cm, cv = month, 0
    if c then
      local s1, s2 = string.match(c, '^(%-?%d+),(%-?%d+)$')
      if s1 + 0 == month then cv = s2 + 0 end
    end
    redis.call('HSET', key, '$', string.format('%d,%d', cm, math.max(0, cv + dov * price)))
  end
  return dov
end

-- prepaid_adjust changes a prepaid tenant's credit draws ('P') of the
-- period month by dmc millicents: given back (dmc < 0, never below 0) or
-- charged (a settled cost past the admitted one: it may pass the balance,
-- and later requests are then refused). A field holding neither the
-- period nor the one before leaves nothing to give back; a charge of a
-- later period than the field's starts that period's count. While it holds
-- draws the hash lives at least as long as admit.lua keeps it.
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
  else
    return
  end
  redis.call('HSET', key, 'P', string.format('%d,%d,%d,%d', m, mc, pm, pmc))
  local ttl = redis.call('PTTL', key)
  if ttl >= 0 and ttl < PREPAID_KEEP_MS then redis.call('PEXPIRE', key, PREPAID_KEEP_MS) end
end
