--[[ outage.lua: record the usage an API node admitted in process while Redis
was away (fail-open tiers), exactly once per batch.

The node keeps that usage per meter, UTC hour and local day, and sends a
tenant's rows here as one batch under an id (internal/admission). The
first call with the id applies the batch and keeps what it counted under
the id (KEYS[8], 14 days); a later call with the same id (a retry after a
timeout whose call had landed) changes nothing and answers the same
counts. Each row, in order, is counted as an admission of its units at
its time would have been, without deciding anything (it was served):
  - the day and month counters of the tier and of the row's meter quota
    take the units while they are in the row's day and period (a state
    of an earlier period starts the row's; a later one is left as it is:
    the row's period is over there), so that the outage's usage is not
    free quota;
  - on a bill tier, the units past the month's quota + grants are
    overage, and past the meter's monthly quota, when it bills, the
    meter's overage (a unit past both is the meter's only), as
    admit.lua counts them; with a spend cap, the overage stops where
    the month's overage would cost more than the cap (meter overage
    first, at its price, then the tier's): the units past it are
    counted, not billed as overage;
  - the pending usage of the row's hour and meter gets the units, the
    requests and the overage ("|u", "|r", "|o", "|m"), which the worker
    flushes into the ledger as it flushes admissions.
A row of negative units (a refund or settlement of requests whose units
were sent in an earlier batch) gives back: the counters, clamped at 0, and
of its units, as overage first (the last units admitted were overage), at
most the overage units the row names and the month holds.

The state's keys, layouts and shared functions are lua/state.lua's, the
meter quotas' hash lua/meterq.lua's, both prepended. Units: integer units;
money: millicents (1/1000 cent); times integer microseconds since the
Unix epoch, UTC, but where ARGV says seconds.

KEYS (the tenant's hash tag {t:<id>})
  KEYS[1..5] the state (state.lua)
  KEYS[6] <prefix>:v1:{t:<id>}:pending (v1 layout, as settle.lua)
  KEYS[7] <prefix>:v1:{t:<id>}:mq, the meter quotas' hash (admit.lua)
  KEYS[8] <prefix>:v1:{t:<id>}:outage:<batch id>, the batch's mark

ARGV
  [1] layout 'v2' | 'v1' (state.lua)
  [2] the tier: "bill,mq,tprice,capm,cal": 1 when it bills overage, its
      monthly quota (-1 none), its overage price per 1,000 units (0 unless
      it bills), the spend cap in millicents (-1 none), 1 for a billing
      calendar that is not the default one (its month's end is not cached
      in the state: see admit.lua, "Calendars")
  [3..] 11 per row: hour start (unix s), meter, day id, the day's end
      (unix s), period id, the period's end (unix s), units, requests,
      the meter's quota ('-' none, else "mq,price": its monthly quota, -1
      none, and its overage price per 1,000 units, -1 when not billed),
      and, for negative units, the tier's and the meter's overage to give
      back (else 0)

Return: {applied, then per row the tier's and the meter's overage units
counted (negative: given back)}: applied 1, or 0 when the batch was
recorded before (its counts as recorded then).
]]

local OUTAGE_MS = 14 * 86400 * 1000
local PENDING_US = 14 * DAY_US

local prev = redis.call('GET', KEYS[8])
if prev then
  local out = {0}
  for v in string.gmatch(prev, '[^,]+') do out[#out + 1] = tonumber(v) end
  return out
end
-- marked first: a run that failed half way is never applied twice
redis.call('SET', KEYS[8], '', 'PX', OUTAGE_MS)

local now, shift = clock(0)
local function pxat(us)
  return fmt(-idiv(-(us + shift), 1000))
end

local t1, t2, t3, t4, t5 = string.match(ARGV[2], '^([01]),(%-?%d+),(%d+),(%-?%d+),([01])$')
local bill, mq, tprice, capm, cal = t1 == '1', t2 + 0, t3 + 0, t4 + 0, t5 == '1'
local KQ = KEYS[7]

local s = load_state()
local wd, wm = false, false -- the day's, the month's counters changed
-- the month's millicents of all meters' overage (the spend cap's '$')
local function meters_mc(month)
  local c = redis.call('HGET', KQ, '$')
  if c then
    local m, mc = string.match(c, '^(%-?%d+),(%-?%d+)$')
    if m + 0 == month then return mc + 0 end
  end
  return 0
end

local pend, order = {}, {}
local function pending(name, n)
  if n == 0 then return end
  if not pend[name] then order[#order + 1] = name; pend[name] = 0 end
  pend[name] = pend[name] + n
end

local counted = {}
for i = 3, #ARGV, 11 do
  local hour, meter = ARGV[i], ARGV[i + 1]
  local day, dend, month, mend = ARGV[i + 2] + 0, ARGV[i + 3] * US, ARGV[i + 4] + 0, ARGV[i + 5] * US
  local units, reqs, mspec = ARGV[i + 6] + 0, ARGV[i + 7] + 0, ARGV[i + 8]
  local gto, gmo = ARGV[i + 9] + 0, ARGV[i + 10] + 0

  -- the tier's day and month (a state of an earlier period starts the row's)
  if s.d < day then s.d, s.du, s.dg, s.dov = day, 0, 0, 0 end
  if s.d == day then
    s.du, s.dn, wd = math.max(0, s.du + units), dend, true
  end
  if s.m < month then
    s.m, s.mu, s.mg, s.mo, s.rolled = month, 0, 0, 0, true
    s.mn = mend
  end
  local inmonth = s.m == month
  local ot = 0
  if inmonth then
    if units < 0 then
      ot = -math.min(gto, s.mo, -units)
    elseif bill and mq >= 0 and s.mu + units > mq + s.mg then
      ot = math.min(units, s.mu + units - (mq + s.mg))
    end
    s.mu, s.mn, wm = math.max(0, s.mu + units), mend, true
  end

  -- the meter's quota (its field in KQ: meterq.lua)
  local om, qprice = 0, -1
  local qd, qdu, qm, qmu, qmo, qfresh
  if mspec ~= '-' then
    local a1, a2 = string.match(mspec, '^(%-?%d+),(%-?%d+)$')
    local qmq
    qmq, qprice = a1 + 0, a2 + 0
    qd, qdu, qm, qmu, qmo = meterq_get(redis.call('HGET', KQ, meter))
    if not qd then qd, qdu, qm, qmu, qmo = -1, 0, -1, 0, 0 end
    if qd < day then qd, qdu = day, 0 end
    if qd == day then qdu = math.max(0, qdu + units) end
    if qm < month then qm, qmu, qmo, qfresh = month, 0, 0, true end
    if qm == month then qmu = math.max(0, qmu + units) end
    -- overage only in the period the tier's state is in (a past one's
    -- is over: its units are counted, not billed as overage)
    if qm == month and inmonth then
      if units < 0 then
        om = -math.min(gmo, qmo, -units)
      elseif qprice >= 0 and qmq >= 0 and qmu > qmq then
        om = math.min(units, qmu - qmq)
      end
    end
  end
  -- a unit past both monthly quotas is the meter's overage only
  if om > 0 and ot > 0 then ot = ot - math.min(ot, om) end

  -- the spend cap: the overage stops where it would cost more than capm
  local mc = 0
  if capm >= 0 and inmonth then mc = meters_mc(month) end
  if capm >= 0 and inmonth and (ot > 0 or om > 0) then
    local room = capm - s.mo * tprice - mc
    if om > 0 then
      om = math.max(0, math.min(om, idiv(math.max(room, 0), math.max(qprice, 1))))
      room = room - om * qprice
    end
    if ot > 0 and tprice > 0 then
      ot = math.max(0, math.min(ot, idiv(math.max(room, 0), tprice)))
    end
  end

  if inmonth then s.mo = math.max(0, s.mo + ot) end
  if qd then
    meterq_put(KQ, meter, qd, qdu, qm, qmu, math.max(0, qmo + om))
    if qfresh then
      -- the hash lives to the end of its fields' month + 1 h (admit.lua)
      local want = idiv(mend + HOUR_US - now, 1000) + 1
      if redis.call('PTTL', KQ) < want then redis.call('PEXPIRE', KQ, want) end
    end
    if om ~= 0 and capm >= 0 and qprice >= 0 then
      redis.call('HSET', KQ, '$', string.format('%d,%d', month, math.max(0, mc + om * qprice)))
    end
  end

  local f = hour .. '|' .. meter .. '|'
  pending(f .. 'u', units)
  pending(f .. 'r', reqs)
  pending(f .. 'o', ot)
  pending(f .. 'm', om)
  counted[#counted + 1] = fmt(ot)
  counted[#counted + 1] = fmt(om)
end

if cal then s.cal = true end
-- the pending usage lives in the v2 hash once the state does (state.lua)
if wd or wm or s.v2 then
  local need = state_need(s, now)
  if now + PENDING_US > need then need = now + PENDING_US end
  local parts = {}
  if wd then parts[#parts + 1] = 'd' end
  if wm then parts[#parts + 1] = 'm' end
  save_state(s, need, nil, parts, pxat, now)
end
for _, name in ipairs(order) do
  if s.v2 then
    redis.call('HINCRBY', KS, 'p' .. name, pend[name])
  else
    redis.call('HINCRBY', KEYS[6], name, pend[name])
  end
end
if not s.v2 and #order > 0 and redis.call('PTTL', KEYS[6]) < 0 then
  redis.call('PEXPIRE', KEYS[6], OUTAGE_MS)
end

redis.call('SET', KEYS[8], table.concat(counted, ','), 'KEEPTTL')
local out = {1}
for _, v in ipairs(counted) do out[#out + 1] = tonumber(v) end
return out
