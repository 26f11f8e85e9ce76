--[[ adjust.lua: shared by the library's functions that count units after
their admission (refund.lua, settle.lua: an admitted request's numbers
changed; outage.lua: usage admitted in process while Redis was away), after
state.lua and meterq.lua: one way to move units, overage and money in the
day, month and hour they were admitted in, whenever the change arrives.
The month is the state's or the month before it (state.lua's month_load,
meterq.lua's meterq_month), never a later one; the pending usage is that
of the admission's hour.
]]

-- adjust_give_back returns what giving back back of the units of a request
-- that took over units of the tier's overage and took of the meter's
-- (nil: unknown, then the meter's month overage mo stands in, as nodes
-- before this one gave back) gives back of each: the request's last units
-- first, which are its meter's overage, then the tier's (admit.lua counts
-- a unit past both monthly quotas as the meter's only). Both negative.
local function adjust_give_back(back, over, took, mo)
  if not took then
    return -math.min(over, back), -math.min(back, mo or 0)
  end
  local mback = math.min(back, took)
  return -math.min(over, back - mback), -mback
end

-- adjust_charge returns the overage of units charged after their
-- admission (a settlement past the admitted cost, outage usage): ovd of
-- the tier's, mdov of the meter's. c is the state's counters of the
-- admission's month (month_load; nil: Redis does not hold it), q the
-- meter's (meterq_month; nil: none, or not held); bill, mq: the tier bills
-- past its monthly quota mq (-1 none); qmq, price: the meter's monthly
-- quota (-1 none) and its overage price per 1,000 units (-1 not billed);
-- capm, tprice: the spend cap in millicents (-1 none) and the tier's
-- overage price. The units past the quotas are overage as admit.lua
-- counts them: the tier's first, then the meter's, which are the meter's
-- only (a request's units past both monthly quotas are its last ones).
-- A month never bills more overage than its cap: the overage is billed,
-- in the order the units were charged, while the cap's room in the month
-- lasts (capm less its overage at its prices: the tier's units at tprice,
-- the meters' millicents of the hash mkey, meterq_spent); the units past
-- it count as usage, not as overage.
local function adjust_charge(c, q, units, bill, mq, qmq, price, capm, tprice, mkey, month)
  local tov, mov = 0, 0
  if c and bill and mq >= 0 and c.mu + units > mq + c.mg then
    tov = math.min(units, c.mu + units - (mq + c.mg))
  end
  if q and price >= 0 and qmq >= 0 and q.mu + units > qmq then
    mov = math.min(units, q.mu + units - qmq)
  end
  tov = tov - math.min(tov, mov)
  local ovd, mdov = tov, mov
  if capm >= 0 and (tov > 0 or mov > 0) then
    local room = capm - (c and c.mo or 0) * tprice - meterq_spent(mkey, month)
    if tprice > 0 then ovd = math.min(tov, math.max(0, idiv(room, tprice))) end
    room = room - ovd * tprice
    if ovd < tov then
      mdov = 0
    elseif price > 0 then
      mdov = math.min(mov, math.max(0, idiv(room, price)))
    end
  end
  return ovd, mdov
end

-- adjust_counters adds units (negative: given back) to the state s's day
-- day while it is the state's, and to c, the state's counters of month
-- (month_load), with ovd to its overage; the same to q, the meter's
-- counters of month (meterq_month, in the hash mkey), with mdov to its
-- overage; nothing goes below 0. It writes them back.
local function adjust_counters(s, c, q, mkey, meter, day, month, units, ovd, mdov, now)
  local parts = {}
  if s.d == day and units ~= 0 then
    s.du = math.max(0, s.du + units)
    parts[#parts + 1] = 'd'
  end
  if c and (units ~= 0 or ovd ~= 0) then
    c.mu, c.mo = math.max(0, c.mu + units), math.max(0, c.mo + ovd)
    month_store(s, month, c, parts)
  end
  if #parts > 0 then save_state(s, 0, nil, now) end
  if q then
    if q.today then q.du = math.max(0, q.du + units) end
    q.mu, q.mo = math.max(0, q.mu + units), math.max(0, q.mo + mdov)
    meterq_store(mkey, meter, month, q)
  end
end

-- adjust_money moves the money of ovd and mdov units of month's overage
-- (the tier's and the meter's): the meter's at price into the spend cap's
-- millicents (when price >= 0: the cap counts the meters' overage), and,
-- for a prepaid tenant (tpp: the tier's price, mpp: the meter's, 0 when
-- not billed), both into its credit draws.
local function adjust_money(mkey, month, ovd, mdov, price, tpp, mpp)
  if price >= 0 then meterq_spend(mkey, month, mdov * price) end
  if tpp then prepaid_adjust(mkey, month, ovd * tpp + mdov * mpp) end
end

-- adjust_pending adds units, ovd, mdov and reqs (requests; nil: none) to
-- the pending usage of f ("<hour start, unix s>|<meter>|"): "u", "o", "m"
-- and "r", in the state hash when it holds the state (it lives 14 days
-- after an admission), else in the pending hash kp.
local function adjust_pending(s, kp, f, units, ovd, mdov, reqs)
  local key, pre = kp, ''
  if s.held then key, pre = KS, 'p' end
  redis.call('HINCRBY', key, pre .. f .. 'u', units)
  if reqs and reqs ~= 0 then redis.call('HINCRBY', key, pre .. f .. 'r', reqs) end
  if ovd ~= 0 then redis.call('HINCRBY', key, pre .. f .. 'o', ovd) end
  if mdov ~= 0 then redis.call('HINCRBY', key, pre .. f .. 'm', mdov) end
  if not s.held and redis.call('PTTL', kp) < 0 then
    redis.call('PEXPIRE', kp, 14 * 86400 * 1000)
  end
end
