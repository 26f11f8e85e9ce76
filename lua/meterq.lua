--[[ meterq.lua: the prelude of the scripts that change a meter quota's
counters outside admission (refund.lua, settle.lua, reset.lua,
restore_meters.lua; admit.lua reads and writes them inline): the meter quotas'
hash of admit.lua ("Meter quotas"), one field per meter "d,du,m,mu,mo"
(day id and used units; month id, used and overage units) and '$' =
"m,mc", the month's millicents of all meters' overage (the spend cap's).
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
