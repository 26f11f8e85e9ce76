--[[ settle.lua: settle a request admitted on a route with settle: true to
the cost its upstream reported (the Tollgate-Actual-Cost response header or
POST /v1/settle), exactly once.

The admission wrote a settle entry (internal/ratelimit/settle.go) under the
tenant's hash tag, living 10 minutes. This script reads it and, in the same
atomic call, marks it settled (the value "done", keeping its expiry) and
applies the difference between the actual cost and the admitted cost:
  actual < cost: the difference is given back exactly as refund.lua gives
    back a failed request (day and month counters while still in the
    admission's periods, pending usage of the admission's hour), the
    overage units among it first (they were the last units admitted);
  actual > cost: the difference is added to the day and month counters
    (while still in the admission's periods) and to the pending usage,
    unconditionally: a charge may pass the quota, and later requests are
    refused. On a bill tier the units past the month's quota + grants are
    overage, as admit.lua counts them (month counter and pending "|o").
A second settle of the entry finds "done" and changes nothing; an entry
that expired is gone: both change nothing.

KEYS
  KEYS[1..5] the state (state.lua)
  KEYS[6] <prefix>:v1:{t:<id>}:pending (v1 layout, as refund.lua)
  KEYS[7] <prefix>:v1:{t:<id>}:settle:<request id>, the entry:
          "<cost>|<hour start unix s>|<day id>|<month id>|<overage>|<bill 0/1>|<monthly quota, -1 none>|<mq>|<meter>"
          where mq is the meter's quota, '-' for none, or "<monthly quota,
          -1 none>,<overage price per 1,000, -1 not billed>,<1 when the
          spend cap counts the meters' overage, else 0>" (an entry without
          it, from a node before meter quotas, is read as '-'); a
          prepaid tenant's has a fourth, ",<the tier's overage price>"
          ("-1,-1,0,<price>" when the meter has no quota), and the
          difference's overage (the tier's at that price, the meter's at
          its own) is charged to or given back from its credit draws
          (meterq.lua's prepaid_adjust)
  KEYS[8] <prefix>:v1:{t:<id>}:mq, the meter quotas' hash: the meter's
          counters change as the tier's do (meterq.lua), its overage units
          first when given back; a charged unit past both monthly quotas is
          the meter's overage only (pending "|m")

ARGV
  [1] layout 'v2' | 'v1' (state.lua)
  [2] the actual cost, 0..quota.MaxQuantity

Return: {status, delta, overage delta}: status 1 applied, 0 no entry
(unknown or expired), -1 settled before; delta = actual - cost (negative
for a refund); overage delta the change of the month's overage units.
]]

local e = redis.call('GET', KEYS[7])
if not e then return {0, 0, 0} end
if e == 'done' then return {-1, 0, 0} end
redis.call('SET', KEYS[7], 'done', 'KEEPTTL')

local cost, hour, day, month, over, bill, mq, mspec, meter = string.match(e,
  '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|([01])|(%-?%d+)|([%d,%-]+)|(.+)$')
if not cost then
  -- an entry of a node before meter quotas (no meter quota field)
  mspec = '-'
  cost, hour, day, month, over, bill, mq, meter = string.match(e,
    '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|([01])|(%-?%d+)|(.+)$')
end
if not cost then return redis.error_reply('settle: bad entry') end
cost, over, mq = tonumber(cost), tonumber(over), tonumber(mq)
local actual = tonumber(ARGV[2])
local diff = actual - cost
if diff == 0 then return {1, 0, 0} end

local now, shift = clock(0)
local function pxat(us)
  return fmt(-idiv(-(us + shift), 1000))
end

-- the meter quota's counters first (meterq.lua): a charged unit past both
-- monthly quotas is the meter's overage only, as admit.lua counts it
local mdov = 0
local tpp, mpp -- prepaid: the tier's and the meter's overage prices
if mspec ~= '-' and KEYS[8] then
  local a1, a2, a3, a4 = string.match(mspec, '^(%-?%d+),(%-?%d+),([01]),?(%-?%d*)$')
  if a1 then
    mdov = meterq_adjust(KEYS[8], meter, tonumber(day), tonumber(month), diff, a1 + 0, a2 + 0, a3 == '1')
    if a4 ~= '' then tpp, mpp = a4 + 0, math.max(a2 + 0, 0) end
  end
end

local s = load_state()
local parts = {}
local units, ovd = diff, 0
if diff < 0 then
  local back = -diff
  ovd = -math.min(over, back)
  if s.d == tonumber(day) then
    s.du = math.max(0, s.du - back)
    parts[#parts + 1] = 'd'
  end
  if s.m == tonumber(month) then
    s.mu = math.max(0, s.mu - back)
    s.mo = math.max(0, s.mo + ovd)
    parts[#parts + 1] = 'm'
  end
else
  if s.d == tonumber(day) then
    s.du = s.du + diff
    parts[#parts + 1] = 'd'
  end
  if s.m == tonumber(month) then
    if bill == '1' and mq >= 0 then
      local limit = mq + s.mg
      if s.mu + diff > limit then
        ovd = math.min(diff, s.mu + diff - limit)
      end
    end
    if mdov > 0 then ovd = ovd - math.min(ovd, mdov) end
    s.mu = s.mu + diff
    s.mo = s.mo + ovd
    parts[#parts + 1] = 'm'
  end
end
if #parts > 0 then
  save_state(s, 0, nil, parts, pxat, now)
end
if tpp then prepaid_adjust(KEYS[8], tonumber(month), ovd * tpp + mdov * mpp) end

local f = hour .. '|' .. meter .. '|'
if s.v2 then
  redis.call('HINCRBY', KS, 'p' .. f .. 'u', units)
  if ovd ~= 0 then redis.call('HINCRBY', KS, 'p' .. f .. 'o', ovd) end
  if mdov ~= 0 then redis.call('HINCRBY', KS, 'p' .. f .. 'm', mdov) end
  return {1, diff, ovd}
end
redis.call('HINCRBY', KEYS[6], f .. 'u', units)
if ovd ~= 0 then redis.call('HINCRBY', KEYS[6], f .. 'o', ovd) end
if mdov ~= 0 then redis.call('HINCRBY', KEYS[6], f .. 'm', mdov) end
if redis.call('PTTL', KEYS[6]) < 0 then
  redis.call('PEXPIRE', KEYS[6], 14 * 86400 * 1000)
end
return {1, diff, ovd}
