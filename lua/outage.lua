--[[ outage.lua: the library's function outage: record the usage an API node
admitted in process while Redis was away (fail-open tiers), exactly once per
batch.

The node keeps that usage per meter, UTC hour and local day, and sends a
tenant's rows here as one batch under an id (internal/admission). The
first call with the id applies the batch and keeps what it counted under
the id (KEYS[4], 14 days); a later call with the same id (a retry after a
timeout whose call had landed) changes nothing and answers the same
counts. Each row, in order, is counted as an admission of its units at
its time would have been, without deciding anything (it was served), in
its day and month as adjust.lua counts a settlement's charge:
  - the day and month counters of the tier and of the row's meter quota
    take the units while they hold the row's day and month. A state of an
    earlier day or month starts the row's as admit.lua does (the month
    that ends is kept as the month before: state.lua's month_roll, the
    meter's "<meter>|w" of meterq.lua's meterq_month); a state already in
    the next month counts a row of the month before into the month it
    keeps (field w, "<meter>|w", '$w': an outage across a month's end
    whose rows arrive after the next month began); a month it does not
    hold (two months on, or lost) counts nothing, so that the outage's
    usage is not free quota, and never a later month's;
  - on a bill tier, the units past that month's quota + grants are
    overage, and past the meter's monthly quota, when it bills, the
    meter's overage (a unit past both is the meter's only), as
    admit.lua counts them; with a spend cap, the overage is billed in
    the order the units came (the tier's, then the meter's) while the
    cap's room in that month lasts (adjust.lua's adjust_charge): the
    units past it are counted, not billed as overage; the meters'
    overage goes into that month's millicents ('$' or '$w': meterq.lua's
    meterq_spend);
  - the pending usage of the row's hour and meter gets the units, the
    requests and the overage ("|u", "|r", "|o", "|m"), which the worker
    flushes into the ledger as it flushes admissions.
A row of negative units (a refund or settlement of requests whose units
were sent in an earlier batch) gives back: the counters of its month,
clamped at 0, and of its units, as overage, the meter's first (the last
units admitted were overage, a unit past both quotas the meter's), at
most the meter's and the tier's overage units the row names (adjust.lua's
adjust_give_back, as a refund gives back), with their money.

The state's keys, layout and shared functions are lua/state.lua's, the
meter quotas' hash lua/meterq.lua's, the counting lua/adjust.lua's. Units: integer units; money: millicents (1/1000 cent); times
integer microseconds since the Unix epoch, UTC, but where ARGV says
seconds.

KEYS (the tenant's hash tag {t:<id>})
  KEYS[1] the state hash (state.lua)
  KEYS[2] <prefix>:v1:{t:<id>}:pending (as settle.lua)
  KEYS[3] <prefix>:v1:{t:<id>}:mq, the meter quotas' hash (admit.lua)
  KEYS[4] <prefix>:v1:{t:<id>}:outage:<batch id>, the batch's mark

ARGV
  [1] the tier: "bill,mq,tprice,capm,cal": 1 when it bills overage, its
      monthly quota (-1 none), its overage price per 1,000 units (0 unless
      it bills), the spend cap in millicents (-1 none; it bounds the
      tier's and the meters' overage together), 1 for a billing
      calendar that is not the default one (its month's end is not cached
      in the state: see admit.lua, "Calendars")
  [2..] 11 per row: hour start (unix s), meter, day id, the day's end
      (unix s), period id, the period's end (unix s), units, requests,
      the meter's quota ('-' none, else "mq,price": its monthly quota, -1
      none, and its overage price per 1,000 units, -1 when not billed),
      and, for negative units, the tier's and the meter's overage to give
      back (else 0)

Return: {applied, then per row the tier's and the meter's overage units
counted (negative: given back)}: applied 1, or 0 when the batch was
recorded before (its counts as recorded then).
]]

do
local OUTAGE_MS = 14 * 86400 * 1000
local PENDING_US = 14 * DAY_US

function FN.outage()
KS = KEYS[1]
local prev = redis.call('GET', KEYS[4])
if prev then
  local out = {0}
  for v in string.gmatch(prev, '[^,]+') do out[#out + 1] = tonumber(v) end
  return out
end
-- marked first: a run that failed half way is never applied twice
redis.call('SET', KEYS[4], '', 'PX', OUTAGE_MS)

local now = clock(0)

local t1, t2, t3, t4, t5 = string.match(ARGV[1], '^([01]),(%-?%d+),(%d+),(%-?%d+),([01])$')
local bill, mq, tprice, capm = t1 == '1', t2 + 0, t3 + 0, t4 + 0
local KQ = KEYS[3]

local s = load_state()
if t5 == '1' then s.cal = true end

-- the pending usage, summed per field of the rows' hours and meters
local pend, order = {}, {}

local counted = {}
for i = 2, #ARGV, 11 do
  local hour, meter = ARGV[i], ARGV[i + 1]
  local day, dend, month, mend = ARGV[i + 2] + 0, ARGV[i + 3] * US, ARGV[i + 4] + 0, ARGV[i + 5] * US
  local units, reqs, mspec = ARGV[i + 6] + 0, ARGV[i + 7] + 0, ARGV[i + 8]

  -- the tier's day and month: a state of an earlier one starts the row's
  -- (the month as admit.lua rolls it, keeping the month before)
  if s.d < day then s.d, s.du, s.dg = day, 0, 0 end
  if s.d == day then s.dn = dend end
  if s.m < month then month_roll(s, month) end
  if s.m == month then s.mn = mend end
  -- the row's month: the state's, or the month before it
  local c = month_load(s, month)

  -- the meter's quota (its field in KQ, started as admit.lua starts it)
  local q, qmq, qprice = nil, -1, -1
  if mspec ~= '-' then
    local a1, a2 = string.match(mspec, '^(%-?%d+),(%-?%d+)$')
    qmq, qprice = a1 + 0, a2 + 0
    q = meterq_month(KQ, meter, day, month, true)
    if q and q.fresh then
      -- the hash lives to the end of its fields' month + 1 h (admit.lua)
      local want = idiv(mend + HOUR_US - now, 1000) + 1
      if redis.call('PTTL', KQ) < want then redis.call('PEXPIRE', KQ, want) end
    end
  end

  local ot, om
  if units < 0 then
    ot, om = adjust_give_back(-units, ARGV[i + 9] + 0, ARGV[i + 10] + 0)
  else
    ot, om = adjust_charge(c, q, units, bill, mq, qmq, qprice, capm, tprice, KQ, month)
  end
  adjust_counters(s, c, q, KQ, meter, day, month, units, ot, om, now)
  if capm < 0 then qprice = -1 end -- the spend cap's '$' counts the meter's overage
  adjust_money(KQ, month, ot, om, qprice)

  local f = hour .. '|' .. meter .. '|'
  local p = pend[f]
  if not p then
    p = {0, 0, 0, 0}
    pend[f], order[#order + 1] = p, f
  end
  p[1], p[2], p[3], p[4] = p[1] + units, p[2] + reqs, p[3] + ot, p[4] + om
  counted[#counted + 1] = fmt(ot)
  counted[#counted + 1] = fmt(om)
end

-- the pending usage lives in the state hash once it holds the state
-- (state.lua), 14 days as an admission's
if s.held then
  local need = state_need(s, now)
  if now + PENDING_US > need then need = now + PENDING_US end
  save_state(s, need, nil, now)
end
for _, f in ipairs(order) do
  local p = pend[f]
  adjust_pending(s, KEYS[2], f, p[1], p[3], p[4], p[2])
end

redis.call('SET', KEYS[4], table.concat(counted, ','), 'KEEPTTL')
local out = {1}
for _, v in ipairs(counted) do out[#out + 1] = tonumber(v) end
return out
end
end
